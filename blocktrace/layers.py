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


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention written out, so its weights can be traced.

    `scores` sees the masked pre-softmax logits and `weights` the softmax output,
    `[..., H, T, T]` (`[H, T, T]` for an unbatched `[T, d]` input).
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

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        *lead, t, d = x.shape
        return x.view(*lead, t, self.n_heads, d // self.n_heads).transpose(-3, -2)  # [..., H, T, hd]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # [..., H, T, T]
        if self.causal:
            t = x.shape[-2]
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))  # before softmax: weight exactly 0
        weights = self.weights(torch.softmax(self.scores(scores), dim=-1))
        mixed = torch.matmul(weights, v).transpose(-3, -2)  # [..., T, H, hd]
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
