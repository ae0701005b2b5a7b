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
    return torch.linalg.vector_norm(t.double())


def residual_probe(context: ProbeContext, name: str, value: torch.Tensor) -> dict:
    stream_name, update_name = context.sources[name]
    stream, update = context.refs.get(stream_name), context.refs.get(update_name)
    probe = {}
    if stream is not None and update is not None and stream.shape == value.shape == update.shape:
        expected = context.residual_scale * stream + update
        probe["residual_mismatch"] = _norm(value - expected) / _norm(value).clamp_min(1e-30)
        probe["update_ratio"] = _norm(update) / _norm(stream).clamp_min(1e-30)
    for used in (stream_name, update_name):  # compared: no reason to hold them any longer
        context.refs.pop(used, None)
    return probe


def _median_token_size(value: torch.Tensor) -> torch.Tensor:
    """The median over tokens of ‖x‖²/d: the stream's size, blind to a few sink tokens with huge norms."""
    return value.detach().float().pow(2).mean(dim=-1).flatten().median()


def massive_probe(value: torch.Tensor, moments: torch.Tensor) -> dict:
    """max |x| against the median |x|; the maximum comes from the step's moments, so the
    median (a sort) is paid only when some |x| exceeds MASSIVE_ABS."""
    low, high = float(moments[3]), float(moments[4])
    largest = max(abs(low), abs(high))
    if not largest > MASSIVE_ABS:
        return {}
    return {"massive_ratio": largest / max(float(value.detach().abs().flatten().median()), 1e-30)}


def ffn_probe(context: ProbeContext, output) -> None:
    """Dead units (never active for any token) and activations in the flat region."""
    hidden = output[0] if isinstance(output, (tuple, list)) else output
    flat = hidden.detach().reshape(-1, hidden.shape[-1])
    if context.activation.gated:  # gated: signed output, active when not ~0
        active = flat.abs() > 1e-6
        flat_region = ~active
    else:  # ReLU, GELU, SiLU: active when positive; flat where ~0 on the negative side
        active = flat > 0
        flat_region = (flat <= 0) & (flat > -1e-3)
    context.ffn_activity = {
        "dead_fraction": 1.0 - active.any(dim=0).float().mean(),
        "flat_fraction": flat_region.float().mean(),
        "units": flat.shape[-1],
        "tokens": flat.shape[0],
    }


def step_probe(context: ProbeContext, name: str, value: torch.Tensor, moments: torch.Tensor) -> dict:
    """Everything the health checks need from one step; `moments` are its tensor_moments."""
    probe = {}
    if name in ("residual1", "residual2", "norm2"):
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
