"""A loss scaler in the loop (torch.amp.GradScaler): the Watch records the loss's own gradients, not the scaled
ones, and a non-finite gradient the scaler will skip is context, not an error.

The reference is the gradient norm after `scaler.unscale_(optimizer)`, computed by hand in the loop."""

import math
import warnings

import pytest
import torch

from blocktrace import Watch
from helpers import make_gpt2


def _scaled_run(tmp_path, init_scale: float, steps: int = 2, unscale_first: bool = False, clip: float = 0.0):
    torch.manual_seed(0)
    model = make_gpt2(head=True).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
    unscaled = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model, tmp_path / "run.jsonl", every=1, optimizer=optimizer, overwrite=True) as watch:
            for step in range(steps):
                ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(step))
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = model(input_ids=ids, labels=ids).loss
                scaler.scale(loss).backward()
                if unscale_first:  # the AMP recipe's unscale (and clip) before the Watch's step, not after it
                    scaler.unscale_(optimizer)
                    if clip:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
                entry = watch.step(loss)
                if not unscale_first:
                    scaler.unscale_(optimizer)
                norms = [p.grad.double().norm() for p in model.parameters() if p.grad is not None]
                unscaled.append((entry, torch.stack(norms).norm().item()))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    return unscaled


def test_the_gradients_recorded_are_the_losss_own(tmp_path):
    (entry, by_hand), _ = _scaled_run(tmp_path, init_scale=2.0 ** 10)
    assert entry["loop"]["loss_scale"] == 2.0 ** 10
    assert entry["grad_norm"] == pytest.approx(by_hand, rel=1e-5)  # not 1024 × it


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_gradients_a_loop_unscaled_before_the_watchs_step_are_not_divided_again(tmp_path, clip):
    """A loop that calls scaler.unscale_ (and clips) before watch.step() hands it the loss's own gradients: divided
    again by the scale they would be 1,024 × too small (the fault failures3's fp16 loop showed)."""
    (entry, by_hand), _ = _scaled_run(tmp_path, init_scale=2.0 ** 10, unscale_first=True, clip=clip)
    assert entry["loop"]["loss_scale"] == 2.0 ** 10  # the backward's scale is still the scaler's
    assert entry["grad_norm"] == pytest.approx(by_hand, rel=1e-5)
    if clip:
        assert by_hand == pytest.approx(clip, rel=1e-4)  # the clip acted: the case where norms alone are ambiguous


def test_a_loss_divided_for_accumulation_is_not_taken_for_a_scale(tmp_path):
    torch.manual_seed(0)
    model = make_gpt2(head=True).train()
    with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
        for micro in range(4):
            ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(micro))
            loss = model(input_ids=ids, labels=ids).loss
            (loss / 4).backward()
        entry = watch.step(loss)
    norms = [p.grad.double().norm() for p in model.parameters() if p.grad is not None]
    assert entry["loop"]["loss_scale"] == 1.0
    assert entry["grad_norm"] == pytest.approx(torch.stack(norms).norm().item(), rel=1e-5)


def test_an_overflow_the_scaler_skips_is_context_not_an_error(tmp_path):
    (entry, by_hand), _ = _scaled_run(tmp_path, init_scale=2.0 ** 60)  # float16 overflows: the scaler skips
    assert not math.isfinite(by_hand)
    levels = {f["level"] for f in entry["flags"] if f["name"] == "gradient_exploding"}
    assert levels == {"info"}
