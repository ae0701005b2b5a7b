"""The optimizer's settings as its parameters' dtypes hold them (Adam's eps in float16 is 0)."""

from __future__ import annotations

import math
import struct

import torch


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
