"""Measurements the health checks need, taken inside the trace's hooks (checks=True only).

Each probe reads what it needs from an explicit ProbeContext — the block, its layout, the
residual scale, the padding mask — and returns small tensors or numbers. Nothing here keeps
a full activation beyond the few step outputs the residual check compares (x, attn,
residual1 or norm1, ffn), each released as soon as it has been compared.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from blocktrace.tracing.steps import RESIDUAL_SOURCES, Layout, StepSpec, resolve
from blocktrace.vocab import FFNKind

MASSIVE_ABS = 100.0  # Sun et al. 2024: massive activations exceed 100 in magnitude
RESIDUAL_TOKENS = 256  # the residual identity holds at every token: this many spread over the input suffice


@dataclass
class ProbeContext:
    """What the probes of one traced block may read, and the little state they share."""

    block: torch.nn.Module
    layout: Layout
    residual_scale: float  # α multiplying the stream in each residual add (DeepNorm), else 1
    activation: FFNKind  # what the FFN hidden values are: decides what "active" means
    token_mask: Optional[torch.Tensor] = None  # [B, T], False at padding
    refs: dict = field(default_factory=dict)  # step outputs the residual checks still need
    ffn_activity: dict = field(default_factory=dict)  # from the FFN hidden, until the ffn step reads it

    @classmethod
    def of(cls, block, layout: Layout, own: bool, token_mask=None) -> "ProbeContext":
        if own:
            return cls(block, layout, block.config.residual_scale, block.config.ffn, token_mask)
        return cls(block, layout, 1.0, _user_activation(block, layout), token_mask)

    @property
    def final_step(self) -> str:
        """The step whose output is the block's output."""
        return "norm2" if self.layout.placement.norm_after_add else "residual2"

    @property
    def sources(self) -> dict:
        return RESIDUAL_SOURCES[self.layout.placement]

    def real_tokens(self, value: torch.Tensor) -> torch.Tensor:
        from blocktrace.tracing.recorder import real_tokens

        return real_tokens(value, self.token_mask)


def _user_activation(block, layout: Layout) -> FFNKind:
    if not layout.hidden:
        return FFNKind.GELU
    module = resolve(block, StepSpec("ffn", layout.hidden))
    return FFNKind.RELU if "relu" in type(module).__name__.lower() else FFNKind.GELU


def _norm(t: torch.Tensor) -> torch.Tensor:
    """Frobenius norm, accumulated in float32 at least (a relative 1e-3 test needs no more)."""
    return torch.linalg.vector_norm(t if t.dtype in (torch.float32, torch.float64) else t.float())


def _spread(t: torch.Tensor) -> torch.Tensor:
    """At most RESIDUAL_TOKENS tokens, evenly spaced, of a [..., T, d] tensor (a view)."""
    every = max(1, t.shape[-2] // RESIDUAL_TOKENS)
    return t if every == 1 else t[..., ::every, :]


def residual_probe(context: ProbeContext, name: str, value: torch.Tensor) -> dict:
    """Whether the step's output is α·stream + update (an identity that holds token by token, so tokens
    spread over a long input test it as well as all of them), and the update's size against the stream's."""
    stream_name, update_name = context.sources[name]
    stream, update = context.refs.get(stream_name), context.refs.get(update_name)
    probe = {}
    if stream is not None and update is not None and stream.shape == value.shape == update.shape:
        stream, update, value = _spread(stream), _spread(update), _spread(value)
        expected = torch.add(update, stream, alpha=context.residual_scale)
        probe["residual_mismatch"] = _norm(expected.sub_(value)) / _norm(value).clamp_min(1e-30)
        probe["update_ratio"] = _norm(update) / _norm(stream).clamp_min(1e-30)
    for used in (stream_name, update_name):  # compared: no reason to hold them any longer
        context.refs.pop(used, None)
    return probe


def _median_token_size(value: torch.Tensor) -> torch.Tensor:
    """The median over tokens of ‖x‖²/d: the stream's size, blind to a few sink tokens with huge norms."""
    norms = torch.linalg.vector_norm(value.detach().float(), dim=-1).flatten()
    return norms.median().square() / value.shape[-1]


def massive_probe(value: torch.Tensor, moments: torch.Tensor) -> dict:
    """max |x| against the median |x|; the maximum comes from the step's moments, so the
    median (a sort) is paid only when some |x| exceeds MASSIVE_ABS."""
    low, high = float(moments[3]), float(moments[4])
    largest = max(abs(low), abs(high))
    if not largest > MASSIVE_ABS:
        return {}
    return {"massive_ratio": largest / max(float(value.detach().abs().flatten().median()), 1e-30)}


DEAD_WORTH_A_LOOK = 0.5  # the flat-region fraction (info) is measured only past this dead fraction


def ffn_probe(context: ProbeContext, output) -> None:
    """Dead units (never active for any token) and, where many are, activations in the flat region."""
    hidden = output[0] if isinstance(output, (tuple, list)) else output
    flat = context.real_tokens(hidden.detach())
    flat = flat.reshape(-1, flat.shape[-1])
    gated = context.activation.gated  # gated: signed output, active when not ~0; else active when positive
    peak = flat.abs().amax(dim=0) if gated else flat.amax(dim=0)  # one pass: a unit's largest value
    dead = (peak <= (1e-6 if gated else 0.0)).float().mean().item()
    context.ffn_activity = {"dead_fraction": dead, "units": flat.shape[-1], "tokens": flat.shape[0],
                            "flat_fraction": _flat_fraction(flat, gated) if dead > DEAD_WORTH_A_LOOK else 0.0}


def _flat_fraction(flat: torch.Tensor, gated: bool) -> float:
    """Share of activations where the nonlinearity has ~zero slope (~0 output on the negative side)."""
    region = flat.abs() <= 1e-6 if gated else (flat <= 0) & (flat > -1e-3)
    return region.float().mean().item()


def step_probe(context: ProbeContext, name: str, value: torch.Tensor, moments: torch.Tensor) -> dict:
    """Everything the health checks need from one step; `moments` are its tensor_moments."""
    probe = {}
    if name == context.final_step:
        probe["token_sq_median"] = _median_token_size(context.real_tokens(value))
    if name in ("residual1", "residual2"):
        probe.update(residual_probe(context, name, value))
        probe.update(massive_probe(context.real_tokens(value), moments))
    if name == "ffn" and context.ffn_activity:
        probe.update(context.ffn_activity)
    needed = {source for sources in context.sources.values() for source in sources}
    if name in needed:
        context.refs[name] = value
    return probe
