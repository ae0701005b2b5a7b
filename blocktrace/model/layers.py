"""The pieces a block is made of: norms, attention that exposes its weights, FFN variants.

Every layer works on `[..., T, d_model]`, so the tutorial's `[T, d]` input and a batched
`[B, T, d]` input flow through the same code and keep their shape.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from blocktrace.config import BlockConfig, FFNKind, Norm


class HookPoint(nn.Module):
    """Identity module: passing a value through it lets an ordinary forward hook see it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · g (Zhang & Sennrich 2019; eps inside the root, as HF Llama)."""

    def __init__(self, d_model: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 at least: half-precision squares overflow at |x| > 256.
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def make_norm(config: BlockConfig) -> nn.Module:
    if config.norm is Norm.RMSNORM:
        return RMSNorm(config.d_model, config.eps)
    return nn.LayerNorm(config.d_model, eps=config.eps, bias=config.bias)


# Query rows per chunk are chosen so one chunk's scores stay under this many bytes.
ATTENTION_CHUNK_BYTES = 256 * 2**20


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021) in HF Llama's convention: the two halves of each head are rotated
    by angle position · θ^(-2i/head_dim); `scaling` divides the positions (linear scaling)."""

    def __init__(self, head_dim: int, theta: float, scaling: float = 1.0):
        super().__init__()
        self.scaling = scaling
        self.register_buffer("inv_freq", 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)),
                             persistent=False)

    def cos_sin(self, t: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(t, device=device, dtype=torch.float) / self.scaling
        angles = positions[:, None] * self.inv_freq.to(device)[None, :]
        both = torch.cat((angles, angles), dim=-1)  # [T, head_dim]
        return both.cos().to(dtype), both.sin().to(dtype)

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated_half * sin


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention written out, so its weights can be traced.

    `scores` sees the masked pre-softmax logits and `weights` the softmax output,
    `[..., H, rows, T]` (no batch dimension for an unbatched `[T, d]` input). Queries are
    processed in chunks of rows (`query_chunk`, or as many as fit ATTENTION_CHUNK_BYTES), so
    the full `[B, H, T, T]` matrix never exists at once for long inputs; `rows` tells the
    hooks which query rows the current chunk holds. Softmax is per row, so chunking changes
    no number.
    """

    def __init__(self, config: BlockConfig):
        super().__init__()
        d, bias, hd = config.d_model, config.bias, config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd
        self.causal = config.causal
        self.scale = hd**-0.5
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)  # fewer heads under grouped-query attention
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=bias)
        self.out_proj = nn.Linear(self.n_heads * hd, d, bias=bias)
        self.rope = None
        if config.rope_theta is not None:
            self.rope = RotaryEmbedding(hd, config.rope_theta, config.rope_scaling)
            # q and k before and after the rotation, each visible to a hook
            self.q, self.k, self.q_rope, self.k_rope = HookPoint(), HookPoint(), HookPoint(), HookPoint()
        self.scores = HookPoint()
        self.weights = HookPoint()
        self.query_chunk = None  # rows per chunk; None: as many as fit ATTENTION_CHUNK_BYTES
        self.rows = slice(0, 0)  # the query rows of the chunk being computed
        self.key_mask = None  # [B, T] bool, False at padding: those keys get no weight

    def _split_heads(self, x: torch.Tensor, heads: Optional[int] = None) -> torch.Tensor:
        *lead, t, width = x.shape
        heads = heads or self.n_heads
        return x.view(*lead, t, heads, width // heads).transpose(-3, -2)  # [..., H, T, hd]

    def chunk_rows(self, q: torch.Tensor) -> int:
        t = q.shape[-2]
        if self.query_chunk:
            return min(self.query_chunk, t)
        bytes_per_row = q[..., 0, 0].numel() * t * q.element_size()  # one query row of every head
        return max(1, min(t, ATTENTION_CHUNK_BYTES // max(1, bytes_per_row)))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: slice) -> torch.Tensor:
        self.rows = rows
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scale)  # [..., H, rows, T]
        if self.causal:
            keys = torch.arange(k.shape[-2], device=q.device)
            queries = torch.arange(rows.start, rows.stop, device=q.device)
            # finfo.min, not -inf, as HF does: the weight is still exactly 0 and p·s stays finite.
            scores.masked_fill_(keys[None, :] > queries[:, None], torch.finfo(scores.dtype).min)
        if self.key_mask is not None:  # padding of a batch of different lengths
            scores.masked_fill_(~self.key_mask[:, None, None, :], torch.finfo(scores.dtype).min)
        weights = self.weights(torch.softmax(self.scores(scores), dim=-1))
        return torch.matmul(weights, v)  # [..., H, rows, hd]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x), self.n_kv_heads)
        v = self._split_heads(self.v_proj(x), self.n_kv_heads)
        if self.rope is not None:
            cos, sin = self.rope.cos_sin(x.shape[-2], x.device, q.dtype)
            q = self.q_rope(self.rope.rotate(self.q(q), cos, sin))
            k = self.k_rope(self.rope.rotate(self.k(k), cos, sin))
        if self.n_kv_heads != self.n_heads:  # each key/value head serves n_heads / n_kv_heads query heads
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
        t, step = q.shape[-2], self.chunk_rows(q)
        parts = [self._attend(q[..., a : a + step, :], k, v, slice(a, min(a + step, t))) for a in range(0, t, step)]
        mixed = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)).transpose(-3, -2)  # [..., T, H, hd]
        return self.out_proj(mixed.reshape(*x.shape[:-1], self.n_heads * self.head_dim))


class MLP(nn.Module):
    """Linear(d → d_ff), nonlinearity, Linear(d_ff → d); `hidden` sees the activations."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.act = _activation(config.ffn)
        self.hidden = HookPoint()
        self.proj = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.hidden(self.act(self.fc(x))))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) · up(x)) (Shazeer 2020, "GLU Variants Improve Transformer")."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.up = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.hidden = HookPoint()
        self.down = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.hidden(F.silu(self.gate(x)) * self.up(x)))


def _activation(kind: FFNKind) -> nn.Module:
    if kind is FFNKind.RELU:
        return nn.ReLU()
    if kind is FFNKind.GELU_TANH:
        return nn.GELU(approximate="tanh")
    return nn.GELU()


def make_ffn(config: BlockConfig) -> nn.Module:
    return SwiGLU(config) if config.ffn is FFNKind.SWIGLU else MLP(config)
