"""A token mixer without attention: LFM2's gated short convolution (config.ShortConvolution), HF's Lfm2ShortConv op
for op. It fills the block's `attn` step, so every command traces it as it traces attention; what it computes inside
are its own sub-steps: `b`, `c` and `x` (the three streams in_proj makes), `gated` (B ⊙ x, what the convolution
reads) and `convolved` (the causal depthwise convolution of it). It has no attention weights: no attention diagnostics."""

from __future__ import annotations

import torch
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.mixer import RecurrentMixer, causal_conv


class ShortConvolution(RecurrentMixer):
    """out_proj(C ⊙ conv(B ⊙ x)), where in_proj(h) = [B, C, x] and conv sees each channel's last `kernel` tokens."""

    SUBSTEPS = ("b", "c", "x", "gated", "convolved")
    LABEL = "ShortConv[{kernel} tokens]"

    def __init__(self, config: BlockConfig):
        super().__init__()
        d, spec = config.d_model, config.token_mixer
        self.kernel = spec.kernel
        self.in_proj = nn.Linear(d, 3 * d, bias=spec.bias)
        # HF's nn.Conv1d(d, d, kernel, groups=d): one filter of `kernel` taps per channel, stored [d, 1, kernel]
        self.conv = nn.Conv1d(d, d, spec.kernel, groups=d, bias=spec.bias, padding=spec.kernel - 1)
        self.out_proj = nn.Linear(d, d, bias=spec.bias)

    @staticmethod
    def operations(config: BlockConfig) -> dict[str, str]:
        """The sub-steps' formulas: the three streams, their gated product, its causal convolution."""
        k = config.token_mixer.kernel
        return {"attn.b": "B = in_proj(x_in)[:d]  (the input gate)",
                "attn.c": "C = in_proj(x_in)[d:2d]  (the output gate)", "attn.x": "x = in_proj(x_in)[2d:]",
                "attn.gated": "B ⊙ x",
                "attn.convolved": f"conv = CausalConv[{k}](B ⊙ x)  (per channel; attn_out = out_proj(C ⊙ conv))"}

    def mix(self, h: torch.Tensor, unbatched: bool) -> torch.Tensor:
        streams = self.in_proj(self.masked(h)).transpose(-1, -2)  # [B, 3d, T], as HF
        b, c, x = (self.seen(name, part, unbatched, channels_first=True)
                   for name, part in zip(("b", "c", "x"), streams.chunk(3, dim=-2)))
        gated = self.seen("gated", b * x, unbatched, channels_first=True)
        mixed = causal_conv(gated, self.conv).to(gated.dtype)
        y = (c * self.seen("convolved", mixed, unbatched, channels_first=True)).transpose(-1, -2).contiguous()
        return self.out_proj(y)
