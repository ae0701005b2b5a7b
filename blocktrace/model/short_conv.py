"""A token mixer without attention: LFM2's gated short convolution (config.ShortConvolution), HF's Lfm2ShortConv op
for op. It fills the block's `attn` step, so every command traces it as it traces attention; what it computes inside
are its own sub-steps: `b`, `c` and `x` (the three streams in_proj makes), `gated` (B ⊙ x, what the convolution
reads) and `convolved` (the causal depthwise convolution of it). It has no attention weights: no attention diagnostics."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.layers import HookPoint

SUBSTEPS = ("b", "c", "x", "gated", "convolved")


class ShortConvolution(nn.Module):
    """out_proj(C ⊙ conv(B ⊙ x)), where in_proj(h) = [B, C, x] and conv sees each channel's last `kernel` tokens."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        d, spec = config.d_model, config.token_mixer
        self.kernel = spec.kernel
        self.in_proj = nn.Linear(d, 3 * d, bias=spec.bias)
        # HF's nn.Conv1d(d, d, kernel, groups=d): one filter of `kernel` taps per channel, stored [d, 1, kernel]
        self.conv = nn.Conv1d(d, d, spec.kernel, groups=d, bias=spec.bias, padding=spec.kernel - 1)
        self.out_proj = nn.Linear(d, d, bias=spec.bias)
        for name in SUBSTEPS:
            self.add_module(name, HookPoint())
        self.key_mask: Optional[torch.Tensor] = None  # [B, T] bool, False at padding: those tokens are zeroed first
        self.query_chunk: Optional[int] = None  # attention's setting, held so the block sets both alike: unused here

    @property
    def substeps(self) -> tuple[str, ...]:
        return SUBSTEPS

    @staticmethod
    def label(spec) -> str:
        """The operation the attn step's row names."""
        return f"ShortConv[{spec.kernel} tokens]"

    @staticmethod
    def operations(config: BlockConfig) -> dict[str, str]:
        """The sub-steps' formulas: the three streams, their gated product, its causal convolution."""
        k = config.token_mixer.kernel
        return {"attn.b": "B = in_proj(x_in)[:d]  (the input gate)",
                "attn.c": "C = in_proj(x_in)[d:2d]  (the output gate)", "attn.x": "x = in_proj(x_in)[2d:]",
                "attn.gated": "B ⊙ x",
                "attn.convolved": f"conv = CausalConv[{k}](B ⊙ x)  (per channel; attn_out = out_proj(C ⊙ conv))"}

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [T, d] or [B, T, d]
        unbatched = h.dim() == 2
        if unbatched:
            h = h.unsqueeze(0)
        if self.key_mask is not None:  # HF's apply_mask_to_padding_states: padding reaches no later token
            h = (h * self.key_mask[:, :, None]).to(h.dtype)
        streams = self.in_proj(h).transpose(-1, -2)  # [B, 3d, T], as HF
        b, c, x = (self._seen(name, part, unbatched) for name, part in zip(("b", "c", "x"), streams.chunk(3, dim=-2)))
        gated = self._seen("gated", b * x, unbatched)
        t = gated.shape[-1]
        weight = self.conv.weight  # HF's causal_conv1d_fn: the same Conv1d, padded on both sides, the first T kept
        mixed = F.conv1d(gated.to(weight.dtype), weight, self.conv.bias, padding=self.kernel - 1,
                         groups=gated.shape[-2])[..., :t].to(gated.dtype)
        y = (c * self._seen("convolved", mixed, unbatched)).transpose(-1, -2).contiguous()
        out = self.out_proj(y)
        return out.squeeze(0) if unbatched else out

    def _seen(self, name: str, value: torch.Tensor, unbatched: bool) -> torch.Tensor:
        """A sub-step, [B, d, T] inside, seen token-major as every other step ([T, d] or [B, T, d]); the value
        computed on is the one HF computes on, whatever a hook returns."""
        hook = self._modules[name]
        if hook.watched:
            seen = value.transpose(-1, -2)
            hook(seen.squeeze(0) if unbatched else seen)
        return value
