"""The model's own loss on the input, as its training computed it.

Next-token cross-entropy for causal LMs (the logits at position t predict token t+1; padding
predicts nothing and is never predicted), masked-LM cross-entropy for BERT (the masked
positions predict their original tokens). Also the output logits' normaliser log Z =
log Σ exp(logits) per position, whose drift Wortsman et al. 2023 report before divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch.nn import functional as F

IGNORE = -100  # the label that predicts nothing, as in HF
MASK_FRACTION, MASK_SEED = 0.15, 0  # BERT's masking rate; the positions are drawn from a fixed seed


@dataclass(frozen=True)
class LossReport:
    value: Optional[float]  # mean cross-entropy over the predicted tokens, nats
    kind: Optional[str]
    tokens: int  # how many tokens were predicted
    uniform: Optional[float]  # log V: the loss of predicting every token equally likely
    log_z_mean: Optional[float] = None
    log_z_max_abs: Optional[float] = None
    note: Optional[str] = None  # why there is no loss, or how it was computed
    # next-token models: the loss with position t labelled by token t + s, for each s of SHIFTS, on the same
    # positions (those with a token two ahead): which shift the model learned (None: not measured)
    by_shift: Optional[dict] = None

    def to_dict(self) -> dict:
        return {"value": self.value, "kind": self.kind, "tokens": self.tokens, "uniform": self.uniform,
                "log_z_mean": self.log_z_mean, "log_z_max_abs": self.log_z_max_abs, "note": self.note,
                "by_shift": None if self.by_shift is None else {str(s): v for s, v in self.by_shift.items()}}


def no_loss(reason: str) -> LossReport:
    return LossReport(None, None, 0, None, note=reason)


SHIFTS = (0, 1, 2)  # the target a next-token model may have learned: its own input, the next token, the one after
# Fewer positions than this say nothing of a shift learned: one position's loss of a random model can be anything
SHIFT_MIN_POSITIONS = 8


def next_token_labels(ids: torch.Tensor, token_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """[B, T] labels: position t is labelled with token t+1; the last position and padding predict nothing."""
    return shifted_labels(ids, token_mask, 1)


def shifted_labels(ids: torch.Tensor, token_mask: Optional[torch.Tensor], shift: int,
                   last: Optional[int] = None) -> torch.Tensor:
    """[B, T] labels: position t < `last` (default T - shift) is labelled with token t + shift; padding is never
    predicted (a padded position predicting a real token counts, as in HF's shifted labels)."""
    length = ids.shape[1]
    last = length - shift if last is None else last
    labels = torch.full_like(ids, IGNORE)
    labels[:, :last] = ids[:, shift:shift + last]
    if token_mask is not None:
        labels[:, :last][~token_mask[:, shift:shift + last].to(ids.device)] = IGNORE
    return labels


def shift_losses(logits: torch.Tensor, ids: torch.Tensor, token_mask: Optional[torch.Tensor]) -> Optional[dict]:
    """The loss at each shift of SHIFTS over the same positions (those with a token max(SHIFTS) ahead); None when
    fewer than SHIFT_MIN_POSITIONS positions have one."""
    last = ids.shape[1] - max(SHIFTS)
    if last < 1:
        return None
    with torch.no_grad():
        labels = {shift: shifted_labels(ids, token_mask, shift, last) for shift in SHIFTS}
        if int((labels[max(SHIFTS)] != IGNORE).sum()) < SHIFT_MIN_POSITIONS:
            return None
        return {shift: cross_entropy(logits, label).item() for shift, label in labels.items()}


def mask_for_mlm(ids: torch.Tensor, token_mask: Optional[torch.Tensor], mask_id: int,
                 special: set) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs with [MASK] at the chosen positions, labels there): 15% of the real, non-special tokens,
    at least one per sequence, drawn from a fixed seed so every run masks the same positions."""
    generator = torch.Generator().manual_seed(MASK_SEED)
    candidates = torch.tensor([[int(i) not in special for i in row] for row in ids.tolist()], dtype=torch.bool)
    if token_mask is not None:
        candidates &= token_mask.cpu()
    chosen = (torch.rand(ids.shape, generator=generator) < MASK_FRACTION) & candidates
    for row in range(ids.shape[0]):
        if not chosen[row].any() and candidates[row].any():
            chosen[row, candidates[row].nonzero()[0, 0]] = True
    chosen = chosen.to(ids.device)
    labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
    return torch.where(chosen, torch.full_like(ids, mask_id), ids), labels


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over the labelled positions, in float32 at least (as HF's loss upcasts)."""
    flat = logits.reshape(-1, logits.shape[-1])
    return F.cross_entropy(flat.float() if flat.dtype in (torch.float16, torch.bfloat16) else flat,
                           labels.reshape(-1), ignore_index=IGNORE)


def loss_report(logits: torch.Tensor, labels: torch.Tensor, kind: str, by_shift: Optional[dict] = None) -> LossReport:
    with torch.no_grad():
        predicted = labels != IGNORE
        count = int(predicted.sum())
        vocabulary = logits.shape[-1]
        if count == 0:
            return LossReport(None, kind, 0, math.log(vocabulary), note="no token to predict (one token per sequence)")
        value = cross_entropy(logits, labels).item()
        log_z = torch.logsumexp(logits.float(), dim=-1)[predicted]
        return LossReport(value, kind, count, math.log(vocabulary), log_z.mean().item(), log_z.abs().max().item(),
                          by_shift=by_shift)
