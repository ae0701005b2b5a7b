"""What a block really does, measured rather than assumed from its class or its settings.

- Causality: perturb the last token; in a causal block no earlier output may move. A leak
  found this way is a fact about the computation, whatever mask the code claims to apply.
- Each norm: feed it tokens scaled (and shifted) by different amounts. A norm that
  normalises each token is blind to the scaling; LayerNorm is blind to the shift too, RMSNorm
  is not. The effective gain — g for LayerNorm and RMSNorm, (1 + w) for Gemma's — is read off
  the difference of two outputs, so gains near zero in some dimensions (trained LayerNorms have
  them) and the norm's bias change nothing.
- Each norm's backward: a function blind to a direction has no derivative along it, so the
  gradient a norm passes back has no component along the token itself (Euler's theorem for a
  function of degree 0) and, for LayerNorm, none along (1, …, 1). Statistics detached from the
  graph (`x.var().detach()`) or a hand-written backward keep the forward and break this: the
  forward probe cannot see them, training can.

Both use a few extra calls on small inputs after the traced forward (checks=True only). They
return measurements as device tensors; what they mean (a kind of norm, causal or not) is decided
once the trace has copied them to the host (`probe`).
"""

from __future__ import annotations

import functools
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
class NormBehaviour:  # what a NormMeasurement means
    kind: NormKind
    scale_error: float  # relative change of the output when each token is rescaled (0 for a norm)
    shift_error: float  # ... when a constant is added to each token (0 for LayerNorm)
    gain_rms: Optional[float]  # rms of the effective per-dimension gain
    # the largest |cosine| of a token's input gradient with a direction the forward is blind to (the token; for
    # LayerNorm also (1, …, 1)): 0 for a norm whose backward is its forward's derivative; None: not measured
    gradient_error: Optional[float] = None
    tolerance: float = 1e-2  # what the probe's rounding allows in its dtype, for every error above

    @property
    def backward_broken(self) -> bool:
        """Whether the measured gradient leans along a direction the norm ignores by more than rounding."""
        return self.gradient_error is not None and self.gradient_error > self.tolerance


@dataclass(frozen=True)
class CausalBehaviour:  # what a CausalMeasurement means
    causal: Optional[bool]  # None: fewer than two tokens, nothing to measure
    leak: float  # largest relative change of an earlier output when the last token is perturbed


def _relative(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    scale = b.double().pow(2).mean().sqrt().clamp_min(1e-30)
    return (a.double() - b.double()).pow(2).mean().sqrt() / scale


def _tolerance(dtype: torch.dtype) -> float:
    return max(1e-2, 16 * torch.finfo(dtype).eps)


def _reference(x: torch.Tensor, centre: bool) -> torch.Tensor:
    x = x.double()
    if centre:
        x = x - x.mean(-1, keepdim=True)
    return x / x.pow(2).mean(-1, keepdim=True).sqrt()


@dataclass(frozen=True)
class NormMeasurement:
    """A norm's outputs on the probe inputs, reduced to three device scalars until the trace's copy."""

    scale_error: torch.Tensor
    shift_error: torch.Tensor
    gains: tuple[torch.Tensor, torch.Tensor]  # the effective gain if the norm centres (LayerNorm), if not (RMSNorm)
    tolerance: float
    # the backward's components along the scale and the shift directions (None: no backward to measure)
    gradient: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def values(self) -> dict:
        return {"scale_error": self.scale_error, "shift_error": self.shift_error, "gains": list(self.gains),
                "gradient": None if self.gradient is None else list(self.gradient)}

    def probe(self, values: dict) -> dict:
        """The behaviour, from `values()` on the host, as the step's Probe field."""
        scale_error, shift_error = values["scale_error"], values["shift_error"]
        if scale_error > self.tolerance:
            return {"norm": NormBehaviour(NormKind.NONE, scale_error, shift_error, None, tolerance=self.tolerance)}
        centres = shift_error <= self.tolerance
        kind = NormKind.LAYERNORM if centres else NormKind.RMSNORM
        gradient = values["gradient"]
        if gradient is not None:  # the shift direction is one only LayerNorm is blind to
            gradient = max(gradient) if centres else gradient[0]
        return {"norm": NormBehaviour(kind, scale_error, shift_error, values["gains"][0 if centres else 1],
                                      gradient, self.tolerance)}


@functools.lru_cache(maxsize=8)
def _norm_inputs(width: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, ...]:
    """The probe tokens, their rescaling and shift, and other tokens: made once per width, dtype and device
    (a watch measures every norm at every record; a copy to the device each time would wait for the queue)."""
    generator = torch.Generator().manual_seed(PROBE_SEED)
    x = torch.randn(1, PROBE_TOKENS, width, generator=generator) * 2 + 0.5
    other = torch.randn(1, PROBE_TOKENS, width, generator=generator) * 2 - 0.5
    scale = torch.empty(1, PROBE_TOKENS, 1).uniform_(0.5, 4.0, generator=generator)
    shift = torch.randn(1, PROBE_TOKENS, 1, generator=generator) * 3
    return tuple(value.to(device, dtype) for value in (x, other, scale, shift))


@torch.no_grad()
def measure_norm(module: nn.Module, width: int) -> Optional[NormMeasurement]:
    """How `module` treats tokens of `width` features; None when it cannot be called on them."""
    parameter = next(module.parameters(), None)
    dtype = parameter.dtype if parameter is not None and parameter.is_floating_point() else torch.float32
    device = parameter.device if parameter is not None else torch.device("cpu")
    x, other, scale, shift = _norm_inputs(width, dtype, device)
    try:
        y, y_scaled, y_shifted, y_other = (module(value) for value in (x, x * scale, x + shift, other))
    except Exception:  # not a plain [.., d] -> [.., d] module: the behaviour cannot be measured
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return None
    delta_out = (y.double() - y_other.double()).pow(2).mean().sqrt()
    gains = tuple(delta_out / (_reference(x, centre) - _reference(other, centre)).pow(2).mean().sqrt().clamp_min(1e-30)
                  for centre in (True, False))
    return NormMeasurement(_relative(y_scaled, y), _relative(y_shifted, y), gains, _tolerance(dtype),
                           _backward_components(module, x, y))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The largest |cos| over tokens between a and b ([.., T, d], b broadcast)."""
    a, b = a.double(), b.double().expand_as(a)
    dot = (a * b).sum(-1).abs()
    return (dot / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)).max()


def _backward_components(module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Optional[tuple]:
    """How far the gradient `module` passes back to x leans along the token and along (1, …, 1), directions a
    norm's forward is blind to (so the true derivative has no component there).

    Any cotangent shows a correct backward's zeros; these two make a broken one's components large whatever
    the gains' signs. With u = γ ⊙ n the output less its bias ((y(x) − y(−x)) / 2) and n the token
    standardised, a backward that treats the statistics as constants returns γ ⊙ v / σ: against the token,
    v = u ⊙ |n| gives Σ γ²·|n|³ > 0; against (1, …, 1), v = u ⊙ sign(n) gives Σ γ²·|n| > 0."""
    if torch.is_inference_mode_enabled():
        return None  # no graph can be recorded
    try:
        bias_free = (y - module(-x)) / 2
        with torch.enable_grad():
            probe = x.detach().clone().requires_grad_()
            output = module(probe)
    except Exception:
        return None
    if not isinstance(output, torch.Tensor) or not output.requires_grad:
        return None  # a module that keeps no graph: nothing to measure
    centred = x - x.mean(-1, keepdim=True)
    n = centred / centred.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
    along_token, = torch.autograd.grad(output, probe, grad_outputs=bias_free * n.abs(), retain_graph=True)
    along_ones, = torch.autograd.grad(output, probe, grad_outputs=bias_free * n.sign())
    return _cosine(along_token, x), _cosine(along_ones, torch.ones_like(x[..., :1, :]))


@dataclass(frozen=True)
class CausalMeasurement:
    """How far earlier outputs moved when the last token changed, a device scalar until the trace's copy."""

    leak: Optional[torch.Tensor]  # None: fewer than two tokens, nothing to measure
    tolerance: float

    def values(self) -> dict:
        return {"leak": self.leak}

    def probe(self, values: dict) -> dict:
        """The behaviour, from `values()` on the host, as the step's Probe field."""
        leak = values["leak"]
        return {"causal": CausalBehaviour(None if leak is None else leak <= self.tolerance,
                                          0.0 if leak is None else leak)}


@torch.no_grad()
def measure_causality(forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                      output: torch.Tensor) -> CausalMeasurement:
    """Perturb the last token of x; compare the outputs at every earlier position with `output`."""
    tolerance = _tolerance(x.dtype) * 1e-2
    if x.shape[-2] < 2:
        return CausalMeasurement(None, tolerance)
    generator = torch.Generator().manual_seed(PROBE_SEED)
    noise = torch.randn(x.shape[:-2] + x.shape[-1:], generator=generator).to(x.device, x.dtype)
    perturbed = x.clone()
    perturbed[..., -1, :] += noise * x.float().pow(2).mean().sqrt().clamp_min(1.0).to(x.dtype)
    moved = forward(perturbed)
    return CausalMeasurement(_relative(moved[..., :-1, :], output[..., :-1, :]), tolerance)
