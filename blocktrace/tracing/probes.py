"""Measurements the health checks need, taken inside the trace's hooks (checks=True only).

Each probe returns small tensors or numbers; nothing here keeps a full activation beyond the
few step outputs the residual check compares (x, attn, residual1 or norm1, ffn), each
released as soon as it has been compared.
"""

from __future__ import annotations

import torch

# Which earlier steps a residual sum should equal: (stream, update), by placement.
RESIDUAL_SOURCES = {
    "pre": {"residual1": ("x", "attn"), "residual2": ("residual1", "ffn")},
    "post": {"residual1": ("x", "attn"), "residual2": ("norm1", "ffn")},
}
MASSIVE_ABS = 100.0  # Sun et al. 2024: massive activations exceed 100 in magnitude


def norm_probe(module: torch.nn.Module, y: torch.Tensor, kind: str) -> dict:
    """Per-token mean and std (rms for RMSNorm) of the norm's output before its gain and shift."""
    core = y.float()
    weight, bias = getattr(module, "weight", None), getattr(module, "bias", None)
    gain = None
    if isinstance(bias, torch.Tensor) and bias.shape == core.shape[-1:]:
        core = core - bias.detach().float()
    if isinstance(weight, torch.Tensor) and weight.shape == core.shape[-1:]:
        g = weight.detach().float()
        core = core / torch.where(g.abs() > 1e-12, g, torch.ones_like(g))
        gain = g.abs().mean()
    if kind == "rmsnorm":
        spread = core.pow(2).mean(dim=-1).sqrt()
        means = core.mean(dim=-1)
    else:
        variance, means = torch.var_mean(core, dim=-1, correction=0)
        spread = variance.sqrt()
    return {"token_mean_abs": means.abs().mean(), "token_spread": spread.flatten().median(), "norm_kind": kind,
            "gain_mean_abs": gain}


def _norm(t: torch.Tensor) -> torch.Tensor:
    return torch.linalg.vector_norm(t.double())


def residual_probe(recorder, name: str, value: torch.Tensor) -> dict:
    stream_name, update_name = RESIDUAL_SOURCES[recorder.layout.placement][name]
    stream, update = recorder.refs.get(stream_name), recorder.refs.get(update_name)
    probe = {}
    if stream is not None and update is not None and stream.shape == value.shape == update.shape:
        alpha = recorder.block.config.residual_scale if recorder.own else 1.0
        expected = alpha * stream + update
        probe["residual_mismatch"] = _norm(value - expected) / _norm(value).clamp_min(1e-30)
        probe["update_ratio"] = _norm(update) / _norm(stream).clamp_min(1e-30)
    for used in (stream_name, update_name):  # compared: no reason to hold them any longer
        recorder.refs.pop(used, None)
    return probe


def massive_probe(value: torch.Tensor, moments: torch.Tensor) -> dict:
    """max |x| against the median |x|; the maximum comes from the step's moments, so the
    median (a sort) is paid only when some |x| exceeds MASSIVE_ABS."""
    low, high = float(moments[3]), float(moments[4])
    largest = max(abs(low), abs(high))
    if not largest > MASSIVE_ABS:
        return {}
    return {"massive_ratio": largest / max(float(value.detach().abs().flatten().median()), 1e-30)}


def _activation_kind(recorder) -> str:
    if recorder.own:
        return recorder.block.config.ffn.value
    module = recorder.block.get_submodule(recorder.layout.hidden)
    return "relu" if "relu" in type(module).__name__.lower() else "gelu"


def ffn_probe(recorder, output) -> None:
    """Dead units (never active for any token) and activations in the flat region."""
    hidden = output[0] if isinstance(output, (tuple, list)) else output
    flat = hidden.detach().reshape(-1, hidden.shape[-1])
    if _activation_kind(recorder) == "swiglu":  # gated: signed output, active when not ~0
        active = flat.abs() > 1e-6
        flat_region = ~active
    else:  # ReLU, GELU, SiLU: active when positive; flat where ~0 on the negative side
        active = flat > 0
        flat_region = (flat <= 0) & (flat > -1e-3)
    recorder.ffn_probe = {
        "dead_fraction": 1.0 - active.any(dim=0).float().mean(),
        "flat_fraction": flat_region.float().mean(),
        "units": flat.shape[-1],
        "tokens": flat.shape[0],
    }


def step_probe(recorder, name: str, value: torch.Tensor, moments: torch.Tensor) -> dict:
    """Everything the health checks need from one step; `moments` are its tensor_moments."""
    probe = {}
    layout = recorder.layout
    if name in ("norm1", "norm2"):
        from blocktrace.tracing.steps import resolve

        probe.update(norm_probe(resolve(recorder.block, layout.spec(name)), value, layout.norm))
    if name in ("residual1", "residual2"):
        probe.update(residual_probe(recorder, name, value))
        probe.update(massive_probe(recorder._real_tokens(value), moments))
    if name == "ffn" and getattr(recorder, "ffn_probe", None):
        probe.update(recorder.ffn_probe)
    needed = {source for sources in RESIDUAL_SOURCES[layout.placement].values() for source in sources}
    if name in needed:
        recorder.refs[name] = value
    return probe
