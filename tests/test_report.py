"""pipeline/report.py: the report dicts every command returns and `--json` prints — a finding is listed at its own
step of its own layer only; a stack's per-layer stream size and branch shares are computed from the traced tensors
as their definitions say (rms of the block's output; Var[update] / Var[sum] at each residual add)."""

import pytest
import torch

from blocktrace.config import BlockConfig
from blocktrace.diagnose.checks import Flag
from blocktrace.diagnose.diagnosis import Findings
from blocktrace.model.stack import build_stack
from blocktrace.pipeline.report import stack_report
from blocktrace.sources.source import Source
from blocktrace.tracing.stack import trace_stack
from blocktrace.vocab import Level

CONFIG = BlockConfig(d_model=8, n_heads=2)


@pytest.fixture(scope="module")
def traced():
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))
    source = Source(config=CONFIG, x=x, tokens=None, note="random", seed=1)
    return source, trace_stack(build_stack(CONFIG, 3, seed=1), x, keep_tensors=True)


def test_a_finding_is_listed_at_its_own_step_of_its_own_layer_only(traced):
    source, traces = traced
    flag = Flag("attention_entropy_collapse", Level.WARNING, "attn", 1, 0.0, "raised by hand")
    report = stack_report(source, traces, found=Findings([flag], []))
    listed = [(entry["layer"], step["name"], step["flags"]) for entry in report["layers"] for step in entry["steps"]
              if step["flags"]]
    assert listed == [(1, "attn", ["attention_entropy_collapse"])]
    assert "flags" not in stack_report(source, traces)["layers"][0]["steps"][0]  # no checks ran: no such key


def test_each_layers_stream_size_and_branch_shares_follow_their_definitions(traced):
    source, traces = traced
    report = stack_report(source, traces)
    for entry, trace in zip(report["layers"], traces):
        tensor = {step.name: step.tensor.double() for step in trace.steps}
        output = tensor["residual2"]
        assert entry["rms"] == pytest.approx(output.pow(2).mean().sqrt().item(), rel=1e-5)
        assert entry["sq_norm_per_d"] == pytest.approx(output.pow(2).sum(-1).mean().item() / 8, rel=1e-5)
        for share, update, total in (("attn_share", "attn", "residual1"), ("ffn_share", "ffn", "residual2")):
            expected = tensor[update].var(unbiased=False) / tensor[total].var(unbiased=False)
            assert entry[share] == pytest.approx(expected.item(), rel=1e-4)
