"""The pieces a block is made of: norms, attention that exposes its weights, FFN variants.

Every layer works on `[..., T, d_model]`, so the tutorial's `[T, d]` input and a batched
`[B, T, d]` input flow through the same code and keep their shape.
"""

from __future__ import annotations

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
        d, bias = config.d_model, config.bias
        self.n_heads = config.n_heads
        self.causal = config.causal
        self.scale = config.head_dim**-0.5
        self.q_proj = nn.Linear(d, d, bias=bias)
        self.k_proj = nn.Linear(d, d, bias=bias)
        self.v_proj = nn.Linear(d, d, bias=bias)
        self.out_proj = nn.Linear(d, d, bias=bias)
        self.scores = HookPoint()
        self.weights = HookPoint()
        self.query_chunk = None  # rows per chunk; None: as many as fit ATTENTION_CHUNK_BYTES
        self.rows = slice(0, 0)  # the query rows of the chunk being computed

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        *lead, t, d = x.shape
        return x.view(*lead, t, self.n_heads, d // self.n_heads).transpose(-3, -2)  # [..., H, T, hd]

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
        weights = self.weights(torch.softmax(self.scores(scores), dim=-1))
        return torch.matmul(weights, v)  # [..., H, rows, hd]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        t, step = q.shape[-2], self.chunk_rows(q)
        parts = [self._attend(q[..., a : a + step, :], k, v, slice(a, min(a + step, t))) for a in range(0, t, step)]
        mixed = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)).transpose(-3, -2)  # [..., T, H, hd]
        return self.out_proj(mixed.reshape(x.shape))


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
