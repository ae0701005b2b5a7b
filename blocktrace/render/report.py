"""Results as JSON-ready dicts: what `--json` prints and what the text renderer reads.

Every document has `schema` (1) and `kind`: "block" (one block), "stack" (`--layers N`),
"sweep" (`--layers 6,8,…` with `--grad`) or "compare".
"""

from __future__ import annotations

import math
from typing import Optional

from blocktrace._version import __version__
from blocktrace.tracing.records import StepRecord, Trace
from blocktrace.vocab import SCHEMA_VERSION, ReportKind


def step_dict(index: int, record: StepRecord) -> dict:
    entry = {"index": index, "name": record.name, "operation": record.operation, "shape": list(record.shape),
             "dtype": record.dtype, "stats": record.stats.to_dict()}
    if record.sample is not None:
        entry["values"] = record.sample
    return entry


def attention_dict(trace: Trace) -> Optional[dict]:
    a = trace.attention
    if a is None:
        return None
    return {"shape": list(a.shape), "causal": a.causal, "future_weight_sum": a.future_weight_sum,
            "entropy_per_head": a.entropy_per_head, "uniform_entropy": math.log(a.shape[-1]),
            "max_weight": a.max_weight, "max_logit": a.max_logit, "weights_first_sequence": a.preview}


def measured_dict(trace: Trace) -> Optional[dict]:
    """What the checks measured of the block: its causality (a user's block) and each norm's kind."""
    probes = {step.name: step.probe or {} for step in trace.steps}
    norms = {name: probe["norm_kind"].value for name, probe in probes.items() if "norm_kind" in probe}
    attention = probes.get("attn", {})
    if not norms and "causal_measured" not in attention:
        return None
    return {"causal": attention.get("causal_measured"), "causal_leak": attention.get("causal_leak"), "norms": norms}


def gradients_dict(grads) -> Optional[dict]:
    if grads is None:
        return None
    return {"loss": grads.loss, "batches": grads.batches,
            "layers": [{"layer": i, "step_grad_norms": steps, "weight_grad_norms": weights}
                       for i, (steps, weights) in enumerate(zip(grads.step_norms, grads.weight_norms))]}


def _header(source, settings: dict) -> dict:
    return {"schema": SCHEMA_VERSION, "blocktrace_version": __version__, "config": settings,
            "seed": source.seed, "weights": source.weights, "tokens": source.tokens}


def _with_flags(entries: list[dict], flags, layer=None) -> list[dict]:
    """Each step entry gets the names of the flags raised at it (when checks ran)."""
    if flags is None:
        return entries
    for entry in entries:
        entry["flags"] = [f.name for f in flags if f.step == entry["name"] and f.layer == layer]
    return entries


def flags_dict(flags) -> Optional[list]:
    return None if flags is None else [flag.to_dict() for flag in flags]


def block_report(source, trace: Trace, grads=None, flags=None) -> dict:
    """One block: the tutorial's six steps, the attention summary (schema in README)."""
    steps = [step_dict(i, record) for i, record in enumerate(trace.steps, start=1)]
    return {
        **_header(source, trace.describe()),
        "kind": ReportKind.BLOCK.value,
        "input": {**step_dict(0, trace.input), "source": source.note},
        "steps": _with_flags(steps, flags),
        "attention": attention_dict(trace),
        "measured": measured_dict(trace),
        "attn_substeps": [step_dict(i, record) for i, record in enumerate(trace.substeps, start=1)] or None,
        "gradients": gradients_dict(grads),
        "flags": flags_dict(flags),
        "notes": trace.notes,
        "output_shape": list(trace.output.shape),
        "block_shape_preserved": trace.shape_preserved,
    }


def stack_report(source, traces: list[Trace], grads=None, flags=None) -> dict:
    """N blocks: per layer the stream's size, the branch shares and the steps."""
    from blocktrace.model.stack import summarise

    layers = []
    for index, trace in enumerate(traces):
        summary = summarise(index, trace)
        layers.append({"layer": index, "rms": summary.rms, "sq_norm_per_d": summary.sq_norm_per_d,
                       "attn_share": summary.attn_share, "ffn_share": summary.ffn_share,
                       "steps": _with_flags([step_dict(i, r) for i, r in enumerate(trace.steps, start=1)],
                                            flags, index),
                       "attention": attention_dict(trace)})
    first, last = traces[0], traces[-1]
    return {
        **_header(source, first.describe()),
        "kind": ReportKind.STACK.value,
        "n_layers": len(traces),
        "input": {**step_dict(0, first.input), "source": source.note,
                  "sq_norm_per_d": first.input.stats.rms ** 2},
        "layers": layers,
        "gradients": gradients_dict(grads),
        "flags": flags_dict(flags),
        "output_shape": list(last.output.shape),
        "block_shape_preserved": tuple(last.output.shape) == first.input.shape,
    }


def sweep_report(source, config, rows: list[dict]) -> dict:
    """Per depth, the last layer's weight-gradient norms (Xiong et al. 2020, Theorem 1)."""
    return {**_header(source, config.to_dict()), "kind": ReportKind.SWEEP.value, "depths": [row["depth"] for row in rows], "sweep": rows}
