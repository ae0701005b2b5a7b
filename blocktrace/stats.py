"""Tensor statistics and attention diagnostics, kept as tensors until the trace ends.

Nothing here calls `.item()`: each function returns 0-d or small tensors so that a whole
trace is copied to Python in one go, after the forward pass.
"""

from __future__ import annotations

import torch

STAT_NAMES = ("mean", "std", "min", "max", "rms", "absmax", "nan", "inf")


def tensor_stats(t: torch.Tensor) -> torch.Tensor:
    """[mean, std, min, max, rms, max|x|, #NaN, #Inf] of all elements, as one float64 vector.

    std is the population std (correction 0); rms² = var + mean² saves a pass over the data.
    """
    t = t.detach()
    if not t.is_floating_point() or t.dtype in (torch.float16, torch.bfloat16):
        t = t.float()  # half-precision sums overflow and lose digits
    var, mean = torch.var_mean(t, correction=0)
    low, high = torch.aminmax(t)
    values = torch.stack(
        [
            mean,
            var.sqrt(),
            low,
            high,
            (var + mean * mean).sqrt(),
            torch.maximum(low.abs(), high.abs()),
            torch.isnan(t).sum().to(t.dtype),
            torch.isinf(t).sum().to(t.dtype),
        ]
    )
    return values.to(torch.float64)


def attention_stats(weights: torch.Tensor, chunk: int = 256) -> dict[str, torch.Tensor]:
    """Diagnostics of softmax weights `[..., H, T, T]`, computed `chunk` query rows at a time.

    future_weight_sum: total weight above the diagonal (exactly 0 when a causal mask works).
    entropy_per_head: −Σ p log p per query row, averaged over batch and queries (uniform = log T).
    Chunking bounds the temporaries to `chunk` rows, whatever T is.
    """
    w = weights.detach()
    n_heads, t = w.shape[-3], w.shape[-1]
    w = w.reshape(-1, n_heads, t, t)  # [N, H, T, T]
    entropy = torch.zeros(n_heads, dtype=torch.float64, device=w.device)
    future = torch.zeros((), dtype=torch.float64, device=w.device)
    for start in range(0, t, chunk):
        rows = w[:, :, start : start + chunk, :]
        entropy += torch.special.entr(rows.float()).sum(dim=(0, 2, 3)).double()
        # Row i of the chunk is query start+i: its future keys are j > start+i.
        future += torch.triu(rows, diagonal=start + 1).sum().double()
    return {
        "future_weight_sum": future,
        "entropy_per_head": entropy / (w.shape[0] * t),
        "max_weight": w.amax().double(),
    }
