"""From what the hooks saw to a Trace, with the host reading the device once.

The hooks leave device tensors (tracing.recorder). `Collected` holds one block's, and `finish`
turns any number of them — one block for `trace`, every block of a model for a training watch,
plus whatever else the caller measured — into Traces with at most two copies to the host:

1. every statistic, probe, sample and attention summary of every block, in one copy;
2. only if the first copy shows a reason: NaN and Inf counts of steps that are not finite, the
   median |x| behind a massive activation, the flat region of a mostly dead FFN — measured from
   the values the trace held — in a second copy. A healthy trace makes no second copy.

A reducer (a distributed watch) turns this rank's sums, minima and maxima into all ranks' on the
device, before the copy.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from blocktrace.host import to_host
from blocktrace.phrases import phrase
from blocktrace.model.block import step_operations, substep_operations
from blocktrace.tracing.calling import attention_chunk, attention_module, hf_config, is_huggingface
from blocktrace.tracing.probes import DEAD_WORTH_A_LOOK, MASSIVE_ABS, dead_fraction, flat_fraction, massive_median
from blocktrace.tracing.recorder import map_cell
from blocktrace.tracing.records import AttentionSummary, FFNActivity, Probe, Stats, StepRecord, Trace
from blocktrace.tracing.routing import RoutingSummary
from blocktrace.tracing.stats import finite, largest_magnitude, nonfinite_counts, stats_from_moments, uniform_entropy
from blocktrace.tracing.steps import Layout, StepSpec, resolve
from blocktrace.vocab import SANDWICH_STEPS, STEP_NAMES

TINY = 1e-30  # a median this small counts as this (a ratio to it stays finite)


class Collected:
    """One block's trace between its forward and the copy to the host."""

    def __init__(self, block, layout: Layout, own: bool, recorder, output: torch.Tensor, behaviour: dict,
                 reducer=None, notes: Optional[list[str]] = None):
        self.block, self.layout, self.own, self.recorder = block, layout, own, recorder
        self.output, self.behaviour, self.reducer = output, behaviour, reducer
        self.notes = list(notes or [])
        self.pending = [recorder.input, *recorder.steps, *recorder.substeps]
        self.attention = recorder.attention.result(reducer)

    def device_values(self) -> dict:
        """Everything the first copy brings: a tree of device tensors."""
        moments = torch.stack([p.stats for p in self.pending])
        if self.reducer is not None:
            moments = self.reducer.moments(moments)
        probes = [dict(p.probe) for p in self.pending]
        for probe in probes:
            if "unit_peak" in probe:
                probe["dead_fraction"] = dead_fraction(probe.pop("unit_peak"), probe["gated"], self.reducer)
        attention = {key: value for key, value in self.attention.items() if key not in ("tensor", "shape")}
        return {"moments": moments, "samples": [p.sample for p in self.pending], "probes": probes,
                "attention": attention, "routing": self.recorder.routing,
                "behaviour": {name: measured.values() for name, measured in self.behaviour.items()}}

    def followups(self, first: dict) -> dict:
        """What the first copy shows is worth measuring, as device tensors (usually nothing)."""
        later: dict[int, dict] = {}
        mask = self.recorder.token_mask
        for index, (p, row) in enumerate(zip(self.pending, first["moments"])):
            found = {}
            if not finite(row):
                counts = nonfinite_counts(p.held["value"], mask)
                found["counts"] = self.reducer.summed(counts) if self.reducer is not None else counts
                found["inputs_finite"] = [torch.isfinite(t).all() for t in p.held["inputs"]]
            massive = largest_magnitude(row) > MASSIVE_ABS
            if self.recorder.probes is not None and p.name in self.layout.wiring.residual_sources and massive:
                found["massive_median"] = massive_median(p.held["value"], mask)
            dead = first["probes"][index].get("dead_fraction")
            if dead is not None and dead > DEAD_WORTH_A_LOOK and "hidden" in p.held:
                found["flat_fraction"] = flat_fraction(p.held["hidden"], first["probes"][index]["gated"], mask)
            if found:
                later[index] = found
        return later

    def build(self, first: dict, later: dict) -> Trace:
        operations = _operations(self.block, self.layout, self.own)
        records = []
        for index, (p, row, sample, probe) in enumerate(zip(self.pending, first["moments"], first["samples"],
                                                            first["probes"])):
            found = later.get(index, {})
            stats = stats_from_moments(row, found.get("counts"))
            probe = _probe(probe, row, found, self._behaviour(p.name, first["behaviour"]))
            records.append(StepRecord(p.name, operations[p.name], p.shape, p.dtype, Stats.from_values(stats),
                                      p.tensor, sample, probe))
        summary, notes = self._attention(first["attention"]), list(self.notes)
        if summary is None and self._mixes_without_attention():
            notes.append(phrase("attn is {mixer}, a token mixer without attention weights: its causality is measured "
                                "by changing later tokens", mixer=type(self._mixer()).__name__))
        elif summary is None:
            notes.append(f"attention weights are not visible: {self.layout.attention_path or 'the attention'} "
                         "returns none (a fused kernel such as scaled_dot_product_attention, or weights not requested)")
        fired = {p.name for p in self.recorder.steps}
        expected = {spec.name for spec in self.layout.specs}
        missing = [name for name in (*STEP_NAMES, *SANDWICH_STEPS) if name in expected and name not in fired]
        if missing:
            notes.append(f"hooks that never fired: {', '.join(missing)} (a fast path may skip submodule hooks)")
        routing = RoutingSummary.of(first["routing"], self.recorder.routing_k) if first["routing"] is not None else None
        n_steps = 1 + len(self.recorder.steps)
        for p in self.pending:
            p.held.clear()  # what was held for the followups goes now, whoever still holds the recorder
        self.pending = []
        return Trace(self.block.config if self.own else None, records[0], records[1:n_steps], summary, self.output,
                     self.layout.name, self.layout.wiring, missing, notes, records[n_steps:], self.layout.causal,
                     routing, self.recorder.attention.contracted_elsewhere)

    def _behaviour(self, name: str, values: dict) -> dict:
        measured = self.behaviour.get(name)
        return measured.probe(values[name]) if measured is not None else {}

    def _mixer(self) -> nn.Module:
        """The module of the attn step: ours, or the HF layer's (named as this layer holds it)."""
        return self.block.attn if self.own else resolve(self.block, StepSpec("attn", self.layout.attention_path))

    def _mixes_without_attention(self) -> bool:
        """Whether the block's token mixer is no attention: ours with a token_mixer, or an HF layer whose attn step is
        not an attention module (LFM2's conv layers, Qwen3-Next's linear ones)."""
        if self.own:
            return self.block.config.token_mixer is not None
        return is_huggingface(self.block) and attention_module(self.block) is None

    def _attention(self, values: dict) -> Optional[AttentionSummary]:
        if not self.attention:
            return None
        shape = self.attention["shape"]
        return AttentionSummary(
            shape=shape, causal=self.layout.causal, future_weight_sum=values["future_weight_sum"],
            entropy_per_head=values["entropy_per_head"], max_weight=values["max_weight"],
            max_logit=values["max_logit"], preview=values.get("preview"), tensor=self.attention.get("tensor"),
            map=values.get("map"), map_cell=map_cell(shape[-1]) if "map" in values else None,
            uniform_entropy=uniform_entropy(shape[-1], bool(self.layout.causal), *_visible(self.block, self.own)),
            first_weight=values["first_weight"], self_weight=values["self_weight"],
            previous_weight=values["previous_weight"], **_score_scale(self.recorder.attention.score_scale))


def _score_scale(seen: Optional[tuple[float, int]]) -> dict:
    return {} if seen is None else {"score_scale": seen[0], "head_dim": seen[1]}


def _probe(values: dict, moments: list[float], found: dict, measured: dict) -> Probe:
    """A step's Probe: the first copy's values, the followups' findings and the measured behaviour."""
    ffn = None
    if "dead_fraction" in values:
        ffn = FFNActivity(values["dead_fraction"], found.get("flat_fraction", 0.0), values["units"], int(values["tokens"]))
    massive = None
    if "massive_median" in found:
        massive = largest_magnitude(moments) / max(found["massive_median"], TINY)
    return Probe(token_sq_median=values.get("token_sq_median"), residual_mismatch=values.get("residual_mismatch"),
                 update_ratio=values.get("update_ratio"), massive_ratio=massive,
                 inputs_finite=found.get("inputs_finite"), ffn=ffn, **measured)


def finish(collected: list[Collected], extra: Any = None) -> tuple[list[Trace], Any]:
    """The Traces of `collected`, and `extra` (any tree of device tensors the caller measured beside them) on
    the host: one copy, and a second only when the first shows something worth measuring."""
    first = to_host({"traces": [c.device_values() for c in collected], "extra": extra})
    later = to_host([c.followups(values) for c, values in zip(collected, first["traces"])])
    return [c.build(values, found) for c, values, found in zip(collected, first["traces"], later)], first["extra"]


def _operations(block, layout: Layout, own: bool) -> dict[str, str]:
    if own:
        return {"x": "input", **step_operations(block.config), **substep_operations(block.config)}
    wiring = layout.wiring
    derived = {name: f"{wiring.value_of(name)} = {wiring.value_of(stream)} + {wiring.value_of(update)}, summed by "
                     "blocktrace (the block adds both branches at once)" for name, stream, update in layout.derived}
    return {"x": "input", **{spec.name: spec.describe() for spec in layout.specs}, **derived}


def _visible(block, own: bool) -> tuple[Optional[int], Optional[int]]:
    """The sliding window and the attention chunk that limit the keys a query sees."""
    if own:
        return block.config.sliding_window, block.config.attention_parts.chunk
    window = getattr(attention_module(block), "sliding_window", None)
    return (window if isinstance(window, int) else None), attention_chunk(block, hf_config(block))
