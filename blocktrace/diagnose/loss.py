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

from blocktrace.phrases import phrase
from blocktrace.host import to_host

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
    fewer than SHIFT_MIN_POSITIONS positions have one. (loss_report computes them with the loss, in its one copy.)"""
    with torch.no_grad():
        return _by_shift(to_host(_shift_losses(logits, ids, token_mask, log_normalisers(logits))))


def _shift_losses(logits, ids, token_mask, log_z: torch.Tensor) -> Optional[dict]:
    """shift_losses on the device, from the logits' log-normalisers: {"losses": {shift: loss}, "positions": count},
    or None before any tensor."""
    last = ids.shape[1] - max(SHIFTS)
    if last < 1:
        return None
    labels = {shift: shifted_labels(ids, token_mask, shift, last) for shift in SHIFTS}
    return {"losses": {shift: _mean_loss(logits, log_z, label) for shift, label in labels.items()},
            "positions": (labels[max(SHIFTS)] != IGNORE).sum()}


def _by_shift(found: Optional[dict]) -> Optional[dict]:
    """The host's shift losses, None where too few positions say anything."""
    if found is None or found["positions"] < SHIFT_MIN_POSITIONS:
        return None
    return found["losses"]


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


# Elements of half-precision logits widened to float32 at a time: a bfloat16 head's [T, V] logits are never copied
# to float32 whole (at 4,096 tokens and Llama-3's 128,256 words that copy would be 2 GiB)
LOGIT_PIECE = 2 ** 22


def log_normalisers(logits: torch.Tensor) -> torch.Tensor:
    """log Z = log Σ_v exp(logit_v) at every position, [N] in float32 at least (as HF's loss upcasts)."""
    flat = logits.detach().reshape(-1, logits.shape[-1])
    if flat.dtype not in (torch.float16, torch.bfloat16):
        return torch.logsumexp(flat, dim=-1)
    rows = max(1, LOGIT_PIECE // flat.shape[-1])
    return torch.cat([torch.logsumexp(flat[i:i + rows].float(), dim=-1) for i in range(0, flat.shape[0], rows)])


def _mean_loss(logits: torch.Tensor, log_z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy's mean over the labelled positions, log Z − logit of the label, summed in float64 (NaN when no
    position is labelled)."""
    labels = labels.reshape(-1).to(log_z.device)
    labelled = labels != IGNORE
    picked = logits.detach().reshape(-1, logits.shape[-1]).gather(1, labels.clamp_min(0)[:, None])[:, 0]
    losses = torch.where(labelled, log_z.double() - picked.double(), 0.0)
    return losses.sum() / labelled.sum()


def loss_report(logits: torch.Tensor, labels: torch.Tensor, kind: str, ids: Optional[torch.Tensor] = None,
                token_mask: Optional[torch.Tensor] = None) -> LossReport:
    """The loss, its log Z and (given the ids a next-token model read) its loss by shift, from one log-normaliser
    and in one copy to the host."""
    with torch.no_grad():
        log_z = log_normalisers(logits)
        labelled = labels.reshape(-1).to(log_z.device) != IGNORE
        at_labels = torch.where(labelled, log_z.double(), 0.0)
        found = to_host({"count": labelled.sum(), "loss": _mean_loss(logits, log_z, labels),
                         "log_z_sum": at_labels.sum(), "log_z_max_abs": at_labels.abs().max(),
                         "shifts": None if ids is None else _shift_losses(logits, ids, token_mask, log_z)})
    vocabulary, count = logits.shape[-1], found["count"]
    if count == 0:
        return LossReport(None, kind, 0, math.log(vocabulary), note=phrase("no token to predict (one token per "
                                                                           "sequence)"))
    return LossReport(found["loss"], kind, count, math.log(vocabulary), found["log_z_sum"] / count,
                      found["log_z_max_abs"], by_shift=_by_shift(found["shifts"]))
