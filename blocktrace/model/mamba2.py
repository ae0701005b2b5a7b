"""A token mixer without attention: Mamba-2's selective state space (config.Mamba2), HF's GraniteMoeHybridMambaLayer
op for op, its chunked scan included (mamba2_chunk_scan, the state-space-duality form HF runs over a prompt), so the
numbers are HF's. It fills the block's `attn` step; what it computes inside are its own sub-steps: `z` (the gate),
`x`, `b` and `c` (after the causal convolution and SiLU), `dt` (each head's step size Δ), `decay` (Δ·A ≤ 0: the state
is multiplied by exp(Δ·A) at each token), `scan` (what the state read gives, D·x included) and `gated` (after the
gate and the grouped norm). It has no attention weights: no attention diagnostics."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.mixer import RecurrentMixer, causal_conv



class GroupedGatedRMSNorm(nn.Module):
    """HF's GraniteMoeHybridRMSNormGated (norm after the gate): x · SiLU(z) in float32, RMS-normalised per group of
    channels, times the gain in the input's dtype."""

    def __init__(self, width: int, groups: int, eps: float):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        gated = x.float() * F.silu(gate.float())
        grouped = gated.view(*gated.shape[:-1], self.groups, -1)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * grouped.view(gated.shape).to(x.dtype)


class Mamba2(RecurrentMixer):
    """out_proj(norm(scan(x, Δ, B, C) + D·x, z)), where in_proj(h) = [z, x B C, dt] and x B C pass conv and SiLU."""

    SUBSTEPS = ("z", "x", "b", "c", "dt", "decay", "scan", "gated")
    LABEL = "Mamba2[{heads} heads, state {state_dims}, conv {kernel}]"

    def __init__(self, config: BlockConfig):
        super().__init__()
        spec, d = config.token_mixer, config.d_model
        self.spec = spec
        self.conv_width = spec.inner + 2 * spec.groups * spec.state_dims
        self.in_proj = nn.Linear(d, spec.inner + self.conv_width + spec.heads, bias=spec.bias)
        self.conv = nn.Conv1d(self.conv_width, self.conv_width, spec.kernel, groups=self.conv_width,
                              bias=spec.conv_bias, padding=spec.kernel - 1)
        self.dt_bias = nn.Parameter(torch.ones(spec.heads))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, spec.heads + 1, dtype=torch.float32)))  # HF's init
        self.D = nn.Parameter(torch.ones(spec.heads))
        self.norm = GroupedGatedRMSNorm(spec.inner, spec.groups, config.eps)
        self.out_proj = nn.Linear(spec.inner, d, bias=spec.bias)

    @staticmethod
    def operations(config: BlockConfig) -> dict[str, str]:
        k = config.token_mixer.kernel
        conv = f"SiLU(CausalConv[{k}](in_proj(x_in)))"
        return {"attn.z": "z = in_proj(x_in)  (the gate)", "attn.x": f"x = {conv}", "attn.b": f"B = {conv}",
                "attn.c": f"C = {conv}", "attn.dt": "Δ = softplus(in_proj(x_in) + dt_bias)  (per head)",
                "attn.decay": "Δ·A,  A = −exp(A_log)  (state × exp(Δ·A) per token)",
                "attn.scan": "y = Cᵀh + D·x,  h ← exp(Δ·A)·h + Δ·x Bᵀ",
                "attn.gated": "RMSNorm(y · SiLU(z)) per group  (attn_out = out_proj of it)"}

    def mix(self, h: torch.Tensor, unbatched: bool) -> torch.Tensor:
        dtype, spec = h.dtype, self.spec
        h = self.masked(h)  # HF's apply_mask_to_padding_states, before the projection and after the convolution
        z, xbc, dt = self.in_proj(h).split([spec.inner, self.conv_width, spec.heads], dim=-1)
        x, b, c = self.masked(self._convolved(xbc)).split(
            [spec.inner, spec.groups * spec.state_dims, spec.groups * spec.state_dims], dim=-1)
        step = torch.clamp(F.softplus(dt + self.dt_bias.to(dt.dtype)), *spec.step_limit)
        decay = -torch.exp(self.A_log.float()) * step.float()
        for name, value in {"z": z, "x": x, "b": b, "c": c, "dt": step, "decay": decay}.items():
            self.seen(name, value, unbatched)
        lead = h.shape[:2]
        scanned = chunk_scan(x.view(*lead, spec.heads, spec.head_dims), step, decay,
                             b.view(*lead, spec.groups, spec.state_dims), c.view(*lead, spec.groups, spec.state_dims),
                             self.D, spec.chunk).reshape(*lead, spec.inner)
        self.seen("scan", scanned, unbatched)
        gated = self.seen("gated", self.norm(scanned, z), unbatched)
        return self.out_proj(gated.to(dtype))

    def _convolved(self, xbc: torch.Tensor) -> torch.Tensor:
        """HF's causal_conv1d_fn with SiLU over [x, B, C]: the activation in the filter's dtype, cast back after it."""
        return F.silu(causal_conv(xbc.transpose(1, 2), self.conv)).to(xbc.dtype).transpose(1, 2)


def _segment_sum(values: torch.Tensor) -> torch.Tensor:
    """[..., L] → [..., L, L]: entry (i, j) the sum of values[j + 1 .. i] for j ≤ i, −inf above the diagonal (HF's
    segment_sum, cumulative sums under masks: no subtraction of large partial sums)."""
    length = values.size(-1)
    values = values[..., None].expand(*values.size(), length)
    below = torch.tril(torch.ones(length, length, device=values.device, dtype=torch.bool), diagonal=-1)
    summed = torch.cumsum(values.masked_fill(~below, 0), dim=-2)
    on_or_below = torch.tril(torch.ones(length, length, device=values.device, dtype=torch.bool), diagonal=0)
    return summed.masked_fill(~on_or_below, -torch.inf)


def _chunked(x: torch.Tensor, pad: int, chunk: int) -> torch.Tensor:
    """[B, T, ...] padded with zeros to a whole number of chunks, as [B, chunks, chunk, ...]."""
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
    return x.reshape(x.shape[0], -1, chunk, *x.shape[2:])


def chunk_scan(x: torch.Tensor, step: torch.Tensor, decay: torch.Tensor, b: torch.Tensor, c: torch.Tensor,
               skip: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mamba-2's scan from a zero state, as HF's mamba2_chunk_scan computes it (the same operations in the same
    order, so the same numbers): within a chunk the outputs are a masked product C·Bᵀ over positions, across chunks
    the states carry. x [B, T, H, P], step Δ and decay Δ·A [B, T, H], b and c [B, T, G, N], skip D [H]; returns
    y [B, T, H, P] in float32 (D·x included). Equal, to rounding, to the token-by-token recurrence
    (tests/test_granitemoehybrid.py holds it to a naive loop)."""
    batch, tokens, heads, _ = x.shape
    per_group = heads // b.shape[2]
    x = x.float()
    b = b.float().repeat_interleave(per_group, dim=2, output_size=heads)
    c = c.float().repeat_interleave(per_group, dim=2, output_size=heads)
    pad = (chunk - tokens % chunk) % chunk
    residual = skip[..., None] * F.pad(x, (0, 0, 0, 0, 0, pad))
    x = x * step[..., None].float()
    x, decay, b, c = (_chunked(t, pad, chunk) for t in (x, decay, b, c))
    decay = decay.permute(0, 3, 1, 2)  # [B, H, chunks, L]
    cumulative = torch.cumsum(decay, dim=-1)
    within = torch.einsum("bclhn,bcshn->bclsh", c, b) * torch.exp(_segment_sum(decay)).permute(0, 2, 3, 4, 1)
    y_within = torch.einsum("bclsh,bcshp->bclhp", within, x)
    decay_to_end = torch.exp(cumulative[:, :, :, -1:] - cumulative)
    states = torch.einsum("bclhn,bclhp->bchpn", b * decay_to_end.permute(0, -2, -1, 1)[..., None], x)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    across = torch.exp(_segment_sum(F.pad(cumulative[:, :, :, -1], (1, 0)))).transpose(1, 3)
    states = torch.einsum("bzch,bzhpn->bchpn", across, states)[:, :-1]
    y_across = torch.einsum("bclhn,bchpn->bclhp", c, states) * torch.exp(cumulative).permute(0, 2, 3, 1)[..., None]
    y = (y_within + y_across).contiguous().reshape(batch, -1, heads, x.shape[-1]) + residual
    return y[:, :tokens]
