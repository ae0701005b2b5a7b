"""What the loss's gradient at the model's logits says of the loss: the temperature it read them at, and the
targets it used.

**The temperature.**
The cross-entropy of hard labels on logits z read at a temperature T, L = mean over N rows of −log softmax(c·z)_t
with c = 1/T, has the gradient ∂L/∂z_j = (c/N)·softmax(c·z)_j for every class j but the target t. So over the
non-target classes log(∂L/∂z_j) = c·z_j + a constant of the row: a straight line in z_j whose slope is c, exactly
1 for the cross-entropy of the logits as they are. The slope is read off the gradient the backward hands the logits
(a hook on them at the recording step), on a few rows, with no target known: the target is the row's one negative
entry. Only a row that fits the line is taken: each non-target entry positive (a smoothed label's gradient
p_j − ε/V turns negative where p_j < ε/V), a straight line within LINE_TOLERANCE over at least SPREAD nats of logits
(log(p_j − ε/V) curves: over a narrow spread, near the uniform start, the two cannot be told apart, and the row is
left out). A loss that is no such cross-entropy (a distillation term, a binary loss, a mixture) fits no line and is
left out: this says what temperature a tempered cross-entropy used, and nothing of other losses.

**The weight of each row.** The same line's intercept gives the row's scale: log ∂L/∂z_j = log s + c·z_j −
logsumexp(c·z), so s = exp(intercept + logsumexp(c·z)). A mean cross-entropy gives every counted row the same s
(1/N, times c); `F.cross_entropy(weight=w)` gives a row w[t]/Σw, the same for rows of the same target t and another
for rows of other targets. A weight by sequence (a per-sequence mean), by the model's confidence (focal loss) or a
z-loss ties s to the row, not to its target: rows of the same target in other sequences or at other confidences
differ. Read on the sampled rows that fit the line: the pairs of rows with the same target and how far their s
differ, and how far s differs between rows of one sequence.

**The weight of each row, exactly.** Where the loss reads the logits as they are (temperature 1), a row's
gradient is a·softmax(z) − b·e_t with a, b > 0: b = a = s for a weighted cross-entropy, a = s + β for one with a
z-loss (whose gradient adds β·softmax(z)), b the same s. Fitted by least squares on the non-target entries (a) and
read at the target (b = a·p_t − g_t), a row whose non-target entries are a·p_j within EXACT_TOLERANCE of its largest
entry gives its weight b at any spread of its logits — from step 0, where the line above has too few nats to say
anything. A smoothed label (an offset ε/V on every entry), a temperature (softmax(c·z)), a distillation's mix
(a teacher's distribution) and bfloat16's rounding are not of that form and are left to the line. Over such rows,
how the weight follows the model's own probability of the target: log b against log p_t. The likelihood gives
slope 0; focal loss a negative one; −log of a mean probability (the log taken after averaging: a token counts in
proportion to p_t, so the hard ones hardly at all) slope 1 exactly.

**One target for every row.** A cross-entropy against a distribution q_r weighs row r's gradient as w·(p_r − q_r);
a language model's q_r is its own position's next token (or a smoothed or a teacher's distribution of it), so rows
differ by their q. Where g_r − ḡ = w·(p_r − p̄) for every sampled row with one w > 0 (least squares; how close is
the fit's largest distance as a share of the largest entry, judged by `targets_same_for_every_row`), every row is
trained toward the same q = p̄ − ḡ/w: a target broadcast over the batch (an [N] index against an [N, 1] one scores
every position against every target), whatever the inputs.

**The targets.** A hard-label loss — a cross-entropy at any temperature, summed or averaged, with a z-loss, a
binary cross-entropy against one-hot targets — pushes down only the target's logit, up every other: each row's
gradient has one negative entry, at its target. Where a loop computes its loss outside the model, the targets it
used are read there; a row with no negative entry (ignored, padding) or several (a smoothed label, a distillation
against a teacher, a squared error) names none, and the share of rows that name one says whether the loss is of
that kind at all (`hard_rows`).

Everything stays on the device until the record's one copy.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from blocktrace.vocab import IGNORE_INDEX

ROWS = 64  # rows (positions) sampled, evenly, from the logits (a few from each sequence of a batch of 16)
SPREAD = 3.0  # nats of logits the fitted entries must span for a straight line to say anything
LINE_TOLERANCE = 0.01  # largest distance of log ∂L/∂z_j from the fitted line, in nats (float32 rounds to ~1e-6)
RELATIVE_FLOOR = 1e-6  # entries below this share of the row's largest are left out of the fit (their rounding)
# largest distance of a row's entries from a·softmax(z), as a share of its largest entry (float32 rounds the
# gradient to ~1e-7 of it; label smoothing ε = 0.1 over a vocabulary of 256 leaves ~4e-4; bfloat16 ~4e-3)
EXACT_TOLERANCE = 1e-4
PROBABILITY_ROWS = 8  # rows of exactly read weight over which their trend in the target's probability is fitted


@torch.no_grad()
def temperature_slopes(logits: torch.Tensor, grad: torch.Tensor) -> Optional[dict]:
    """Per sampled row, the slope c of log ∂L/∂z_j over z_j and whether the row fits a tempered cross-entropy;
    device tensors, None where the logits have no class axis to read."""
    if logits.shape != grad.shape or logits.dim() < 2 or logits.shape[-1] < 3:
        return None
    z, g = logits.reshape(-1, logits.shape[-1]), grad.reshape(-1, grad.shape[-1])
    index = torch.linspace(0, z.shape[0] - 1, min(ROWS, z.shape[0]), device=z.device).long()
    z, g = z[index].double(), g[index].double()
    fitted = g > RELATIVE_FLOOR * g.amax(dim=-1, keepdim=True)
    count = fitted.sum(dim=-1).clamp_min(1)
    x = torch.where(fitted, z, 0.0)
    y = torch.where(fitted, g.clamp_min(torch.finfo(torch.float64).tiny).log(), 0.0)
    mean_x, mean_y = x.sum(-1, keepdim=True) / count[:, None], y.sum(-1, keepdim=True) / count[:, None]
    dx, dy = torch.where(fitted, x - mean_x, 0.0), torch.where(fitted, y - mean_y, 0.0)
    slope = (dx * dy).sum(-1) / (dx * dx).sum(-1).clamp_min(1e-300)
    off_line = torch.where(fitted, (dy - slope[:, None] * dx).abs(), 0.0).amax(-1)
    spread = torch.where(fitted, z, -torch.inf).amax(-1) - torch.where(fitted, z, torch.inf).amin(-1)
    one_negative = (g < 0).sum(-1) == 1  # the target's entry, and no other (a smoothed label makes more)
    fits = one_negative & (off_line <= LINE_TOLERANCE) & (spread >= SPREAD) & (count >= 3)
    log_scale = (mean_y - slope[:, None] * mean_x).squeeze(-1) + torch.logsumexp(slope[:, None] * z, dim=-1)
    sequence = index // logits.shape[-2] if logits.dim() >= 3 else torch.zeros_like(index)
    log_p = torch.log_softmax(z, dim=-1)  # the rows' probabilities, read by both exact fits below
    exact, log_weight, log_probability = _exact_weights(log_p, g, one_negative)
    return {"slopes": slope, "fits": fits, "log_scales": torch.where(exact, log_weight, log_scale),
            "exact": exact, "log_probabilities": log_probability, "targets": g.argmin(-1), "sequences": sequence,
            **_one_target(log_p.exp(), g)}


def _one_target(p: torch.Tensor, g: torch.Tensor) -> dict:
    """Whether every sampled row with a gradient is trained toward one distribution q (device values): the rows'
    count, the fit's largest distance as a share of the largest entry, its weight w and q's largest entry."""
    rows = g.abs().amax(-1) > 0
    count = rows.sum()
    mean_p = torch.where(rows[:, None], p, 0.0).sum(0) / count.clamp_min(1)
    mean_g = torch.where(rows[:, None], g, 0.0).sum(0) / count.clamp_min(1)
    dp, dg = torch.where(rows[:, None], p - mean_p, 0.0), torch.where(rows[:, None], g - mean_g, 0.0)
    weight = (dp * dg).sum() / (dp * dp).sum().clamp_min(1e-300)
    residual = (dg - weight * dp).abs().amax() / g.abs().amax().clamp_min(1e-300)
    target = mean_p - mean_g / weight
    return {"shared_rows": count, "shared_residual": residual, "shared_weight": weight, "shared_peak": target.amax(),
            "shared_mass": target.sum()}


def _exact_weights(log_p: torch.Tensor, g: torch.Tensor, one_negative: torch.Tensor):
    """Per row (float64, on the device; `log_p` its log-softmax): whether its gradient is a·softmax(z) − b·e_t
    exactly, log b and log p_t."""
    p = log_p.exp()
    target = g.argmin(-1, keepdim=True)
    off = torch.ones_like(g, dtype=torch.bool).scatter_(-1, target, False)
    a = torch.where(off, g * p, 0.0).sum(-1) / torch.where(off, p * p, 0.0).sum(-1).clamp_min(1e-300)
    residual = torch.where(off, (g - a[:, None] * p).abs(), 0.0).amax(-1)
    b = a * p.gather(-1, target).squeeze(-1) - g.gather(-1, target).squeeze(-1)
    exact = one_negative & (a > 0) & (b > 0) & (residual <= EXACT_TOLERANCE * g.abs().amax(-1))
    return exact, b.clamp_min(1e-300).log(), log_p.gather(-1, target).squeeze(-1)


def settled(found: Optional[dict]) -> Optional[dict]:
    """On the host: the slopes of the rows that fit, their count, smallest and largest (None: no row was read)."""
    if not found:
        return None
    slopes = [slope for slope, fits in zip(found["slopes"], found["fits"]) if fits]
    return {"rows": len(slopes), "slope_low": min(slopes) if slopes else None,
            "slope_high": max(slopes) if slopes else None}


def row_weights(found: Optional[dict]) -> Optional[dict]:
    """On the host, over the rows that fit: the pairs of rows with the same target and the largest relative
    difference of their scales; the largest ratio of scales within one sequence, with the targets of its two rows;
    the trend of the weights in the target's probability, and whether every row shares one target. Only the last
    where fewer than two rows fit; None where nothing was read."""
    if not found or "log_scales" not in found:
        return None
    read = [bool(fits) or bool(exact) for fits, exact in zip(found["fits"], found["exact"])]
    rows = [(float(scale), int(target), int(sequence)) for scale, target, sequence, taken in
            zip(found["log_scales"], found["targets"], found["sequences"], read) if taken]
    if len(rows) < 2 or not all(math.isfinite(scale) for scale, _, _ in rows):
        return _shared_target(found)
    pairs = [abs(a[0] - b[0]) for i, a in enumerate(rows) for b in rows[i + 1:] if a[1] == b[1]]
    within = [(abs(a[0] - b[0]), a, b) for i, a in enumerate(rows) for b in rows[i + 1:] if a[2] == b[2]]
    widest = max(within, key=lambda item: item[0], default=None)
    low, high = (sorted(widest[1:], key=lambda row: row[0]) if widest else (None, None))
    return {"same_target_pairs": len(pairs), "same_target_spread": math.expm1(max(pairs)) if pairs else None,
            "sequence_ratio": math.exp(widest[0]) if widest else None,
            "low_target": low[1] if low else None, "high_target": high[1] if high else None,
            **_probability_trend(found), **_shared_target(found)}


def _shared_target(found: dict) -> dict:
    """On the host: whether the sampled rows share one target distribution."""
    shared = {key: float(found[key]) for key in ("shared_residual", "shared_weight", "shared_peak", "shared_mass")}
    return {"shared_rows": int(found["shared_rows"]), **shared}


def _probability_trend(found: dict) -> dict:
    """Over the rows whose weight was read exactly: the least-squares slope of log weight on log p_t, the share of
    the weights' variance it explains, the nats of log p_t it spans and the rows' count (empty: too few rows)."""
    points = [(float(x), float(y)) for x, y, exact in
              zip(found["log_probabilities"], found["log_scales"], found["exact"]) if exact]
    points = [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if len(points) < PROBABILITY_ROWS:
        return {}
    mean_x, mean_y = (sum(v) / len(points) for v in zip(*points))
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    syy = sum((y - mean_y) ** 2 for _, y in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    if sxx <= 0:
        return {}
    return {"probability_rows": len(points), "probability_slope": sxy / sxx,
            "probability_explained": sxy * sxy / (sxx * syy) if syy > 0 else 0.0,
            "probability_span": max(x for x, _ in points) - min(x for x, _ in points)}


@torch.no_grad()
def gradient_targets(grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's target as the loss used it (its one negative entry; IGNORE_INDEX where it has none or several),
    shaped as the logits without their class axis; the share of rows with any gradient that name one; and the share
    of them with any negative entry at all — a logit the loss pulls up (a cross-entropy against any distribution
    pulls up its targets' logits; a z-loss alone pulls every logit down)."""
    negative = (grad < 0).sum(-1)
    named = negative == 1
    targets = torch.where(named, grad.argmin(-1), torch.full_like(negative, IGNORE_INDEX))
    touched = (grad != 0).any(-1)
    count = touched.sum().clamp_min(1).double()
    return targets, named.sum().double() / count, ((negative > 0) & touched).sum().double() / count
