"""What the token mixers without attention weights share (model/short_conv.py, gated_delta.py, mamba2.py): their
sub-steps' hook points, the row's label, the padding mask and chunk setting the block gives every mixer, inputs with or without a
batch dimension, and the causal depthwise convolution each runs as HF's causal_conv1d_fn computes it."""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.layers import HookPoint


class RecurrentMixer(nn.Module):
    """A token mixer that fills the `attn` step without attention weights. A subclass names its sub-steps in
    SUBSTEPS and computes in `mix` on [B, T, d]."""

    SUBSTEPS: tuple[str, ...] = ()
    LABEL = ""  # the operation the attn step's row names, formatted with the mixer's spec's fields

    def __init__(self):
        super().__init__()
        for name in self.SUBSTEPS:
            self.add_module(name, HookPoint())
        self.key_mask: Optional[torch.Tensor] = None  # [B, T] bool, False at padding: those tokens are zeroed
        self.query_chunk: Optional[int] = None  # attention's setting, held so the block sets both alike: unused here

    @property
    def substeps(self) -> tuple[str, ...]:
        return self.SUBSTEPS

    @classmethod
    def label(cls, spec) -> str:
        return cls.LABEL.format_map(dataclasses.asdict(spec))

    @staticmethod
    def operations(config: BlockConfig) -> dict[str, str]:
        """The sub-steps' formulas, in the order they are computed."""
        raise NotImplementedError

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # [T, d] or [B, T, d]
        unbatched = h.dim() == 2
        out = self.mix(h.unsqueeze(0) if unbatched else h, unbatched)
        return out.squeeze(0) if unbatched else out

    def mix(self, h: torch.Tensor, unbatched: bool) -> torch.Tensor:
        raise NotImplementedError

    def masked(self, h: torch.Tensor) -> torch.Tensor:
        """HF's apply_mask_to_padding_states: padded tokens zeroed, so that they reach no later token."""
        return h if self.key_mask is None else (h * self.key_mask[:, :, None]).to(h.dtype)

    def seen(self, name: str, value: torch.Tensor, unbatched: bool, channels_first: bool = False) -> torch.Tensor:
        """A sub-step ([B, T, width], or [B, width, T] channels first), seen token-major as every other step
        ([T, width] or [B, T, width]); the value computed on is the one HF computes on, whatever a hook returns."""
        hook = self._modules[name]
        if hook.watched:
            shown = value.transpose(-1, -2) if channels_first else value
            hook(shown.squeeze(0) if unbatched else shown)
        return value


def causal_conv(channels: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """HF's causal_conv1d_fn (without its activation): one causal filter per channel of [B, C, T], computed in the
    filter's dtype, padded on both sides and the first T outputs kept; returned in the filter's dtype."""
    weight = conv.weight
    return F.conv1d(channels.to(weight.dtype), weight, conv.bias, padding=weight.shape[-1] - 1,
                    groups=channels.shape[-2])[..., :channels.shape[-1]]
