"""Results as JSON-ready dicts: what every command returns, what `--json` prints and what render/ shows.

Every document has `schema` (vocab.SCHEMA_VERSION; docs/reference.md says what each version changed) and `kind`
(vocab.ReportKind): "block" (one block), "stack" (`--layers N`), "sweep" (`--layers 6,8,…` with `--grad`), "model"
(a checkpoint, layer by layer); compare's, diff's, track's and inspect's documents are built beside their commands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from blocktrace.phrases import phrase
from blocktrace._version import __version__
from blocktrace.tracing.records import StepRecord, Trace
from blocktrace.tracing.stack import summarise
from blocktrace.vocab import SCHEMA_VERSION, ReportKind


@dataclass
class Traced:
    """What `run` and `check` computed: the report (the JSON document), the traces (for --save) and the tokens the
    traces were made from (--save stores them beside the tensors)."""
    report: dict
    traces: list
    tokens: list = field(default_factory=list)


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
            "entropy_per_head": a.entropy_per_head, "uniform_entropy": a.uniform_entropy,
            "max_weight": a.max_weight, "max_logit": a.max_logit, "first_weight": a.first_weight,
            "self_weight": a.self_weight, "previous_weight": a.previous_weight,
            "weights_first_sequence": a.preview,
            **({"weights_map": map_dict(a)} if a.map is not None else {})}


MAP_DECIMALS = 4  # a map's cells as the document gives them: a picture's precision, and ~7 bytes a cell


def map_dict(a) -> dict:
    """A long input's attention map: each cell the largest weight of its cell × cell block of queries and keys,
    rounded to MAP_DECIMALS; `tokens` is the input's length (the last row and column may cover fewer)."""
    return {"cell": a.map_cell, "tokens": a.shape[-1], "decimals": MAP_DECIMALS,
            "heads": [[[round(value, MAP_DECIMALS) for value in row] for row in head] for head in a.map]}


def measured_dict(trace: Trace) -> Optional[dict]:
    """What the checks measured of the block: its causality (a user's block) and each norm's kind."""
    norms = {step.name: step.probe.norm.kind.value for step in trace.steps if step.probe.norm is not None}
    causal = next((step.probe.causal for step in trace.steps if step.probe.causal is not None), None)
    if not norms and causal is None:
        return None
    return {"causal": causal.causal if causal else None, "causal_leak": causal.leak if causal else None, "norms": norms}


def gradients_dict(grads) -> Optional[dict]:
    if grads is None:
        return None
    parameters = grads.parameter_norms or [None] * len(grads.step_norms)
    return {"loss": grads.loss, "loss_kind": grads.loss_kind, "batches": grads.batches,
            "layers": [{"layer": i, "step_grad_norms": steps, "weight_grad_norms": weights, "parameters": params}
                       for i, (steps, weights, params) in enumerate(zip(grads.step_norms, grads.weight_norms,
                                                                        parameters))]}


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


BLOCK_LOSS_NOTE = phrase("a block alone has no model loss: check a checkpoint (--weights) for the model's own; "
                         "--grad here uses the seeded readout of Xiong et al. 2020")


def findings(found, loss: Optional[dict] = None, loss_note: Optional[str] = None) -> dict:
    """The keys every checked report has: flags, the ranked diagnosis (diagnose.diagnosis.conclude), and the
    model's loss (or why none)."""
    if found is None:
        return {}
    return {"flags": flags_dict(found.flags), "diagnosis": found.diagnosis,
            "loss": None if loss is None else loss.get("value"), "loss_note": loss_note}


def _flags(found) -> Optional[list]:
    return None if found is None else found.flags


def substeps_dict(trace: Trace) -> dict:
    """The traced sub-steps inside attn (q and k) and inside ffn (a mixture of experts' router), and the routing."""
    inside = {step: [record for record in trace.substeps if record.name.startswith(f"{step}.")]
              for step in ("attn", "ffn")}
    return {f"{step}_substeps": [step_dict(i, record) for i, record in enumerate(records, start=1)] or None
            for step, records in inside.items()} | {"routing": trace.routing.to_dict() if trace.routing else None}


def block_report(source, trace: Trace, grads=None, found=None) -> dict:
    """One block: the tutorial's six steps, the attention summary (schema in docs/tutorial.md)."""
    flags = _flags(found)
    steps = [step_dict(i, record) for i, record in enumerate(trace.steps, start=1)]
    return {
        **_header(source, trace.describe()),
        "kind": ReportKind.BLOCK.value,
        "input": {**step_dict(0, trace.input), "source": source.note},
        "steps": _with_flags(steps, flags),
        "attention": attention_dict(trace),
        "measured": measured_dict(trace),
        **substeps_dict(trace),
        "gradients": gradients_dict(grads),
        "flags": flags_dict(flags),
        **findings(found, loss_note=BLOCK_LOSS_NOTE),
        "notes": [*trace.notes, *source.notes],
        "output_shape": list(trace.output.shape),
        "block_shape_preserved": trace.shape_preserved,
    }


def stack_report(source, traces: list[Trace], grads=None, found=None) -> dict:
    """N blocks: per layer the stream's size, the branch shares and the steps."""
    flags = _flags(found)
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
        **findings(found, loss_note=BLOCK_LOSS_NOTE),
        "output_shape": list(last.output.shape),
        "block_shape_preserved": tuple(last.output.shape) == first.input.shape,
    }


def sweep_report(source, config, rows: list[dict]) -> dict:
    """Per depth, the last layer's weight-gradient norms (Xiong et al. 2020, Theorem 1)."""
    return {**_header(source, config.to_dict()), "kind": ReportKind.SWEEP.value, "depths": [row["depth"] for row in rows], "sweep": rows}


def config_differences(layer_config: dict, config: dict) -> dict:
    """The settings of one layer's block that differ from the model's (a dense layer among experts, a global layer
    among windowed ones, a layer without RoPE): what the document's `config` does not say of that layer."""
    return {key: value for key, value in layer_config.items() if config.get(key) != value}


def _layer_entry(layer: int, trace: Trace, flags, weights: Optional[dict], config: dict) -> dict:
    summary = summarise(layer, trace)
    attention = trace.attention
    size = trace.steps[-1].probe.token_sq_median
    return {"layer": layer, "rms": summary.rms, "sq_norm_per_d": summary.sq_norm_per_d,
            "median_token_sq_norm_per_d": size, "attn_share": summary.attn_share, "ffn_share": summary.ffn_share,
            "max_logit": attention.max_logit if attention else None,
            "min_head_entropy": min(attention.entropy_per_head) if attention else None,
            "steps": _with_flags([step_dict(i, r) for i, r in enumerate(trace.steps, start=1)], flags, layer),
            "attention": attention_dict(trace), "weights": weights,
            "config_differences": config_differences(trace.describe(), config)}


def model_report(checkpoint, info, config, traces: list[Trace], model_input, loss, grads, found, evidence,
                 path: str) -> dict:
    """A checkpoint as a whole model: its traced layers, its loss, its gradients, the findings."""
    flags = _flags(found)
    first = evidence.first_layer
    weights = evidence.weights or [None] * len(traces)
    ids = model_input.ids
    real = int(model_input.token_mask.sum()) if model_input.token_mask is not None else ids.numel()
    settings = config.to_dict()
    report = {
        "schema": SCHEMA_VERSION, "blocktrace_version": __version__, "kind": ReportKind.MODEL.value,
        "config": settings, "seed": None, "tokens": model_input.labels_text,
        "weights": {"path": path, "family": info.family_name, "layer": first, "n_layers": info.n_layers},
        "input": {"sequences": ids.shape[0], "tokens": real, "shape": [*ids.shape, config.d_model],
                  "dtype": str(traces[0].input.dtype) if traces else "float32",
                  "source": "token ids through the model's embeddings, every layer run in turn"},
        "n_layers": info.n_layers, "traced_layers": [first + i for i in range(len(traces))],
        "layers": [_layer_entry(first + i, trace, flags, w, settings)
                   for i, (trace, w) in enumerate(zip(traces, weights))],
        "loss_detail": loss.to_dict(), "gradients": gradients_dict(grads), "stored_dtype": evidence.stored_dtype,
        "step": evidence.step,
        "notes": [*info.notes, *model_input.notes],
    }
    if found is not None:
        report.update({"flags": flags_dict(found.flags), "diagnosis": found.diagnosis})
    report.update({"loss": loss.value, "loss_note": loss.note})
    return report
