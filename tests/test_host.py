"""host.py and tracing/assembly.py: statistics stay on the device until one transfer: counted on CPU, so CI guards what
a GPU would pay.

A host synchronisation is anything that makes the host wait for the device: reading a scalar (`.item()`, `float(t)`,
`bool(t)`: all `aten::_local_scalar_dense`), `torch.equal`, a boolean mask or `nonzero` (the result's size depends
on the data), and copying to the host (`.tolist()`, `.numpy()`, `.cpu()`). The profiler sees the first group on any
device; the copies are counted by wrapping the three Tensor methods, since on a CPU tensor they launch no operator."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from helpers import NanoGPT, make_gpt2, nano_batch

from blocktrace.config import BlockConfig, Experts
from blocktrace.host import to_host
from blocktrace.model.block import TransformerBlock
from blocktrace.tracing.tracer import trace
from blocktrace.training.settings import rounded_to
from blocktrace.training.watch import Watch
from blocktrace.vocab import FFNKind, Norm, Placement

SYNC_OPERATORS = ("aten::_local_scalar_dense", "aten::equal", "aten::nonzero", "aten::masked_select")
COPIES = ("tolist", "numpy", "cpu")


def host_syncs(monkeypatch, action) -> Counter:
    """What `action()` made the host wait for: operators by name, copies by method."""
    counts: Counter = Counter()
    for method in COPIES:
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            counts[_method] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        action()
    for event in profile.events():
        if event.name in SYNC_OPERATORS:
            counts[event.name] += 1
    monkeypatch.undo()
    return counts


def scalar_reads(counts: Counter) -> int:
    return sum(counts[name] for name in SYNC_OPERATORS)


def copies(counts: Counter) -> int:
    return sum(counts[name] for name in ("tolist", "numpy"))


def own_block(**settings) -> TransformerBlock:
    torch.manual_seed(0)
    return TransformerBlock(BlockConfig(d_model=16, n_heads=2, **settings)).eval()


@pytest.mark.parametrize("checks", [False, True])
@pytest.mark.parametrize("settings", [{}, {"norm": Norm.RMSNORM, "ffn": FFNKind.SWIGLU}, {"placement": Placement.POST}])
def test_a_trace_of_our_block_reads_nothing_before_its_transfers(monkeypatch, checks, settings):
    block, x = own_block(**settings), torch.randn(2, 9, 16)
    counts = host_syncs(monkeypatch, lambda: trace(block, x, checks=checks, sample_size=4))
    assert scalar_reads(counts) == 0, counts
    assert copies(counts) == 1, counts  # one transfer: nothing was non-finite or massive, so no second round


def test_a_trace_that_meets_nan_and_massive_values_takes_two_transfers(monkeypatch):
    block = own_block()
    x = torch.randn(1, 9, 16) * 500  # massive residual values: the median is measured in the second round
    x[0, 3, 2] = float("nan")
    counts = host_syncs(monkeypatch, lambda: trace(block, x, checks=True))
    assert scalar_reads(counts) == 0, counts
    assert copies(counts) == 2, counts


def test_a_trace_of_a_hf_layer_with_checks_takes_at_most_two_transfers(monkeypatch):
    layer = make_gpt2(head=False).h[0]
    x = torch.randn(1, 7, layer.ln_1.normalized_shape[0])
    counts = host_syncs(monkeypatch, lambda: trace(layer, x, checks=True))
    assert scalar_reads(counts) == 0, counts
    assert copies(counts) <= 2, counts


def _recording_step(layers: int, monkeypatch, tmp_path) -> Counter:
    torch.manual_seed(0)
    model = NanoGPT(layers=layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch = Watch(model, tmp_path / f"run{layers}.jsonl", every=1, optimizer=optimizer)
    for step in range(2):  # the second record has a previous one: updates, the repeated-batch test, the dynamics
        ids, targets = nano_batch(step)
        optimizer.zero_grad()
        loss = model(ids, targets)[1]
        loss.backward()
        if step == 1:
            counts = host_syncs(monkeypatch, lambda: watch.step(loss))
        else:
            watch.step(loss)
        optimizer.step()
    watch.close()
    return counts


def test_a_watch_record_reads_nothing_before_its_transfers_whatever_the_depth(monkeypatch, tmp_path):
    shallow, deep = _recording_step(2, monkeypatch, tmp_path), _recording_step(6, monkeypatch, tmp_path)
    assert scalar_reads(shallow) == 0 and scalar_reads(deep) == 0, (shallow, deep)
    assert copies(shallow) == copies(deep) <= 2, (shallow, deep)
    assert deep["cpu"] <= copies(deep), deep  # the previous weights stay on the device


def test_a_padded_batch_and_a_mixture_of_experts_read_nothing_before_their_transfer(monkeypatch):
    block = own_block(experts=Experts(n_experts=4, experts_per_token=2), ffn=FFNKind.SWIGLU, norm=Norm.RMSNORM)
    x = torch.randn(2, 9, 16)
    mask = torch.ones(2, 9, dtype=torch.bool)
    mask[1, 6:] = False
    counts = host_syncs(monkeypatch, lambda: trace(block, x, checks=True, token_mask=mask))
    with torch.no_grad():
        its_own = host_syncs(monkeypatch, lambda: block(x))  # the experts' dispatch: torch.where per expert
    assert its_own["aten::nonzero"] == 4
    assert scalar_reads(counts) == scalar_reads(its_own), counts
    assert copies(counts) == 1, counts


def test_to_host_keeps_the_structure_and_the_kinds_of_numbers():
    tree = {"a": torch.tensor(1.5), "b": [torch.arange(6).reshape(2, 3), (torch.tensor([True, False]), "text")],
            "c": None, "d": torch.zeros(0)}
    host = to_host(tree)
    assert host == {"a": 1.5, "b": [[[0, 1, 2], [3, 4, 5]], ([True, False], "text")], "c": None, "d": []}
    assert isinstance(host["b"][0][0][0], int) and isinstance(host["b"][1][0][0], bool)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("value", [1e-8, 1e-5, 1.0, 0.1, 3.3e-7, 1e5, 1e39, 70000.0])
def test_a_value_rounded_on_the_host_is_what_the_dtype_stores(dtype, value):
    assert rounded_to(value, dtype) == torch.tensor(value, dtype=dtype).item()
