"""What a block really does, measured rather than assumed from its class or its settings.

- Causality: perturb the last token; in a causal block no earlier output may move. A leak
  found this way is a fact about the computation, whatever mask the code claims to apply.
- Each norm: feed it tokens scaled (and shifted) by different amounts. A norm that
  normalises each token is blind to the scaling; LayerNorm is blind to the shift too, RMSNorm
  is not. The effective gain — g for LayerNorm and RMSNorm, (1 + w) for Gemma's — is read off
  the difference of two outputs, so gains near zero in some dimensions (trained LayerNorms have
  them) and the norm's bias change nothing.

Both use a few extra calls on small inputs after the traced forward (checks=True only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from blocktrace.vocab import Choice

PROBE_TOKENS, PROBE_SEED = 8, 1234


class NormKind(Choice):
    LAYERNORM = "layernorm"  # scales and centres each token
    RMSNORM = "rmsnorm"  # scales each token, no centring
    NONE = "none"  # does not normalise each token


@dataclass(frozen=True)
class NormBehaviour:
    kind: NormKind
    scale_error: float  # relative change of the output when each token is rescaled (0 for a norm)
    shift_error: float  # ... when a constant is added to each token (0 for LayerNorm)
    gain_rms: Optional[float]  # rms of the effective per-dimension gain

    def to_probe(self) -> dict:
        return {"norm_kind": self.kind, "scale_error": self.scale_error, "shift_error": self.shift_error,
                "gain_rms": self.gain_rms}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.double().pow(2).mean().sqrt().clamp_min(1e-30)
    return float((a.double() - b.double()).pow(2).mean().sqrt() / scale)


def _tolerance(dtype: torch.dtype) -> float:
    return max(1e-2, 16 * torch.finfo(dtype).eps)


def _reference(x: torch.Tensor, centre: bool) -> torch.Tensor:
    x = x.double()
    if centre:
        x = x - x.mean(-1, keepdim=True)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


@torch.no_grad()
def measure_norm(module: nn.Module, width: int) -> Optional[NormBehaviour]:
    """How `module` treats tokens of `width` features; None when it cannot be called on them."""
    parameter = next(module.parameters(), None)
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    device = parameter.device if parameter is not None else torch.device("cpu")
    generator = torch.Generator().manual_seed(PROBE_SEED)
    x = (torch.randn(1, PROBE_TOKENS, width, generator=generator) * 2 + 0.5).to(device, dtype)
    other = (torch.randn(1, PROBE_TOKENS, width, generator=generator) * 2 - 0.5).to(device, dtype)
    scale = torch.empty(1, PROBE_TOKENS, 1).uniform_(0.5, 4.0, generator=generator).to(device, dtype)
    shift = (torch.randn(1, PROBE_TOKENS, 1, generator=generator) * 3).to(device, dtype)
    try:
        y, y_scaled, y_shifted, y_other = (module(value) for value in (x, x * scale, x + shift, other))
    except Exception:  # not a plain [.., d] -> [.., d] module: the behaviour cannot be measured
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return None
    tolerance = _tolerance(dtype)
    scale_error, shift_error = _relative(y_scaled, y), _relative(y_shifted, y)
    if scale_error > tolerance:
        return NormBehaviour(NormKind.NONE, scale_error, shift_error, None)
    centres = shift_error <= tolerance
    kind = NormKind.LAYERNORM if centres else NormKind.RMSNORM
    delta_in = _reference(x, centres) - _reference(other, centres)
    gain = (y.double() - y_other.double()).pow(2).mean().sqrt() / delta_in.pow(2).mean().sqrt().clamp_min(1e-30)
    return NormBehaviour(kind, scale_error, shift_error, float(gain))


@dataclass(frozen=True)
class CausalBehaviour:
    causal: Optional[bool]  # None: fewer than two tokens, nothing to measure
    leak: float  # largest relative change of an earlier output when the last token is perturbed


@torch.no_grad()
def measure_causality(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                      output: torch.Tensor) -> CausalBehaviour:
    """Perturb the last token of x; compare the outputs at every earlier position with `output`."""
    if x.shape[-2] < 2:
        return CausalBehaviour(None, 0.0)
    generator = torch.Generator().manual_seed(PROBE_SEED)
    noise = torch.randn(x.shape[:-2] + x.shape[-1:], generator=generator).to(x.device, x.dtype)
    perturbed = x.clone()
    perturbed[..., -1, :] += noise * x.float().pow(2).mean().sqrt().clamp_min(1.0).to(x.dtype)
    moved = forward(perturbed)
    earlier, before = moved[..., :-1, :], output[..., :-1, :]
    leak = _relative(earlier, before) if before.numel() else 0.0
    return CausalBehaviour(leak <= _tolerance(x.dtype) * 1e-2, leak)
