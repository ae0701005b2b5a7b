"""Rotary position embeddings (Su et al. 2021) in HF Llama's convention, and the ways models
stretch them past the context they were trained on (config.RopeScaling).

A linear scaling divides the frequencies (the same as dividing the positions, as HF does it).

Each variant computes its inverse frequencies as transformers' modeling_rope_utils does, in
float32, op for op: a last-bit difference in a frequency becomes a visible one in the angle at
position 100k. Dynamic and longrope frequencies depend on the sequence length T (HF: the largest
position + 1), so they are computed per call; the others once.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from blocktrace.config import RopeScaling
from blocktrace.vocab import RopeKind


# The frequencies are computed on the CPU whatever device a block is built on: under the loader's meta device they
# would be meta tensors (2 ms a layer of meta decompositions at Llama-3's 3B), and would have to be rebuilt
HOST = torch.device("cpu")


def _base_exponents(dims: int) -> torch.Tensor:
    """2i/dims for each frequency i, as HF builds them (int64 arange, then float32)."""
    return torch.arange(0, dims, 2, dtype=torch.int64, device=HOST).float() / dims


def default_frequencies(dims: int, theta) -> torch.Tensor:
    return 1.0 / (theta ** _base_exponents(dims))


def llama3_frequencies(dims: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1: wavelengths longer than original/low_freq_factor are divided by the factor, shorter than
    original/high_freq_factor kept, and those between blended smoothly."""
    inv_freq = default_frequencies(dims, theta)
    context = scaling.original_positions
    low_wavelength, high_wavelength = context / scaling.low_freq_factor, context / scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = torch.where(wavelength > low_wavelength, inv_freq / scaling.factor, inv_freq)
    smooth = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelength < high_wavelength) * ~(wavelength > low_wavelength)
    return torch.where(medium, smoothed, scaled)


def yarn_frequencies(dims: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """YaRN (Peng et al. 2023): frequencies that turn fewer than beta_slow times within the original context are
    interpolated (divided by the factor), more than beta_fast times kept, a linear ramp between."""
    def correction_dim(rotations: float) -> float:
        return (dims * math.log(scaling.original_positions / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dims - 1)
    if low == high:
        high += 0.001  # HF: no zero-width ramp
    ramp = torch.clamp((torch.arange(dims // 2, dtype=torch.float32, device=HOST) - low) / (high - low), 0, 1)
    positional = theta ** (torch.arange(0, dims, 2, device=HOST).float() / dims)
    extrapolated = 1 - ramp
    return (1.0 / (scaling.factor * positional)) * (1 - extrapolated) + (1.0 / positional) * extrapolated


def longrope_frequencies(dims: int, theta: float, scaling: RopeScaling, t: int) -> torch.Tensor:
    """LongRoPE (Phi-3): each frequency divided by its own factor, the long set once T passes the original
    context, the short set within it."""
    factors = scaling.long_factor if t > scaling.original_positions else scaling.short_factor
    return 1.0 / (torch.tensor(factors, dtype=torch.float32, device=HOST) * theta ** _base_exponents(dims))


def dynamic_frequencies(dims: int, theta: float, scaling: RopeScaling, t: int) -> torch.Tensor:
    """Dynamic NTK scaling: past max_position_embeddings the base grows to
    θ·(factor·T/max − (factor − 1))^(dims/(dims−2)); within it, plain RoPE."""
    if t <= scaling.original_positions:
        return default_frequencies(dims, theta)
    length = torch.tensor(t, device=HOST)  # HF computes the new base from a tensor length: in float32
    base = theta * ((scaling.factor * length / scaling.original_positions) - (scaling.factor - 1)) \
        ** (dims / (dims - 2))
    return default_frequencies(dims, base)


class RotaryEmbedding(nn.Module):
    """The two halves of the rotated dims are turned by angle position · frequency. `dims` may be
    fewer than the head's (partial rotary, GPT-NeoX): the rest pass unchanged. A scaling changes the
    frequencies, and yarn and longrope scale cos and sin too."""

    def __init__(self, dims: int, theta: float, scaling: Optional[RopeScaling] = None, interleaved: bool = False):
        super().__init__()
        self.dims, self.theta, self.scaling = dims, theta, scaling
        self.interleaved = interleaved  # pairs (x0, x1), (x2, x3)… as Cohere turns them; else (x_i, x_i+dims/2)
        self.register_buffer("inv_freq", self._fixed_frequencies(), persistent=False)

    @property
    def kind(self) -> Optional[RopeKind]:
        return self.scaling.kind if self.scaling is not None else None

    def _fixed_frequencies(self) -> torch.Tensor:
        """The frequencies that do not depend on the length (for dynamic and longrope: those within the context)."""
        if self.kind is RopeKind.LLAMA3:
            return llama3_frequencies(self.dims, self.theta, self.scaling)
        if self.kind is RopeKind.YARN:
            return yarn_frequencies(self.dims, self.theta, self.scaling)
        if self.kind is RopeKind.LONGROPE:
            return longrope_frequencies(self.dims, self.theta, self.scaling, 0)
        if self.kind is RopeKind.LINEAR:  # HF divides the frequencies (position interpolation's positions / factor)
            return default_frequencies(self.dims, self.theta) / self.scaling.factor
        return default_frequencies(self.dims, self.theta)

    def frequencies(self, t: int) -> torch.Tensor:
        if self.kind is RopeKind.DYNAMIC:
            return dynamic_frequencies(self.dims, self.theta, self.scaling, t)
        if self.kind is RopeKind.LONGROPE and t > self.scaling.original_positions:
            return longrope_frequencies(self.dims, self.theta, self.scaling, t)
        return self.inv_freq

    def _apply(self, fn, recurse=True):
        """Moves follow the block; casts do not: the frequencies stay float32 in a bf16 or fp16 block, as HF
        keeps them (rounded to bf16, a head of 128 dims turns by up to 1.2 radians too far or too little at
        position 1000)."""
        exact = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = exact.to(self.inv_freq.device)
        return self

    def cos_sin(self, t: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(t, device=device, dtype=torch.float)
        angles = positions[:, None] * self.frequencies(t).to(device)[None, :]
        # [T, dims]: each angle for both members of its pair, side by side (interleaved) or one half apart
        both = angles.repeat_interleave(2, dim=-1) if self.interleaved else torch.cat((angles, angles), dim=-1)
        cos, sin = both.cos(), both.sin()
        if self.scaling is not None and self.scaling.attention_factor != 1.0:
            cos, sin = cos * self.scaling.attention_factor, sin * self.scaling.attention_factor
        return cos.to(dtype), sin.to(dtype)

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        turned, passed = x[..., : self.dims], x[..., self.dims:]
        if self.interleaved:  # Cohere's rotate_half: (x0, x1) -> (-x1, x0) for each adjacent pair, in float32 as HF
            wide = turned.float()
            rotated_half = torch.stack((-wide[..., 1::2], wide[..., ::2]), dim=-1).flatten(-2)
            turned = (wide * cos + rotated_half * sin).to(x.dtype)
        else:
            half = self.dims // 2
            rotated_half = torch.cat((-turned[..., half:], turned[..., :half]), dim=-1)
            turned = turned * cos + rotated_half * sin
        return turned if passed.shape[-1] == 0 else torch.cat((turned, passed), dim=-1)
