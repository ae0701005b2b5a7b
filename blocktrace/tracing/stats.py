"""Tensor statistics and attention diagnostics, kept as tensors until the trace ends.

The hot path calls no `.item()` per statistic: each step leaves a small tensor of moments
and a whole trace is copied to Python in one go, after the forward pass.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

STAT_NAMES = ("mean", "std", "min", "max", "rms", "absmax", "nan", "inf")


def tensor_moments(t: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """[n, Σx, Σx², min, max, #NaN, #Inf] of all elements as one float64 tensor, and whether all
    elements are finite.

    Three cheap passes — sum, dot(x, x), aminmax — instead of a Welford var_mean. NaN and
    Inf are counted only when min + max is not finite (the one host check per step): that
    saves two full passes on every healthy step.
    """
    flat = t.detach().reshape(-1)
    if not flat.is_floating_point() or flat.dtype in (torch.float16, torch.bfloat16):
        flat = flat.float()  # half-precision sums overflow and lose digits
    raw = torch.stack([flat.sum(), torch.dot(flat, flat), *torch.aminmax(flat)])
    finite = math.isfinite(float(raw[2] + raw[3]))
    if finite:
        counts = torch.zeros(2, dtype=raw.dtype, device=raw.device)
    else:
        counts = torch.stack([torch.count_nonzero(torch.isnan(flat)), torch.count_nonzero(torch.isinf(flat))])
    n = torch.tensor([float(flat.numel())], dtype=torch.float64, device=raw.device)
    return torch.cat([n, raw.double(), counts.double()]), finite


def stats_from_moments(moments: list[float]) -> list[float]:
    """[mean, std, min, max, rms, max|x|, #NaN, #Inf] from tensor_moments; population std."""
    n, total, squares, low, high, nan, inf = moments
    mean, mean_square = total / n, squares / n
    variance = max(mean_square - mean * mean, 0.0) if math.isfinite(mean_square) else mean_square
    return [mean, math.sqrt(variance) if variance == variance else variance, low, high,
            math.sqrt(mean_square) if mean_square == mean_square else mean_square,
            max(abs(low), abs(high)), nan, inf]


def tensor_stats(t: torch.Tensor) -> list[float]:
    """The statistics of one tensor, as Python floats in STAT_NAMES order."""
    return stats_from_moments(tensor_moments(t)[0].tolist())


# Below this, a diagonal weight may have lost digits to underflow: such rows use their maximum.
_TINY_WEIGHT = 1e-30


def _log_normaliser(w: torch.Tensor, s: torch.Tensor, rows: slice, row_max_score: torch.Tensor) -> torch.Tensor:
    """lse = log Σ_j exp(s_j) per row, from the softmax output: lse = s_j − log p_j for any j.

    The diagonal j = i is always a valid key (causal or not) and costs no pass over the
    T² values; the few rows whose diagonal weight is tiny (collapsed onto another key) use
    their largest weight instead, which is ≥ 1/T.
    """
    diagonal_w = torch.diagonal(w, offset=rows.start, dim1=-2, dim2=-1)
    diagonal_s = torch.diagonal(s, offset=rows.start, dim1=-2, dim2=-1)
    lse = diagonal_s - torch.log(diagonal_w)
    tiny = diagonal_w < _TINY_WEIGHT
    if bool(tiny.any()):
        lse = torch.where(tiny, row_max_score - torch.log(w.amax(dim=-1)), lse)
    return lse


@functools.lru_cache(maxsize=4)
def _future_mask(rows: int, t: int, start: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[rows, T]: 1 above the diagonal, for a chunk of rows starting at query `start` (cached: the same
    shapes come back for every layer and every chunk of a long input)."""
    return torch.ones(rows, t, dtype=dtype, device=device).triu_(start + 1)


def uniform_entropy(t: int, causal: bool, window: Optional[int] = None) -> float:
    """Mean entropy of uniform attention over the keys each query may see: log T, or, causal,
    the mean of log(i + 1) over the queries (log min(i + 1, W) with a sliding window W)."""
    if not causal:
        return math.log(t)
    return sum(math.log(min(i + 1, window or t)) for i in range(t)) / t


def _positional_sums(w: torch.Tensor, rows: slice, real: Optional[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per head, the weight summed over the chunk's rows on the first key, on the query's own key and on the
    key just before it: the signatures of a sink head, a self head and a previous-token head."""
    first = w[..., 0]  # [N, H, rows]
    own = torch.diagonal(w, offset=rows.start, dim1=-2, dim2=-1)  # [N, H, rows]
    previous = torch.diagonal(w, offset=rows.start - 1, dim1=-2, dim2=-1)  # rows whose query is ≥ 1
    has_previous = torch.arange(rows.start, rows.stop, device=w.device) >= 1
    if real is not None:
        first, own = first * real, own * real
        previous = previous * real[..., -previous.shape[-1]:] if previous.shape[-1] else previous
        has_previous = has_previous & real.any(dim=(0, 1))
    return {"first_sum": first.double().sum(dim=(0, 2)), "self_sum": own.double().sum(dim=(0, 2)),
            "previous_sum": previous.double().sum(dim=(0, 2)),
            "previous_rows": (real[..., has_previous].sum() if real is not None
                              else w.shape[0] * int(has_previous.sum()))}


def attention_chunk_stats(weights: torch.Tensor, scores: torch.Tensor, rows: slice,
                          query_mask: Optional[torch.Tensor] = None) -> dict[str, torch.Tensor]:
    """Diagnostics of one chunk of query rows: weights and masked scores `[..., H, rows, T]`.

    entropy_sum per head: Σ over rows of −Σ_j p log p, from values the attention already has:
    log p_j = s_j − lse, so H = lse − Σ_j p_j s_j: one dot product per row, no logarithm over
    the T² weights. The largest weight of a row is exp(s_max − lse), so only the scores are
    scanned for maxima. future_weight_sum: total weight above the diagonal (exactly 0 when a
    causal mask works). query_mask ([B, T], False at padding) leaves padded query rows out.
    """
    w, s = weights.detach(), scores.detach()
    n_heads, t = w.shape[-3], w.shape[-1]
    w, s = w.reshape(-1, n_heads, w.shape[-2], t), s.reshape(-1, n_heads, s.shape[-2], t)
    row_max_score = s.amax(dim=-1)
    lse = _log_normaliser(w, s, rows, row_max_score)
    expected_score = torch.einsum("nhij,nhij->nhi", w, s)
    row_entropy = (lse - expected_score).double()  # [N, H, rows]
    future_mask = _future_mask(w.shape[-2], t, rows.start, w.dtype, w.device)
    row_max_weight = torch.exp(row_max_score - lse)
    if query_mask is None:
        future = (w.reshape(-1, future_mask.numel()) @ future_mask.reshape(-1)).double().sum()
        return {"entropy_sum": row_entropy.sum(dim=(0, 2)), "future_weight_sum": future,
                "max_weight": row_max_weight.amax().double(), "max_logit": row_max_score.amax().double(),
                "rows": w.shape[0] * w.shape[-2], **_positional_sums(w, rows, None)}
    real = query_mask[:, None, rows].to(w.device)  # [N, 1, rows]: padded queries count for nothing
    future_rows = torch.einsum("nhij,ij->nhi", w, future_mask).double()
    return {"entropy_sum": (row_entropy * real).sum(dim=(0, 2)), "future_weight_sum": (future_rows * real).sum(),
            "max_weight": row_max_weight.masked_fill(~real, 0).amax().double(),
            "max_logit": row_max_score.masked_fill(~real, torch.finfo(s.dtype).min).amax().double(),
            "rows": int(query_mask.sum()), **_positional_sums(w, rows, real)}


def weights_only_stats(weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Diagnostics when only the softmax output is visible (a user's attention module).

    Without the scores the entropy needs −Σ p log p itself (slower; not on the hot path of
    blocktrace's own block), and the largest logit is unknown.
    """
    w = weights.detach()
    n_heads, t = w.shape[-3], w.shape[-1]
    w = w.reshape(-1, n_heads, w.shape[-2], t)
    entropy = torch.special.entr(w.double()).sum(dim=(0, 2, 3))
    future_mask = _future_mask(w.shape[-2], t, 0, w.dtype, w.device)
    future = (w.reshape(-1, future_mask.numel()) @ future_mask.reshape(-1)).double().sum()
    return {"entropy_sum": entropy, "future_weight_sum": future, "max_weight": w.amax().double(),
            "max_logit": None, "rows": w.shape[0] * w.shape[-2], **_positional_sums(w, slice(0, w.shape[-2]), None)}


def attention_stats(weights: torch.Tensor, scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """attention_chunk_stats of a whole matrix, with the entropy averaged per head."""
    chunk = attention_chunk_stats(weights, scores, slice(0, weights.shape[-2]))
    return {"future_weight_sum": chunk["future_weight_sum"], "max_weight": chunk["max_weight"],
            "max_logit": chunk["max_logit"], "entropy_per_head": chunk["entropy_sum"] / chunk["rows"]}
