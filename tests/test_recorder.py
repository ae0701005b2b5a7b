"""tracing/recorder.py: what the hooks gather of attention — the entropy and the causal check over every chunk of
query rows, against naive loops, and a long input's attention map, against plain loops over the weights."""

import math

import numpy as np
import pytest
import torch

from blocktrace.config import BlockConfig
from blocktrace.model.block import build_block
from blocktrace.pipeline.report import attention_dict
from blocktrace.tracing.recorder import MAP_CELLS
from blocktrace.tracing.tracer import trace


def naive_attention_stats(w: np.ndarray):
    """Loops over every row: entropy −Σ p ln p (0 ln 0 = 0) and weight above the diagonal."""
    *lead, heads, t, _ = w.shape
    rows = w.reshape(-1, heads, t, t)
    entropy = np.zeros(heads)
    future = 0.0
    for n in range(rows.shape[0]):
        for h in range(heads):
            for i in range(t):
                p = rows[n, h, i]
                entropy[h] += -sum(v * math.log(v) for v in p if v > 0)
                future += p[i + 1 :].sum()
    return entropy / (rows.shape[0] * t), future


@pytest.mark.parametrize("chunk", [1, 3, None])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_diagnostics_match_naive_loops_for_any_chunk(chunk, causal):
    block = build_block(BlockConfig(d_model=12, n_heads=3, causal=causal), seed=2)
    x = torch.randn(2, 7, 12, generator=torch.Generator().manual_seed(2))
    traced = trace(block, x, keep_tensors=True, attn_chunk=chunk)
    w = traced.attention.tensor
    entropy, future = naive_attention_stats(w.numpy())
    assert traced.attention.entropy_per_head == pytest.approx(entropy.tolist(), rel=1e-5, abs=1e-6)
    assert traced.attention.future_weight_sum == pytest.approx(future, rel=1e-5, abs=1e-12)
    assert traced.attention.max_weight == pytest.approx(w.max().item())
    whole = trace(block, x, keep_tensors=True, attn_chunk=7)
    assert torch.allclose(whole.attention.tensor, w, atol=1e-6) and torch.allclose(whole.output, traced.output, atol=1e-6)
    assert block.attn.query_chunk is None  # the trace's chunk size does not outlive the call


def test_future_weight_is_zero_with_the_mask_and_positive_without():
    x = torch.randn(5, 8)
    causal = trace(build_block(BlockConfig(d_model=8, n_heads=2)), x)
    assert causal.attention.future_weight_sum == 0.0
    bidirectional = trace(build_block(BlockConfig(d_model=8, n_heads=2, causal=False)), x)
    assert bidirectional.attention.future_weight_sum > 0.5
    unmasked = _masked_scores(build_block(BlockConfig(d_model=8, n_heads=2)), x)
    assert causal.attention.max_logit == pytest.approx(max(unmasked))


def _masked_scores(block, x):
    seen = {}
    block.attn.scores.register_forward_hook(lambda m, i, o: seen.__setitem__("s", o))
    with torch.no_grad():
        block(x)
    masked = torch.finfo(seen["s"].dtype).min  # what the causal mask writes above the diagonal
    values = seen["s"].flatten().tolist()
    assert masked in values  # the filter below removes something: the mask was applied
    return [v for v in values if v != masked]


def _naive_map(weights: torch.Tensor, cell: int) -> list:
    """[H][G][G]: the largest weight of each cell × cell block of queries and keys, by plain loops."""
    heads, t, _ = weights.shape
    grid, weights = -(-t // cell), weights.tolist()
    return [[[max(weights[h][q][k] for q in range(i * cell, min(t, (i + 1) * cell))
                  for k in range(j * cell, min(t, (j + 1) * cell))) for j in range(grid)] for i in range(grid)]
            for h in range(heads)]


@pytest.mark.parametrize("chunk", [None, 7])
def test_a_long_inputs_attention_map_is_the_largest_weight_of_each_block(chunk):
    """For inputs longer than the text heatmap shows, the page's map: each cell the largest weight among its
    query-key pairs (the first sequence, every chunk of query rows folded in), as plain loops over the weights find
    it; kept only when asked, rounded to 4 decimals in the document."""
    block = build_block(BlockConfig(d_model=16, n_heads=2, sliding_window=30))
    x = torch.randn(2, 2 * MAP_CELLS + 5, 16, generator=torch.Generator().manual_seed(3))
    traced = trace(block, x, attention_map=True, keep_tensors=True, attn_chunk=chunk)
    document = attention_dict(traced)["weights_map"]
    assert document["cell"] == 3 and document["tokens"] == x.shape[1] and len(document["heads"][0]) == 34
    expected = _naive_map(traced.attention.tensor[0], 3)
    assert document["heads"] == [[[round(v, 4) for v in row] for row in head] for head in expected]
    assert "weights_map" not in attention_dict(trace(block, x))
    assert "weights_map" not in attention_dict(trace(block, x[:, :16], attention_map=True))


def test_an_hf_layers_attention_map_is_pooled_from_its_whole_matrix():
    """HF's eager attention hands over the whole matrix at once (no chunk of rows): the same map."""
    import transformers

    config = transformers.LlamaConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32, num_hidden_layers=1,
                                      vocab_size=11, attn_implementation="eager")
    layer = transformers.LlamaForCausalLM(config).model.layers[0].eval()
    x = torch.randn(1, 70, 16, generator=torch.Generator().manual_seed(4))
    traced = trace(layer, x, attention_map=True, keep_tensors=True)
    document = attention_dict(traced)["weights_map"]
    expected = _naive_map(traced.attention.tensor.reshape(2, 70, 70), 2)
    assert document["heads"] == [[[round(v, 4) for v in row] for row in head] for head in expected]
