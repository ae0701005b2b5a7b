"""Stacks of blocks: each block traced in turn, and what happens to the residual stream over depth.

Per layer: the stream's rms and ‖x‖²/d after the block (Xiong et al. 2020, Lemma 2: linear
growth with depth in Pre-LN at initialisation) and each branch's share of the variance,
Var[f(x)] / Var[x + f(x)] (Liu et al. 2020, "Understanding the Difficulty of Training
Transformers"), read from the step statistics the tracer already computed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from blocktrace.tracing.records import Trace
from blocktrace.tracing.tracer import trace


@dataclass
class LayerSummary:
    layer: int
    rms: float  # of the block's output (the residual stream after it)
    sq_norm_per_d: float  # ‖x‖²/d averaged over tokens = mean of x² = rms²
    attn_share: float  # Var[attention's update] / Var[residual1] (the update: attn_out, or its norm's output)
    ffn_share: float  # Var[the FFN's update] / Var[residual2]


def _share(trace_: Trace, total: str) -> float:
    """Var of the update a residual sum adds, over Var of the sum (the update as the wiring adds it)."""
    _, update = trace_.wiring.residual_sources[total]
    var_total = trace_.step(total).stats.std ** 2
    return trace_.step(update).stats.std ** 2 / var_total if var_total > 0 else float("nan")


def summarise(index: int, trace_: Trace) -> LayerSummary:
    out = trace_.steps[-1].stats  # the last step in execution order is the block output
    return LayerSummary(index, out.rms, out.rms**2, _share(trace_, "residual1"), _share(trace_, "residual2"))


def trace_stack(blocks: list[torch.nn.Module], x: torch.Tensor, **trace_options) -> list[Trace]:
    """Trace each block on the previous block's output; returns one Trace per layer."""
    traces = []
    for block in blocks:
        traced = trace(block, x, **trace_options)
        traces.append(traced)
        x = traced.output
    return traces
