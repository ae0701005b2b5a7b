"""Tensor statistics and attention diagnostics, kept as tensors until the trace ends.

The hot path calls no `.item()` per statistic: each step leaves a small tensor of moments
and a whole trace is copied to Python in one go, after the forward pass.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from blocktrace.host import to_host

STAT_NAMES = ("mean", "std", "min", "max", "rms", "absmax", "nan", "inf")


def real_token_mask(t: torch.Tensor, token_mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The mask broadcast to t ([B, T, 1, …] on t's device) when it applies to t ([B, T, …] values of a padded
    batch), else None. Padding is left out by weighting or filling, never by a boolean index: an index's size
    would need a read on the host."""
    if token_mask is None or t.dim() < 2 or tuple(t.shape[:2]) != tuple(token_mask.shape):
        return None
    return token_mask.to(t.device).reshape(*token_mask.shape, *([1] * (t.dim() - 2)))


def widened(t: torch.Tensor) -> torch.Tensor:
    """t detached, in float32 when it is half precision or not floating (half-precision sums overflow and lose
    digits; differences of nearby half-precision values are exact in float32)."""
    t = t.detach()
    return t if t.is_floating_point() and t.dtype not in (torch.float16, torch.bfloat16) else t.float()


def largest_magnitude(moments: list[float]) -> float:
    """max |x| from tensor_moments on the host."""
    return max(abs(moments[3]), abs(moments[4]))


def tensor_moments(t: torch.Tensor, token_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[n, Σx, Σx², min, max] of the elements at real tokens (all of them without a mask), as one float64
    tensor on t's device: three cheap passes — sum, dot(x, x), aminmax — and no read on the host.

    NaN and Inf are not counted here: min + max is not finite exactly when some are, and the trace counts
    them then (nonfinite_counts), in its second transfer, which a healthy trace never makes.
    """
    real = real_token_mask(t, token_mask)
    flat = widened(t)
    if real is None:
        flat = flat.reshape(-1)
        raw = torch.stack([flat.sum(), torch.dot(flat, flat), *torch.aminmax(flat)])
        n = torch.full((1,), float(flat.numel()), dtype=torch.float64, device=raw.device)
        return torch.cat([n, raw.double()])
    zeroed = torch.where(real, flat, 0).reshape(-1)  # no boolean indexing: its size would need a host read
    raw = torch.stack([zeroed.sum(), torch.dot(zeroed, zeroed), flat.masked_fill(~real, float("inf")).amin(),
                       flat.masked_fill(~real, -float("inf")).amax()])
    n = real.sum(dtype=torch.float64) * (flat.numel() // real.numel())
    return torch.cat([n.reshape(1), raw.double()])


def nonfinite_counts(t: torch.Tensor, token_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """[#NaN, #Inf] at real tokens, on t's device."""
    real = real_token_mask(t, token_mask)
    nan, inf = torch.isnan(t.detach()), torch.isinf(t.detach())
    if real is not None:
        nan, inf = nan & real, inf & real
    return torch.stack([nan.sum(), inf.sum()])


def finite(moments: list[float]) -> bool:
    """Whether every element was finite, from tensor_moments on the host."""
    return math.isfinite(moments[3] + moments[4])


def stats_from_moments(moments: list[float], counts: Optional[list[float]] = None) -> list[float]:
    """[mean, std, min, max, rms, max|x|, #NaN, #Inf] from tensor_moments and nonfinite_counts (None: all
    finite); population std."""
    n, total, squares, low, high = moments
    nan, inf = counts if counts is not None else (0, 0)
    mean, mean_square = total / n, squares / n
    variance = max(mean_square - mean * mean, 0.0) if math.isfinite(mean_square) else mean_square
    return [mean, math.sqrt(variance) if variance == variance else variance, low, high,
            math.sqrt(mean_square) if mean_square == mean_square else mean_square,
            largest_magnitude(moments), nan, inf]


def tensor_stats(t: torch.Tensor) -> list[float]:
    """The statistics of one tensor, as Python floats in STAT_NAMES order."""
    moments, counts = to_host((tensor_moments(t), nonfinite_counts(t)))
    return stats_from_moments(moments, counts if not finite(moments) else None)


# Below this, a diagonal weight may have lost digits to underflow: such rows use their maximum.
_TINY_WEIGHT = 1e-30


def _log_normaliser(w: torch.Tensor, s: torch.Tensor, rows: slice, row_max_score: torch.Tensor) -> torch.Tensor:
    """lse = log Σ_j exp(s_j) per row, from the softmax output: lse = s_j − log p_j for any j.

    The diagonal j = i is always a valid key (causal or not) and costs no pass over the T² values;
    rows whose diagonal weight is tiny (collapsed onto another key) use their largest weight instead,
    which is ≥ 1/T. Both are computed and chosen on the device (a test of "any row tiny?" would make
    the host wait); the row maxima cost one pass over the weights, as cheap as the score maxima (a
    `max` with indices costs five times that on a CPU).
    """
    diagonal_w = torch.diagonal(w, offset=rows.start, dim1=-2, dim2=-1)
    diagonal_s = torch.diagonal(s, offset=rows.start, dim1=-2, dim2=-1)
    tiny = diagonal_w < _TINY_WEIGHT
    return torch.where(tiny, row_max_score - torch.log(w.amax(dim=-1)), diagonal_s - torch.log(diagonal_w))


@functools.lru_cache(maxsize=8)
def _upper_triangle(rows: int, width: int, diagonal: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[rows, width]: 1 on and above `diagonal` (cached: every chunk of a long input but the last has the same shape,
    and so does every layer)."""
    return torch.ones(rows, width, dtype=dtype, device=device).triu_(diagonal)


FUTURE_BAND = 256  # query rows whose own keys future_rows masks at once: [256, 256] triangles, whatever the chunk


def future_rows(w: torch.Tensor, start: int) -> torch.Tensor:
    """[..., rows]: each query row's weight on the keys after it, for a chunk of rows starting at query `start`.

    Only those keys are read: the keys past the chunk's last query are after every row of it (a plain sum), and
    those among the chunk's own queries are masked by a [rows, rows] triangle. A product with a [rows, T] mask read
    the whole chunk and the mask besides, the trace's most expensive attention pass (benchmarks/bench_trace_cost.py).
    """
    rows, t = w.shape[-2], w.shape[-1]
    if rows > FUTURE_BAND:  # a whole matrix (a GPU's one chunk): its triangle band by band, not one [T, T] copy
        return torch.cat([future_rows(w[..., a : a + FUTURE_BAND, :], start + a) for a in range(0, rows, FUTURE_BAND)],
                         dim=-1)
    lo, hi = min(start + 1, t), min(start + rows, t)
    near = w[..., lo:hi] * _upper_triangle(rows, hi - lo, start + 1 - lo, w.dtype, w.device)
    return near.sum(dim=-1) + w[..., hi:].sum(dim=-1)


@functools.lru_cache(maxsize=64)
def uniform_entropy(t: int, causal: bool, window: Optional[int] = None, chunk: Optional[int] = None) -> float:
    """Mean entropy of uniform attention over the keys each query may see: log T, or, causal,
    the mean of log(i + 1) over the queries (log min(i + 1, W) with a sliding window W; the keys from the
    start of its chunk, i mod C + 1, with Llama-4's chunks of C). Cached: a loop over T that every layer of a
    model would repeat."""
    if not causal:
        return math.log(t)
    return sum(math.log(min(i + 1, window or t, i % chunk + 1 if chunk else t)) for i in range(t)) / t


def _count(value: int, device: torch.device) -> torch.Tensor:
    """A count as a float64 device scalar, by a fill: a copy to the device from pageable host memory would
    wait for the queue first."""
    return torch.full((), float(value), dtype=torch.float64, device=device)


def _positional_sums(w: torch.Tensor, keys: slice, real: Optional[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per head, the weight summed over the chunk's rows on the first key, on the query's own key and on the
    key just before it: the signatures of a sink head, a self head and a previous-token head. `keys`: the own keys
    of the chunk's queries."""
    first = w[..., 0]  # [N, H, rows]
    own = torch.diagonal(w, offset=keys.start, dim1=-2, dim2=-1)  # [N, H, rows]
    previous = torch.diagonal(w, offset=keys.start - 1, dim1=-2, dim2=-1)  # rows whose own key is ≥ 1
    with_previous = keys.stop - max(keys.start, 1)  # the chunk's queries that have a key before them
    if real is not None:
        first, own = first * real, own * real
        previous = previous * real[..., -previous.shape[-1]:] if previous.shape[-1] else previous
        previous_rows = real[..., real.shape[-1] - max(with_previous, 0):].sum(dtype=torch.float64)
    else:
        previous_rows = _count(w.shape[0] * max(with_previous, 0), w.device)
    return {"first_sum": first.double().sum(dim=(0, 2)), "self_sum": own.double().sum(dim=(0, 2)),
            "previous_sum": previous.double().sum(dim=(0, 2)), "previous_rows": previous_rows}


def attention_chunk_stats(weights: torch.Tensor, scores: torch.Tensor, rows: slice,
                          query_mask: Optional[torch.Tensor] = None, keys_before: int = 0) -> dict[str, torch.Tensor]:
    """Diagnostics of one chunk of query rows: weights and masked scores `[..., H, rows, S]`.

    entropy_sum per head: Σ over rows of −Σ_j p log p, as lse − Σ_j p_j s_j (log p_j = s_j − lse): one dot product
    per row, no logarithm over the T² weights. The largest weight of a row is exp(s_max − lse), so only the scores
    are scanned for maxima. future_weight_sum: total weight on keys after each query's own (exactly 0 when a causal
    mask works); `keys_before` keys precede the first query's own (memory keys, a prefix: query i's own key is key
    i + keys_before). query_mask ([B, T], False at padding) leaves padded query rows out.
    """
    w, s = weights.detach(), scores.detach()
    n_heads, t = w.shape[-3], w.shape[-1]
    w, s = w.reshape(-1, n_heads, w.shape[-2], t), s.reshape(-1, n_heads, s.shape[-2], t)
    own = slice(rows.start + keys_before, rows.stop + keys_before)  # each query's own key
    row_max_score = s.amax(dim=-1)
    lse = _log_normaliser(w, s, own, row_max_score)
    expected_score = torch.einsum("nhij,nhij->nhi", w, s)
    row_entropy = (lse - expected_score).double()  # [N, H, rows]
    future_by_row = future_rows(w, own.start).double()  # [N, H, rows]
    row_max_weight = torch.exp(row_max_score - lse)
    if query_mask is None:
        future = future_by_row.sum()
        return {"entropy_sum": row_entropy.sum(dim=(0, 2)), "future_weight_sum": future,
                "max_weight": row_max_weight.amax().double(), "max_logit": row_max_score.amax().double(),
                "rows": _count(w.shape[0] * w.shape[-2], w.device), **_positional_sums(w, own, None)}
    real = query_mask[:, None, rows].to(w.device)  # [N, 1, rows]: padded queries count for nothing
    return {"entropy_sum": (row_entropy * real).sum(dim=(0, 2)), "future_weight_sum": (future_by_row * real).sum(),
            "max_weight": row_max_weight.masked_fill(~real, 0).amax().double(),
            "max_logit": row_max_score.masked_fill(~real, torch.finfo(s.dtype).min).amax().double(),
            "rows": real.sum(dtype=torch.float64), **_positional_sums(w, own, real)}


def weights_only_stats(weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """Diagnostics when only the softmax output is visible (a user's attention module).

    Without the scores the entropy needs −Σ p log p itself (slower; not on the hot path of
    blocktrace's own block), and the largest logit is unknown.
    """
    w = weights.detach()
    n_heads, t = w.shape[-3], w.shape[-1]
    w = w.reshape(-1, n_heads, w.shape[-2], t)
    entropy = torch.special.entr(w.double()).sum(dim=(0, 2, 3))
    return {"entropy_sum": entropy, "future_weight_sum": future_rows(w, 0).double().sum(), "max_weight": w.amax().double(),
            "max_logit": None, "rows": _count(w.shape[0] * w.shape[-2], w.device), **_positional_sums(w, slice(0, w.shape[-2]), None)}


def attention_stats(weights: torch.Tensor, scores: torch.Tensor) -> dict[str, torch.Tensor]:
    """attention_chunk_stats of a whole matrix, with the entropy averaged per head."""
    chunk = attention_chunk_stats(weights, scores, slice(0, weights.shape[-2]))
    return {"future_weight_sum": chunk["future_weight_sum"], "max_weight": chunk["max_weight"],
            "max_logit": chunk["max_logit"], "entropy_per_head": chunk["entropy_sum"] / chunk["rows"]}
