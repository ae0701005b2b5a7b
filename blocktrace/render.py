"""Trace -> report dict -> text. The JSON output and the tables come from the same dict.

Nothing here prints: functions return strings and the CLI decides where they go.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from tabulate import tabulate

from blocktrace._version import __version__
from blocktrace.stats import STAT_NAMES
from blocktrace.text import HEADINGS, explanation
from blocktrace.tracer import PREVIEW_MAX_TOKENS, StepRecord, Trace

SCHEMA_VERSION = 1
STAT_HEADINGS = ("mean", "std", "min", "max", "rms", "max|x|", "nan/inf")
HEATMAP_RAMP = " .:-=+*#%@"  # ASCII only: block characters are double width in some CJK terminals


def _step_dict(index: int, record: StepRecord) -> dict:
    entry = {
        "index": index,
        "name": record.name,
        "operation": record.operation,
        "shape": list(record.shape),
        "dtype": record.dtype,
        "stats": record.stats.to_dict(),
    }
    if record.sample is not None:
        entry["values"] = record.sample
    return entry


def report_dict(trace: Trace, *, tokens: Optional[Sequence[str]], input_note: str, seed: Optional[int],
                weights: Optional[dict] = None) -> dict:
    """The stable, documented JSON schema of `blocktrace run --json` (schema 1)."""
    attention = None
    if trace.attention is not None:
        a = trace.attention
        attention = {
            "shape": list(a.shape),
            "causal": a.causal,
            "future_weight_sum": a.future_weight_sum,
            "entropy_per_head": a.entropy_per_head,
            "uniform_entropy": math.log(a.shape[-1]),
            "max_weight": a.max_weight,
            "max_logit": a.max_logit,
            "weights_first_sequence": a.preview,
        }
    return {
        "schema": SCHEMA_VERSION,
        "blocktrace_version": __version__,
        "config": trace.config.to_dict(),
        "seed": seed,
        "weights": weights,
        "tokens": list(tokens) if tokens else None,
        "input": {**_step_dict(0, trace.input), "source": input_note},
        "steps": [_step_dict(i, record) for i, record in enumerate(trace.steps, start=1)],
        "attention": attention,
        "output_shape": list(trace.output.shape),
        "block_shape_preserved": trace.shape_preserved,
    }


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _stat_cells(stats: dict) -> list:
    return [*(stats[name] for name in STAT_NAMES[:6]), f"{stats['nan']}/{stats['inf']}"]


def _header(report: dict, lang: str) -> str:
    words = HEADINGS[lang]
    config = report["config"]
    settings = " ".join(
        f"{key}={config[key]}" for key in ("d_model", "n_heads", "d_ff", "norm", "ffn", "placement", "causal")
    )
    if report["seed"] is not None:
        settings += f" seed={report['seed']}"
    lines = [f"blocktrace {report['blocktrace_version']}: {settings}"]
    weights = report.get("weights")
    if weights:
        lines.append(f"weights: {weights['path']} ({weights['layout']}), "
                     f"layer {weights['layer']} of 0–{weights['n_layers'] - 1}")
    if report["tokens"]:
        lines.append(f"{words['tokens']}: {' '.join(report['tokens'])}")
    source = report["input"]
    lines.append(f"{words['input']}: {_shape(source['shape'])} {source['dtype']} ({source['source']})")
    return "\n".join(lines)


def step_table(report: dict, lang: str, fmt: str) -> str:
    words = HEADINGS[lang]
    headers = [words["index"], words["step"], words["operation"], words["shape"], *STAT_HEADINGS]
    rows = [
        [entry["index"], entry["name"], entry["operation"], _shape(entry["shape"]), *_stat_cells(entry["stats"])]
        for entry in [report["input"], *report["steps"]]
    ]
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4f")


def _ramp(weight: float) -> str:
    return HEATMAP_RAMP[min(len(HEATMAP_RAMP) - 1, int(weight * len(HEATMAP_RAMP)))]


def heatmaps(report: dict, labels: Sequence[str], lang: str, fmt: str) -> str:
    words = HEADINGS[lang]
    attention = report["attention"]
    preview = attention["weights_first_sequence"]
    if preview is None:
        return words["heatmap_skipped"].format(tokens=attention["shape"][-1], limit=PREVIEW_MAX_TOKENS)
    batch_note = words["heatmap_batch"] if len(attention["shape"]) == 4 else ""
    blocks = []
    for head, matrix in enumerate(preview):
        rows = [[label, *(f"{w:.2f} {_ramp(w)}" for w in row)] for label, row in zip(labels, matrix)]
        title = words["heatmap"].format(head=head, batch_note=batch_note)
        blocks.append(title + "\n" + tabulate(rows, headers=["", *labels], tablefmt=fmt, stralign="right", disable_numparse=True))
    return "\n\n".join(blocks)


def attention_section(report: dict, labels: Sequence[str], lang: str, fmt: str) -> str:
    words = HEADINGS[lang]
    a = report["attention"]
    entropy = "  ".join(f"h{head}={value:.4f}" for head, value in enumerate(a["entropy_per_head"]))
    lines = [
        f"{words['attention']}:",
        f"attention_shape={_shape(a['shape'])}",
        f"future_weight_sum={a['future_weight_sum']:.4f}",
        words["entropy"].format(uniform=a["uniform_entropy"]) + f": {entropy}",
        words["max_weight"].format(weight=a["max_weight"], logit=a["max_logit"]),
        "",
        heatmaps(report, labels, lang, fmt),
    ]
    return "\n".join(lines)


def values_section(report: dict, token_index: int, labels: Sequence[str], lang: str, fmt: str) -> str:
    entries = [report["input"], *report["steps"]]
    n = len(entries[0]["values"])
    title = HEADINGS[lang]["values"].format(n=n, index=token_index, label=labels[token_index])
    rows = [[entry["name"], *entry["values"]] for entry in entries]
    return title + "\n" + tabulate(rows, headers=["", *range(n)], tablefmt=fmt, floatfmt=".4f")


def explanations(report: dict, lang: str) -> str:
    placement = report["config"]["placement"]
    lines = [f"{HEADINGS[lang]['why']}:"]
    lines += [f"{e['index']} {e['name']}: {explanation(lang, placement, e['name'])}" for e in report["steps"]]
    return "\n".join(lines)


def render_run(
    report: dict,
    *,
    lang: str = "en",
    fmt: str = "simple",
    explain: bool = False,
    token_index: int = 0,
) -> str:
    """The whole `blocktrace run` text output for one report dict."""
    n_tokens = report["input"]["shape"][-2]
    labels = report["tokens"] or [f"t{i}" for i in range(n_tokens)]
    parts = [_header(report, lang), step_table(report, lang, fmt)]
    if explain:
        parts.append(explanations(report, lang))
    if "values" in report["input"]:
        parts.append(values_section(report, token_index, labels, lang, fmt))
    if report["attention"] is not None:
        parts.append(attention_section(report, labels, lang, fmt))
    parts.append(f"block_shape_preserved={report['block_shape_preserved']}")
    return "\n\n".join(parts) + "\n"
