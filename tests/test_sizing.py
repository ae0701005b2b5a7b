"""blocktrace/sizing.py: runs that cannot fit are refused with the estimate before any work, sizes past any model
are refused at once, and the estimate covers what a run really allocates."""
from __future__ import annotations

import pytest
from helpers import GPT2, one_error_line
@pytest.mark.parametrize("args", [["--d-model", "20000", "--heads", "1"], ["--layers", "1000", "--d-model", "4096"],
                                  ["--d-model", "100000", "--seq-len", "100000"]])
def test_runs_that_cannot_fit_are_refused_with_the_estimate(invoke, monkeypatch, args):
    import blocktrace.sizing
    monkeypatch.setattr(blocktrace.sizing, "available_bytes", lambda device: 8 * 2**30)
    one_error_line(invoke("run", *args), 2, "this run needs about", "8.0 GiB is available")
@pytest.mark.parametrize("args, option", [
    (["run", "--layers", "100000"], "--layers"), (["run", "--seq-len", "1000000"], "--seq-len"),
    (["run", "--d-model", "99999999999999999999999"], "--d-model"),
    (["compare", "--pre-ln", "--post-ln", "--layers", "6,2000", "--grad"], "--layers"),
    (["check", "--weights", str(GPT2), "--token-ids", "1", "--grad", "--batches", "1000000000"], "--batches")])
def test_sizes_past_any_model_are_refused_before_any_work(invoke, args, option):
    """Each would fit in memory at a small width, and run for hours: refused as options, naming the bound."""
    one_error_line(invoke(*args), 2, f"Invalid value for '{option}'", "at most" if option == "--layers" else "<=x<=")


def test_a_head_hint_for_any_width_is_computed_at_once():
    from blocktrace.config import BlockConfig

    with pytest.raises(ValueError, match=r"pick heads among 1, 89, 101 \(the divisors up to 128\)"):
        BlockConfig(d_model=10**22 + 1, n_heads=7)  # 89 · 101 · 1112470797641561909: listing every divisor never ends


def test_the_estimate_covers_what_a_run_really_allocates():
    """The guard errs large: a stack's parameters and one block's activations, measured here."""
    from blocktrace.config import BlockConfig
    from blocktrace.model.stack import build_stack
    from blocktrace.sizing import Shape, estimate_bytes

    config = BlockConfig(d_model=64, n_heads=4)
    blocks = build_stack(config, 3)
    parameters = sum(p.numel() * p.element_size() for b in blocks for p in b.parameters())
    estimate = estimate_bytes(config, 3, Shape(2, 32), 4, grad=False, keep_tensors=False,
                              chunk_bytes=2**28, attn_chunk=None)
    assert parameters <= estimate <= 4 * parameters + 2 * 32 * (8 * 64 + 2 * 256 + 2 * 4 * 32) * 4
