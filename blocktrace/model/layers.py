"""The pieces a block is made of: norms, attention that exposes its weights, FFN variants.

Every layer works on `[..., T, d_model]`, so the tutorial's `[T, d]` input and a batched
`[B, T, d]` input flow through the same code and keep their shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.rope import RotaryEmbedding
from blocktrace.vocab import FFNKind, Norm, QKSpan


class HookPoint(nn.Module):
    """Identity module: passing a value through it lets an ordinary forward hook see it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def watched(self) -> bool:
        """Whether a hook would see what passes: a value built only to be seen need not be built otherwise."""
        return bool(self._forward_hooks or self._forward_pre_hooks or nn.modules.module._global_forward_hooks
                    or nn.modules.module._global_forward_pre_hooks)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · g (Zhang & Sennrich 2019; eps inside the root, as HF Llama).

    With `offset` (Gemma: 1) the gain is (offset + g) and, as Gemma computes it, the product is
    taken in float32 before the cast back, as OLMo-2's is too (`gain_float32`); otherwise the
    normalised value is cast first (Llama).
    """

    def __init__(self, d_model: int, eps: float, offset: float = 0.0, gain_float32: bool = False, gain: bool = True):
        super().__init__()
        self.eps, self.offset, self.gain_float32 = eps, offset, gain_float32 or bool(offset)
        # gain=False: no learned gain at all (Llama-4's L2 QK-norm)
        self.weight = nn.Parameter(torch.zeros(d_model) if offset else torch.ones(d_model)) if gain else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 at least: half-precision squares overflow at |x| > 256.
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is None:
            return normed.to(x.dtype)
        if self.gain_float32:
            return (normed * (self.offset + self.weight.to(normed.dtype))).to(x.dtype)
        return self.weight * normed.to(x.dtype)


def make_norm(config: BlockConfig) -> nn.Module:
    if config.norm is Norm.RMSNORM:
        return RMSNorm(config.d_model, config.eps, config.norm_offset, config.norm_gain_float32)
    return nn.LayerNorm(config.d_model, eps=config.eps, bias=config.bias)


# Query rows per chunk are chosen so one chunk's scores stay under this many bytes: on a GPU, one large chunk (few
# kernels); on a CPU a few MiB. Measured at GPT-2 small and XL, T 1024 (benchmarks/bench.py, RESULTS.md): the forward
# in one [H, T, T] matrix of 48 and 100 MiB takes 1.15× and 1.12× as long as in chunks of 8 MiB. Likely why (not
# measured apart): a chunk's temporaries stay in the last-level cache and below glibc's largest mmap threshold
# (32 MiB), so they reuse freed memory instead of faulting in fresh pages at every matrix; chunks of 12 MiB were as
# slow as one matrix in some runs and not in others.
ATTENTION_CHUNK_BYTES = 256 * 2**20
CPU_ATTENTION_CHUNK_BYTES = 8 * 2**20


def attention_chunk_bytes(device: torch.device) -> int:
    """The bytes one chunk of attention scores may take on `device`."""
    return CPU_ATTENTION_CHUNK_BYTES if torch.device(device).type == "cpu" else ATTENTION_CHUNK_BYTES


@dataclass(frozen=True)
class HeadPath:
    """The modules one of q and k passes through on its way to the scores (None: the block has no such stage): its
    projection, its hook as projected, its QK-norm, its hook after RoPE; `tempered`, whether Llama-4's query
    temperature applies (to q only)."""
    proj: nn.Linear
    heads: int
    seen: Optional[nn.Module]
    norm: Optional[nn.Module]
    rotated: Optional[nn.Module]
    tempered: bool = False


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention written out, so its weights can be traced.

    `scores` sees the masked pre-softmax logits and `weights` the softmax output,
    `[..., H, rows, T]` (no batch dimension for an unbatched `[T, d]` input). Queries are
    processed in chunks of rows (`query_chunk`, or as many as fit attention_chunk_bytes), so
    the full `[B, H, T, T]` matrix never exists at once for long inputs; `rows` tells the
    hooks which query rows the current chunk holds. Softmax is per row, so chunking changes
    no number. With QK-norm or RoPE, q and k pass through hook points of their own
    (`q`, `k`, then `q_norm`/`k_norm`, then `q_rope`/`k_rope`): the traced sub-steps of attn.
    """

    def __init__(self, config: BlockConfig):
        super().__init__()
        hd = config.head_dim
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, hd
        parts = config.attention_parts
        self.causal, self.window, self.chunk = config.causal, config.sliding_window, parts.chunk
        self.scale, self.softcap = config.scale, parts.softcap
        self._projections(config)
        # Qwen3-Next's gated attention (Qiu et al. 2025): each head's output × sigmoid(gate_proj(x)), a sub-step
        self.gate_proj = nn.Linear(config.d_model, self.n_heads * hd, bias=config.projection_bias) \
            if config.attn_output_gate else None
        self.output_gate = HookPoint() if config.attn_output_gate else None
        self._query_and_key_stages(config)
        # gpt-oss: one learned logit per head, a column every query row's softmax includes and then drops
        self.sinks = nn.Parameter(torch.zeros(self.n_heads)) if parts.sinks else None
        self.scores = HookPoint()
        self.weights = HookPoint()
        self.query_chunk = None  # rows per chunk; None: as many as fit attention_chunk_bytes(device)
        self.rows = slice(0, 0)  # the query rows of the chunk being computed
        self.key_mask = None  # [B, T] bool, False at padding: those keys get no weight

    def _query_and_key_stages(self, config: BlockConfig) -> None:
        """What q and k pass between their projection and the scores (HeadPath): the QK-norm (before or after RoPE),
        RoPE and its hooks, Llama-4's query temperature; the hooks `q` and `k` as projected, where any stage follows."""
        hd = config.head_dim
        self.qk_norm = config.qk_norm  # the piece: its span and its place beside RoPE
        whole = self.qk_norm is not None and self.qk_norm.span is QKSpan.ALL_HEADS
        widths = (self.n_heads * hd, self.n_kv_heads * hd) if whole else (hd, hd)
        self.q_norm, self.k_norm = (RMSNorm(width, config.eps, config.norm_offset, config.norm_gain_float32,
                                            gain=self.qk_norm.gain) if self.qk_norm is not None else None
                                    for width in widths)
        self.rope = None
        if config.rope_theta is not None:
            self.rope = RotaryEmbedding(config.rotary_dims, config.rope_theta, config.rope_scaling,
                                        config.rope_interleaved)
            self.q_rope, self.k_rope = HookPoint(), HookPoint()
        else:
            self.q_rope = self.k_rope = None
        self.temperature = config.attention_parts.temperature
        if self.rope is not None or self.qk_norm is not None:
            self.q, self.k = HookPoint(), HookPoint()  # q and k as the projections give them
        else:
            self.q = self.k = None

    def _projections(self, config: BlockConfig) -> None:
        d, hd, qkv_bias = config.d_model, config.head_dim, config.projection_bias
        self.q_proj = nn.Linear(d, self.n_heads * hd, bias=qkv_bias)
        self.k_proj = nn.Linear(d, self.n_kv_heads * hd, bias=qkv_bias)  # fewer heads under grouped-query attention
        self.v_proj = nn.Linear(d, self.n_kv_heads * hd, bias=qkv_bias)
        self.out_proj = nn.Linear(self.n_heads * hd, d, bias=config.attention_bias)

    @property
    def substeps(self) -> tuple[str, ...]:
        """The traced sub-steps inside attn, in the order they are computed."""
        names = ("q", "k") if self.q is not None else ()
        norms = ("q_norm", "k_norm") if self.q_norm is not None else ()
        rotations = ("q_rope", "k_rope") if self.rope is not None else ()
        names += rotations + norms if self.qk_norm is not None and self.qk_norm.after_rope else norms + rotations
        return names + (("output_gate",) if self.output_gate is not None else ())

    def _split_heads(self, x: torch.Tensor, heads: Optional[int] = None) -> torch.Tensor:
        *lead, t, width = x.shape
        heads = heads or self.n_heads
        return x.view(*lead, t, heads, width // heads).transpose(-3, -2)  # [..., H, T, hd]

    def chunk_rows(self, q: torch.Tensor) -> int:
        t = q.shape[-2]
        if self.query_chunk:
            return min(self.query_chunk, t)
        bytes_per_row = q[..., 0, 0].numel() * t * q.element_size()  # one query row of every head
        return max(1, min(t, attention_chunk_bytes(q.device) // max(1, bytes_per_row)))

    def _mask(self, scores: torch.Tensor, rows: slice, t: int) -> None:
        """Masked logits get finfo.min, not -inf, as HF does: the weight is still exactly 0 and p·s stays finite."""
        lowest = torch.finfo(scores.dtype).min
        if self.causal:
            keys = torch.arange(t, device=scores.device)
            queries = torch.arange(rows.start, rows.stop, device=scores.device)
            hidden = keys[None, :] > queries[:, None]
            if self.window is not None:  # HF: key j is visible from query i when i - W < j <= i
                hidden |= keys[None, :] <= queries[:, None] - self.window
            if self.chunk is not None:  # Llama-4: only the keys of the query's own chunk
                hidden |= keys[None, :] // self.chunk != queries[:, None] // self.chunk
            scores.masked_fill_(hidden, lowest)
        if self.key_mask is not None:  # padding of a batch of different lengths
            scores.masked_fill_(~self.key_mask[:, None, None, :], lowest)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: slice) -> torch.Tensor:
        self.rows = rows
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(self.scale)  # [..., H, rows, T]
        if self.softcap is not None:  # Gemma-2: cap·tanh(s/cap), before the mask
            scores = torch.tanh(scores / self.softcap) * self.softcap  # out of place: tanh's backward needs its output
        self._mask(scores, rows, k.shape[-2])
        scores = self.scores(scores)
        if self.sinks is None:
            weights = torch.softmax(scores, dim=-1)
        else:  # HF's: the sink joins each row's softmax (shifted by the row's max), then its column is dropped
            sink = self.sinks.to(scores.dtype).view(-1, 1, 1).expand(*scores.shape[:-1], 1)
            combined = torch.cat((scores, sink), dim=-1)
            combined = combined - combined.max(dim=-1, keepdim=True).values
            weights = torch.softmax(combined, dim=-1)[..., :-1]
        return torch.matmul(self.weights(weights), v)  # [..., H, rows, hd]

    def _query_path(self) -> "HeadPath":
        return HeadPath(self.q_proj, self.n_heads, self.q, self.q_norm, self.q_rope, tempered=True)

    def _key_path(self) -> "HeadPath":
        return HeadPath(self.k_proj, self.n_kv_heads, self.k, self.k_norm, self.k_rope)

    def _heads(self, x: torch.Tensor, path: "HeadPath", rotation) -> torch.Tensor:
        """q or k: projected, split into heads, then QK-norm and RoPE where the block has them (a QK-norm over all
        heads reads the projection before the split)."""
        projected = path.proj(x)
        value = self._split_heads(projected, path.heads)
        if path.seen is not None:
            value = path.seen(value)
        norm = self.qk_norm
        if norm is not None and not norm.after_rope:
            value = (self._split_heads(path.norm(projected), path.heads) if norm.span is QKSpan.ALL_HEADS
                     else path.norm(value))
        if rotation is not None:
            value = path.rotated(self.rope.rotate(value, *rotation))
        if norm is not None and norm.after_rope:
            value = path.norm(value)
        if path.tempered and self.temperature is not None:
            value = self._temperature(value)
        return value

    def _temperature(self, q: torch.Tensor) -> torch.Tensor:
        """Llama-4's NoPE layers sharpen later queries: q × (1 + scale·ln(1 + ⌊(position + 1)/floor⌋)), as HF."""
        floor, scale = self.temperature.floor, self.temperature.scale
        positions = torch.arange(q.shape[-2], device=q.device).float()
        factors = torch.log1p(torch.floor((positions + 1.0) / floor)) * scale + 1.0
        return (q * factors[:, None]).to(q.dtype)

    def _queries_and_keys(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rotation = None
        if self.rope is not None:
            rotation = self.rope.cos_sin(x.shape[-2], x.device, self.q_proj.weight.dtype)
        return self._heads(x, self._query_path(), rotation), self._heads(x, self._key_path(), rotation)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v split into heads, [..., H, T, hd] (k and v with the key/value heads)."""
        q, k = self._queries_and_keys(x)
        return q, k, self._split_heads(self.v_proj(x), self.n_kv_heads)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._project(x)
        if self.n_kv_heads != self.n_heads:  # each key/value head serves n_heads / n_kv_heads query heads
            repeat = self.n_heads // self.n_kv_heads
            k, v = k.repeat_interleave(repeat, dim=-3), v.repeat_interleave(repeat, dim=-3)
        t, step = q.shape[-2], self.chunk_rows(q)
        parts = [self._attend(q[..., a : a + step, :], k, v, slice(a, min(a + step, t))) for a in range(0, t, step)]
        mixed = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)).transpose(-3, -2)  # [..., T, H, hd]
        mixed = mixed.reshape(*x.shape[:-1], self.n_heads * v.shape[-1])
        if self.gate_proj is not None:
            mixed = mixed * self.output_gate(torch.sigmoid(self.gate_proj(x)))
        return self.out_proj(mixed)


class LatentAttention(MultiHeadAttention):
    """DeepSeek's multi-head latent attention (its widths: config.LatentWidths), HF's DeepseekV2/V3Attention op for op: q from
    x, or from its own latent (q_a_proj, RMSNorm, q_b_proj); keys and values from one latent per token (kv_a_proj,
    RMSNorm, kv_b_proj), plus a rotated key every head shares. Sub-steps: `q_latent`, `q`, `kv_latent` (the compressed
    keys and values, what a cache keeps), `k` (each head's key before RoPE), `q_rope` and `k_rope` (the rotated dims
    after RoPE). Masking, chunking and the softmax are the parent's."""

    def _projections(self, config: BlockConfig) -> None:
        latent, d, h = config.latent, config.d_model, config.n_heads
        self.latent = latent
        if latent.q_rank is None:
            self.q_proj = nn.Linear(d, h * latent.head_dims, bias=False)
            self.q_latent = None
        else:
            self.q_a_proj = nn.Linear(d, latent.q_rank, bias=config.attention_bias)
            self.q_a_norm = RMSNorm(latent.q_rank, latent.latent_eps)
            self.q_b_proj = nn.Linear(latent.q_rank, h * latent.head_dims, bias=False)
            self.q_latent = HookPoint()
        self.kv_a_proj = nn.Linear(d, latent.kv_rank + latent.rope_dims, bias=config.attention_bias)
        self.kv_a_norm = RMSNorm(latent.kv_rank, latent.latent_eps)
        self.kv_b_proj = nn.Linear(latent.kv_rank, h * (latent.nope_dims + latent.value_dims), bias=False)
        self.kv_latent = HookPoint()
        self.out_proj = nn.Linear(h * latent.value_dims, d, bias=config.attention_bias)

    @property
    def substeps(self) -> tuple[str, ...]:
        return (("q_latent",) if self.q_latent is not None else ()) + ("q", "kv_latent", "k", "q_rope", "k_rope")

    def _queries(self, x: torch.Tensor) -> torch.Tensor:
        if self.latent.q_rank is None:
            return self._split_heads(self.q_proj(x))
        return self._split_heads(self.q_b_proj(self.q_latent(self.q_a_norm(self.q_a_proj(x)))))

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        nope, rope = self.latent.nope_dims, self.latent.rope_dims
        q = self.q(self._queries(x))  # [..., H, T, nope + rope]
        compressed, k_rot = self.kv_a_proj(x).split([self.latent.kv_rank, rope], dim=-1)
        kv = self._split_heads(self.kv_b_proj(self.kv_latent(self.kv_a_norm(compressed))))  # [..., H, T, nope + v]
        k_nope, v = kv.split([nope, self.latent.value_dims], dim=-1)
        k_rot = k_rot.unsqueeze(-3)  # [..., 1, T, rope]: one rotated key for every head
        if self.k.watched:  # the key before RoPE, as HF's layer holds it: one [H, T, nope + rope] copy, only if seen
            self.k(torch.cat((k_nope, k_rot.expand(*k_nope.shape[:-1], rope)), dim=-1))
        cos, sin = self.rope.cos_sin(x.shape[-2], x.device, self.kv_a_proj.weight.dtype)
        q_pass, q_rot = q.split([nope, rope], dim=-1)
        q_rot = self.q_rope(self.rope.rotate(q_rot, cos, sin))
        k_rot = self.k_rope(self.rope.rotate(k_rot, cos, sin))
        return torch.cat((q_pass, q_rot), dim=-1), torch.cat((k_nope, k_rot.expand(*k_nope.shape[:-1], rope)), -1), v


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


class GatedFFN(nn.Module):
    """down(act(gate(x)) · up(x)): SwiGLU with SiLU (Shazeer 2020, "GLU Variants Improve
    Transformer"), GeGLU with GPT-2's tanh GELU (Gemma)."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.up = nn.Linear(config.d_model, config.d_ff, bias=config.bias)
        self.act = _activation(config.ffn)
        self.hidden = HookPoint()
        self.down = nn.Linear(config.d_ff, config.d_model, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.hidden(self.act(self.gate(x)) * self.up(x)))


class XIELU(nn.Module):
    """xIELU (Huang & Schlag 2024), as HF's XIELUActivation computes it without its CUDA kernel: αp·x² + β·x for
    x > 0, (expm1(min(x, ε)) − x)·αn + β·x otherwise, αp = softplus(alpha_p), αn = β + softplus(alpha_n). Its two
    learned scalars and the constants β, ε are tensors of the checkpoint; initialised as HF's (αp = αn = 0.8)."""

    def __init__(self, alpha_p: float = 0.8, alpha_n: float = 0.8, beta: float = 0.5, eps: float = -1e-6):
        super().__init__()
        self.alpha_p = nn.Parameter(torch.log(torch.expm1(torch.tensor(alpha_p))).unsqueeze(0))
        self.alpha_n = nn.Parameter(torch.log(torch.expm1(torch.tensor(alpha_n - beta))).unsqueeze(0))
        self.register_buffer("beta", torch.tensor(beta))
        self.register_buffer("eps", torch.tensor(eps))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.min(x, self.eps)) - x) * alpha_n + self.beta * x)


class ReLUSquared(nn.Module):
    """max(0, x)², as HF's ReLUSquaredActivation (relu, then square)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.square(F.relu(x))


def _activation(kind: FFNKind) -> nn.Module:
    if kind is FFNKind.XIELU:
        return XIELU()
    if kind is FFNKind.RELU:
        return nn.ReLU()
    if kind is FFNKind.RELU2:
        return ReLUSquared()
    if kind is FFNKind.SWIGLU:
        return nn.SiLU()
    if kind in (FFNKind.GELU_TANH, FFNKind.GEGLU):
        return nn.GELU(approximate="tanh")
    return nn.GELU()  # exact: GELU, GEGLU_EXACT


class ClampedGatedFFN(GatedFFN):
    """gpt-oss's experts: g = min(gate(x), L), u = clamp(up(x), -L, L), down((u + 1) · g·sigmoid(α·g))."""

    def __init__(self, config: BlockConfig):
        super().__init__(config)
        self.limit, self.alpha = config.glu_clamp.limit, config.glu_clamp.alpha
        self.act = nn.Identity()  # its gate's activation is written out in forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate(x).clamp(max=self.limit)
        up = self.up(x).clamp(min=-self.limit, max=self.limit)
        return self.down(self.hidden((up + 1) * (gate * torch.sigmoid(gate * self.alpha))))


def gated_ffn(config: BlockConfig) -> GatedFFN:
    return ClampedGatedFFN(config) if config.ffn is FFNKind.SWIGLU_CLAMPED else GatedFFN(config)


def make_ffn(config: BlockConfig) -> nn.Module:
    return gated_ffn(config) if config.ffn.gated else MLP(config)
