"""tracing/probes.py: what the health checks measure at each step of a traced block, against the same quantities
computed by hand from the tensors the trace kept — the residual identity and the update's size, the stream's median
token size, and the FFN's dead units and flat activations."""

import pytest
import torch

from blocktrace.config import BlockConfig
from blocktrace.model.block import build_block
from blocktrace.tracing.tracer import trace
from blocktrace.vocab import FFNKind

D, UNITS, DEAD = 8, 32, 20  # 20 of 32 units never fire: past half, so the flat share is measured too


@pytest.fixture(scope="module")
def traced():
    block = build_block(BlockConfig(d_model=D, n_heads=2, d_ff=UNITS, ffn=FFNKind.RELU), seed=4)
    with torch.no_grad():
        block.ffn.fc.bias[:DEAD] = -1e4  # these units' pre-activations are negative for every token
    x = torch.randn(2, 6, D, generator=torch.Generator().manual_seed(4))
    return block, trace(block, x, keep_tensors=True, checks=True)


def _norm(t: torch.Tensor) -> float:
    return t.double().pow(2).sum().sqrt().item()


def test_each_residual_sum_is_its_stream_plus_its_update_and_the_updates_size_is_their_norms_ratio(traced):
    _, result = traced
    tensors = {step.name: step.tensor for step in result.steps} | {"x": result.input.tensor}
    for step, stream, update in (("residual1", "x", "attn"), ("residual2", "residual1", "ffn")):
        probe = result.step(step).probe
        assert probe.residual_mismatch < 1e-6
        assert probe.update_ratio == pytest.approx(_norm(tensors[update]) / _norm(tensors[stream]), rel=1e-5)


def test_the_streams_size_is_the_median_tokens_squared_norm_per_width(traced):
    _, result = traced
    output = result.steps[-1].tensor.double().reshape(-1, D)
    sizes = sorted(row.pow(2).sum().item() / D for row in output)
    # torch's median of an even count is the lower of the two middle values
    assert result.steps[-1].probe.token_sq_median == pytest.approx(sizes[(len(sizes) - 1) // 2], rel=1e-5)


def test_dead_units_and_flat_activations_are_counted_over_every_token(traced):
    block, result = traced
    inputs = result.step("norm2").tensor.reshape(-1, D)
    hidden = [[max(0.0, (block.ffn.fc.weight[u] @ row + block.ffn.fc.bias[u]).item()) for u in range(UNITS)]
              for row in inputs]
    dead = sum(all(token[u] <= 0 for token in hidden) for u in range(UNITS)) / UNITS
    flat = sum(value == 0 for token in hidden for value in token) / (len(hidden) * UNITS)
    activity = result.step("ffn").probe.ffn
    assert dead >= DEAD / UNITS and activity.dead_fraction == pytest.approx(dead)
    assert activity.flat_fraction == pytest.approx(flat) and activity.units == UNITS and activity.tokens == len(hidden)
