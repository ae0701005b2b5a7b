"""What a checkpoint holds against the layouts blocktrace reads without a config.json: for a file that fits none
(or fits one by its marker but not in its tensors), which layouts were tried, where the file numbers its layers,
the tensors of its first layer, and the nearest layout with what differs — so the user sees the file, not only a
missing key.

A layout's tensors are what its family's mapping asks for: `Family.parameters` run with a reader that records
each name (meta tensors, nothing read). Weights only: whether a bias is read depends on the config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

from blocktrace.config import BlockConfig
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families.base import Family

# The first dotted component that is a number: `h.0.attn…`, `transformer.blocks.3.mlp…`, `layers.12.…`
NUMBERED = re.compile(r"^((?:[^.]+\.)*?[^.]+)\.(\d+)\.(.+)$")
SHOWN = 16  # names listed per group in a one-line message (a whole layer of most families)
# Sizes to ask a mapping for its names with: any will do, the names do not depend on them (a gated FFN's do on ffn)
PROBE_CONFIGS = (BlockConfig(d_model=8, n_heads=2, d_ff=16),
                 BlockConfig(d_model=8, n_heads=2, d_ff=16, norm="rmsnorm", ffn="swiglu"))


@dataclass(frozen=True)
class Layers:
    """Where a file numbers its layers: `prefix.{k}.` for k in 0..count-1, and layer 0's tensors."""

    prefix: str
    count: int
    first: dict  # name inside layer 0 -> shape


@dataclass(frozen=True)
class Nearest:
    layout: str
    missing: tuple[str, ...]  # weights the layout reads that layer 0 lacks
    extra: tuple[str, ...]  # weights layer 0 holds that the layout does not read


def numbered_layers(checkpoint: Checkpoint) -> Optional[Layers]:
    """The prefix under which the most tensors sit in numbered layers; None when no key has a number."""
    by_prefix: dict[str, set[int]] = {}
    for key in checkpoint.keys:
        match = NUMBERED.match(key)
        if match:
            by_prefix.setdefault(match.group(1), set()).add(int(match.group(2)))
    if not by_prefix:
        return None
    prefix = max(by_prefix, key=lambda p: (len(by_prefix[p]), -len(p)))
    base = f"{prefix}.0."
    first = {key[len(base):]: tuple(checkpoint.shape(key)) for key in sorted(checkpoint.keys) if key.startswith(base)}
    count = next(k for k in range(len(by_prefix[prefix]) + 1) if k not in by_prefix[prefix])  # 0..count-1, no gap
    return Layers(prefix, count, first)


def layout_weights(family: Family) -> tuple[str, ...]:
    """The weight names a family's mapping reads in one layer (the first config it accepts)."""
    for config in PROBE_CONFIGS:
        asked: list[str] = []

        def read(names, expected):
            asked.append(names if isinstance(names, str) else names[0])
            return torch.zeros(expected, device="meta")
        try:
            family.parameters(read, config)
        except Exception:  # a mapping that needs another config: try the next
            continue
        return tuple(name for name in asked if name.endswith("weight"))
    return ()


def nearest_layout(layers: Layers, families: list[Family]) -> Optional[Nearest]:
    held = {name for name in layers.first if name.endswith("weight")}
    best = None
    for family in families:
        expected = set(layout_weights(family))
        if not expected:
            continue
        shared = len(held & expected)
        if best is None or shared > best[0]:
            best = (shared, Nearest(family.name, tuple(sorted(expected - held)), tuple(sorted(held - expected))))
    return best[1] if best is not None else None


def _names(names, shapes: Optional[dict] = None) -> str:
    shown = [f"{name} {list(shapes[name])}" if shapes else name for name in list(names)[:SHOWN]]
    return ", ".join(shown) + (f", … ({len(names)} in all)" if len(names) > SHOWN else "")


def describe_file(checkpoint: Checkpoint, families: list[Family]) -> str:
    """One sentence of what the file holds and how it differs from the nearest layout."""
    layers = numbered_layers(checkpoint)
    others = [key for key in sorted(checkpoint.keys) if layers is None or not key.startswith(f"{layers.prefix}.")]
    other_shapes = {key: tuple(checkpoint.shape(key)) for key in others}
    if layers is None:
        return f"the file holds {len(others)} tensors in no numbered layer: {_names(others, other_shapes)}"
    said = (f"the file holds {layers.count} layers as {layers.prefix}.{{k}}.*, layer 0: "
            f"{_names(list(layers.first), layers.first)}; other tensors: {_names(others, other_shapes) or 'none'}")
    nearest = nearest_layout(layers, families)
    if nearest is not None:
        said += (f"; nearest layout {nearest.layout}: it reads {_names(nearest.missing) or 'nothing more'} that "
                 f"layer 0 lacks, and not {_names(nearest.extra) or 'anything else'}")
    return said
