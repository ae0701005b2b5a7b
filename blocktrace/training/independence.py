"""What a sequence's logits must not depend on, probed at a record step: the tokens after each position (the causal
probe), the padding its attention mask drops, and the other sequences of its batch (the last two in one process).
Each probe runs forwards in eval mode under the same random draws (RandomState: the training's own stream is
untouched), the second with only that part changed; the logits that must not move are compared on the device
(their largest move over their largest magnitude: exactly 0 where the property holds), and nothing reaches the host
before the record's one copy."""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from blocktrace.training.forward_call import ForwardCall, RandomState, evaluating, per_position

PROBE_TOKENS = 64  # the probes' sequences: the batch's first rows, at most this long


@torch.no_grad()
def future_leak(call: Callable[[torch.Tensor], object], ids: torch.Tensor, vocab: int) -> Optional[dict]:
    """Three forwards of one sequence: the second with its later half changed and the same random draws as the
    first, so that how far the earlier positions' logits moved (relative to their largest magnitude; 0 in any
    causal model) is the mask's doing, whatever the forward draws; the third the sequence again, with other draws,
    how far its logits moved from the first (0 in eval mode, where nothing in a forward should draw)."""
    length = min(ids.shape[1], PROBE_TOKENS)
    half = length // 2
    if half < 1 or vocab < 2:
        return None
    original = ids[:1, :length]
    changed = original.clone()
    changed[:, half:] = (changed[:, half:] + 1) % vocab
    start = RandomState.now(ids.device)
    with start.restored():
        before = per_position(call(original))
    with start.restored():  # the changed sequence under the first's draws, then the first again under new ones
        after, again = per_position(call(changed)), per_position(call(original))
    if before is None or after is None or again is None:
        return None
    earlier, largest = before[:, :half].float(), before.float().abs().amax().clamp_min(1e-30)
    moved = (earlier - after[:, :half].float()).abs().amax(dim=(0, 2))
    relative = moved / earlier.abs().amax().clamp_min(1e-30)
    return {"future_leak": relative.amax(), "leak_position": torch.argmax(relative),
            "nondeterministic": (before.float() - again.float()).abs().amax() / largest}


def probe_causality(model: nn.Module, forward: ForwardCall, ids: torch.Tensor, vocab: int) -> Optional[dict]:
    """future_leak through the model in eval mode, called as the training forward was called (its targets, masks
    and position ids cut to the probed sequence alike)."""
    def call(x):
        args, kwargs = forward.with_ids(x)
        return model(*args, **kwargs)

    with evaluating(model):
        return future_leak(call, ids, vocab)


def _padded_row(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequence to probe, a device index [1], and whether it drops some position and keeps another: one whose
    dropped position comes before a kept one first (the only kind a causal model can show), on the device."""
    positions = torch.arange(kept.shape[1], device=kept.device)
    first_dropped = torch.where(~kept, positions, kept.shape[1]).amin(dim=1)
    last_kept = torch.where(kept, positions, -1).amax(dim=1)
    both = (~kept).any(dim=1) & kept.any(dim=1)
    score = both.long() + (both & (first_dropped < last_kept)).long()
    return score.argmax().reshape(1), score.amax() > 0


def _two_forwards(call: Callable[[torch.Tensor, torch.Tensor], object], original: torch.Tensor,
                  changed: torch.Tensor, rows: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """The logits of `original` and of `changed` (the same rows of the batch, `rows`) under the same random draws
    (the training's own stream untouched); None where the model gives no [rows, T, V] logits."""
    start = RandomState.now(original.device)
    with start.restored():
        before = per_position(call(original, rows))
    with start.restored():
        after = per_position(call(changed, rows))
    if before is None or after is None or before.shape[:2] != original.shape or after.shape != before.shape:
        return None
    return before, after


def _relative_move(before: torch.Tensor, after: torch.Tensor, watched: torch.Tensor) -> torch.Tensor:
    """How far the logits at the `watched` positions ([rows, T] bool) moved, over their largest magnitude."""
    watched = watched.to(before.device)
    moved = ((before.float() - after.float()).abs().amax(dim=-1) * watched).amax()
    return moved / (before.float().abs().amax(dim=-1) * watched).amax().clamp_min(1e-30)


@torch.no_grad()
def padding_leak(call: Callable[[torch.Tensor, torch.Tensor], object], ids: torch.Tensor, kept: torch.Tensor,
                 vocab: int) -> Optional[dict]:
    """Two forwards of one sequence whose attention mask drops some positions, the second with the dropped
    positions' ids changed and the same random draws: how far the kept positions' logits moved, relative to their
    largest magnitude — exactly 0 in any model that applies its mask (a dropped key's weight is exactly 0)."""
    if vocab < 2:
        return None
    row, probed = _padded_row(kept)
    original = ids.index_select(0, row)
    dropped = ~kept.index_select(0, row)
    # padding is one repeated id (the pad id): a mask that drops text is not a padding mask, and not judged here
    pad = original.masked_fill(~dropped, torch.iinfo(original.dtype).max).amin()
    probed = probed & torch.where(dropped, original == pad, True).all()
    pair = _two_forwards(call, original, torch.where(dropped, (original + 1) % vocab, original), row)
    if pair is None:
        return None
    return {"padding_leak": _relative_move(*pair, ~dropped), "padding_probed": probed}


BATCH_PROBE_ROWS = 3  # the batch probe changes the middle one of 3 sequences: a mixing in either direction shows


@torch.no_grad()
def batch_leak(call: Callable[[torch.Tensor, torch.Tensor], object], ids: torch.Tensor, vocab: int) -> Optional[dict]:
    """Two forwards of the batch's first sequences (up to 3, each cut to PROBE_TOKENS), the second with one of them
    changed and the same random draws: how far the others' logits moved — exactly 0 where each sequence is
    computed alone, as a Transformer in eval mode does (batch norm, the one layer that pools a batch, then uses its
    running statistics)."""
    count, length = min(ids.shape[0], BATCH_PROBE_ROWS), min(ids.shape[1], PROBE_TOKENS)
    if count < 2 or vocab < 2:
        return None
    original, changed_row = ids[:count, :length], (count - 1) // 2
    changed = original.clone()
    changed[changed_row] = (changed[changed_row] + 1) % vocab
    pair = _two_forwards(call, original, changed, torch.arange(count, device=ids.device))
    if pair is None:
        return None
    watched = torch.ones(count, length, dtype=torch.bool)
    watched[changed_row] = False
    return {"batch_leak": _relative_move(*pair, watched)}


def probe_padding_and_batch(model: nn.Module, forward: ForwardCall, ids: torch.Tensor, kept: Optional[torch.Tensor],
                            vocab: int) -> dict:
    """padding_leak (where the forward had a [B, T] attention mask) and batch_leak through the model in eval mode,
    called as the training forward was called (every tensor of the batch cut to the probed sequences)."""
    def call(x, rows):
        args, kwargs = forward.with_ids(x, rows)
        return model(*args, **kwargs)

    with evaluating(model):
        padding = padding_leak(call, ids, kept, vocab) if kept is not None else None
        return {**(padding or {}), **(batch_leak(call, ids, vocab) or {})}
