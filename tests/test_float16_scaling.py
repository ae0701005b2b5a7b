"""float16 without loss scaling, found by the Watch (float16_unscaled) — on both sides: autocast to float16 with a
plain backward, against the legitimate loops most like it (a GradScaler, with and without accumulation; bfloat16
autocast, which needs no scaler; float32)."""

import warnings

import pytest
import torch

from helpers import NanoGPT, make_llama, nano_batch


def _names(dtype, scaled: bool, tmp_path, micro_batches: int = 1):
    """The findings of one Watch record of a Llama trained one step under autocast to `dtype` (None: float32)."""
    from blocktrace import Watch

    model = make_llama(head=True)[0].train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if scaled else None
    ids = torch.randint(1, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the first-error warning and autocast's own: the record holds them
        with Watch(model, tmp_path / "run.jsonl", every=1, optimizer=optimizer, overwrite=True) as watch:
            for _ in range(micro_batches):
                with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                    loss = model(input_ids=ids, labels=ids).loss / micro_batches
                (scaler.scale(loss) if scaled else loss).backward()
            entry = watch.step(loss)
            if scaled:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
    assert entry is not None, watch.stopped
    return {flag["name"]: flag for flag in entry["flags"] if flag["level"] in ("error", "warning")}


def test_float16_autocast_without_a_scaler_is_found(tmp_path):
    found = _names(torch.float16, scaled=False, tmp_path=tmp_path)
    assert "float16_unscaled" in found
    assert found["float16_unscaled"]["cause"] == "precision"


@pytest.mark.parametrize("dtype, scaled, micro_batches", [(torch.float16, True, 1), (torch.float16, True, 2),
                                                          (torch.bfloat16, False, 1), (None, False, 1)])
def test_a_scaled_float16_loop_bfloat16_and_float32_pass(tmp_path, dtype, scaled, micro_batches):
    assert "float16_unscaled" not in _names(dtype, scaled, tmp_path, micro_batches)


def test_float16_parameters_without_a_scaler_are_found(tmp_path):
    """model.half(): the forward computes in float16 without autocast."""
    from blocktrace.training.model_facts import computes_in_float16

    model = make_llama(head=True)[0]
    assert not computes_in_float16(model)
    with torch.autocast("cpu", dtype=torch.float16):
        assert computes_in_float16(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not computes_in_float16(model)
    assert computes_in_float16(model.half())


def _scaled_loop(tmp_path, order: str) -> dict:
    """helpers' NanoGPT trained 2 steps under a GradScaler (float32 compute: the scaler's arithmetic is the same)
    with clipping at 1.0, in `order`; the findings of the last record."""
    from blocktrace import Watch

    torch.manual_seed(0)
    model = NanoGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model, tmp_path / "run.jsonl", every=1, optimizer=optimizer, overwrite=True) as watch:
            for step in range(2):
                scaler.scale(model(*nano_batch(step))[1]).backward()
                if order.startswith("unscale before the Watch"):
                    scaler.unscale_(optimizer)
                entry = watch.step()
                if order.startswith("unscale, clip"):
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    return {flag["name"]: flag for flag in entry["flags"] if flag["level"] in ("error", "warning")}


@pytest.mark.parametrize("order, found", [
    ("unscale, clip, scaler.step", set()),
    ("unscale before the Watch, clip, scaler.step", set()),
    ("clip, scaler.step", {"clipped_before_unscaling"}),
])
def test_the_step_a_scaler_should_unscale_is_read_against_the_losss_own_gradient(tmp_path, order, found):
    """The optimizer's step must find the loss's own gradients: a clip on the scaled ones leaves max_norm / S. A loop
    that unscales before watch.step() (failures3's fp16 run) hands the Watch gradients already divided: it passes.
    (A step that bypasses the scaler finds S times the loss's own gradients — the same the Watch sees when the loop
    unscaled before it: not told apart, so not judged.)"""
    names = _scaled_loop(tmp_path, order)
    assert set(names) & {"clipped_before_unscaling"} == found, order
    for name in found:
        assert names[name]["cause"] == "training_loop"


def _scale_unseen_loop(tmp_path, clip_first: bool) -> list[dict]:
    """As _scaled_loop, with the loss computed in the loop from the model's logits, so the Watch never sees the loss
    scale, under SGD (whose step is as small as its gradient); the records."""
    from torch.nn import functional as F

    from blocktrace import Watch
    from blocktrace.training.timeline import read_timeline

    torch.manual_seed(0)
    model = NanoGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(model, tmp_path / "run.jsonl", every=1, optimizer=optimizer, overwrite=True) as watch:
            for step in range(3):
                ids, targets = nano_batch(step)
                logits, _ = model(ids)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
                scaler.scale(loss).backward()
                watch.step(loss)
                if not clip_first:
                    scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    return read_timeline(tmp_path / "run.jsonl")


@pytest.mark.parametrize("clip_first", [True, False])
def test_tiny_updates_from_gradients_cut_between_backward_and_step_are_the_loop(tmp_path, clip_first):
    """Where the Watch cannot see the loss scale, a clip before scaler.unscale_ still shows: the optimizer's step
    finds gradients far below the ones the backward left, and the updates they make are tiny — the loop's doing."""
    records = _scale_unseen_loop(tmp_path, clip_first)
    tiny = [f for r in records for f in r["flags"] if f["name"] == "updates_tiny"]
    assert bool(tiny) == clip_first
    if clip_first:
        assert tiny[0]["cause"] == "training_loop" and "the optimizer's step found gradients" in tiny[0]["detail"]
