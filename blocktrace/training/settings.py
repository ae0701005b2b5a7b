"""The optimizer's settings: as its parameters' dtypes hold them (Adam's eps in float16 is 0), and every audited
hyperparameter of every param group as the timeline holds it."""

from __future__ import annotations

import math
import struct
from typing import Optional

import torch

from blocktrace.vocab import Exterior


def optimizer_settings(optimizer) -> list[dict]:
    """Per parameter group and parameter dtype: the group's eps and what it becomes in that dtype."""
    if optimizer is None:
        return []
    settings = []
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if not isinstance(eps, (int, float)):
            continue
        for dtype in {p.dtype for p in group["params"] if p.is_floating_point()}:
            settings.append({"dtype": str(dtype).replace("torch.", ""), "eps": float(eps),
                             "eps_in_dtype": rounded_to(float(eps), dtype)})
    return settings


def rounded_to(value: float, dtype: torch.dtype) -> float:
    """`value` as `dtype` stores it, computed on the host (a tensor's .item() would count as a read)."""
    if dtype not in (torch.float16, torch.float32, torch.bfloat16):
        return value
    try:
        if dtype == torch.float16:
            return struct.unpack("e", struct.pack("e", value))[0]
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # past the format's largest value
        return math.copysign(math.inf, value)
    if dtype == torch.float32 or not math.isfinite(single):
        return single
    bits = struct.unpack("I", struct.pack("f", single))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # to the nearest bfloat16, ties to even
    return struct.unpack("f", struct.pack("I", bits))[0]


# the hyperparameters of a param group the audit reads (diagnose/audit.py), wherever an optimizer defines them
AUDITED = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "maximize", "use_muon")


def _plain(value):
    """A setting as the timeline holds it: a bool, a number, or a list of numbers (betas); None for anything else."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)  # a tensor lr (capturable optimizers), read as lr_groups reads it
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    return None


def optimizer_hyperparameters(optimizer, exterior: Optional[dict[int, set]] = None) -> Optional[dict]:
    """The optimizer's class and, per param group, every audited setting it holds (None without an optimizer), and
    whether it holds the model's embedding or head (`exterior`: exterior_parameters).
    Decoupled weight decay (AdamW's p ← p·(1 − lr·λ)) is said apart from an L2 term added to the gradient."""
    if optimizer is None:
        return None
    name = type(optimizer).__name__
    groups = []
    for group in optimizer.param_groups:
        plain = {key: _plain(group[key]) for key in AUDITED if key in group}
        settings = {key: value for key, value in plain.items() if value is not None}
        settings["decoupled_weight_decay"] = bool(group.get("decoupled_weight_decay", name.startswith("AdamW")))
        held = set().union(*((exterior or {}).get(id(p), set()) for p in group["params"]))
        settings.update({f"holds_{role.value}": role in held for role in Exterior})
        groups.append(settings)
    return {"class": name, "groups": groups}
