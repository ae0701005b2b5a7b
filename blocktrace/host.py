"""Numbers computed on the device reach the host in one copy.

Reading a device scalar (`.item()`, `float(t)`, `if t:`) makes the host wait for every kernel queued
before it; on a GPU, one such wait per statistic costs more than the statistics. So blocktrace computes
its statistics as device tensors, gathers them in a tree (dicts, lists and tuples with tensors as leaves)
and calls `to_host` once: every leaf is flattened into one float64 vector per device, copied once, and
the tree comes back with Python numbers where the tensors were.

Tensors sharded by FSDP2 (DTensor) are gathered first (a collective every rank runs in the same order).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _leaves(tree, found: list) -> None:
    if isinstance(tree, torch.Tensor):
        found.append(tree)
    elif isinstance(tree, dict):
        for value in tree.values():
            _leaves(value, found)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            _leaves(value, found)


def _nest(flat: list, shape: tuple):
    """A flat list as nested lists of `shape` (no tensor on the host, no second copy)."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return flat
    step = math.prod(shape[1:])
    return [_nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def _python(values: list, tensor: torch.Tensor):
    if tensor.dtype == torch.bool:
        values = [value != 0 for value in values]
    elif not tensor.is_floating_point():
        values = [int(value) for value in values]
    return _nest(values, tuple(tensor.shape))


def _local(tensor: torch.Tensor) -> torch.Tensor:
    full = getattr(tensor, "full_tensor", None)  # a DTensor: every rank's shard, gathered
    return full() if callable(full) else tensor


def to_host(tree) -> Any:
    """`tree` with every tensor replaced by Python numbers (a 0-d tensor by a number, others by nested lists;
    bool and integer tensors keep their kind), in one device-to-host copy per device."""
    leaves: list[torch.Tensor] = []
    _leaves(tree, leaves)
    if not leaves:
        return tree
    leaves = [_local(leaf.detach()) for leaf in leaves]
    by_device: dict[torch.device, list[int]] = {}
    for index, leaf in enumerate(leaves):
        by_device.setdefault(leaf.device, []).append(index)
    values: list = [None] * len(leaves)
    for indices in by_device.values():
        flat = torch.cat([leaves[i].reshape(-1).to(torch.float64) for i in indices])
        copied = flat.tolist()  # the one device-to-host copy
        start = 0
        for i in indices:
            size = leaves[i].numel()
            values[i] = _python(copied[start:start + size], leaves[i])
            start += size
    return _rebuild(tree, iter(values))


def _rebuild(tree, values):
    if isinstance(tree, torch.Tensor):
        return next(values)
    if isinstance(tree, dict):
        return {key: _rebuild(value, values) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        rebuilt = [_rebuild(value, values) for value in tree]
        return rebuilt if isinstance(tree, list) else tuple(rebuilt)
    return tree
