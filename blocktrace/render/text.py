"""Trace -> report dict -> text. The JSON output and the tables come from the same dict.

Nothing here prints: functions return strings and the CLI decides where they go.
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from typing import Optional, Sequence

from tabulate import tabulate

from blocktrace.config import (AttentionParts, BlockConfig, Experts, GLUClamp, LatentWidths, QKNorm, RopeScaling,
                               parallel_of, token_mixer_of)
from blocktrace.diagnose.diagnosis import layer_ranges
from blocktrace.render.translate import say
from blocktrace.render.words import HEADINGS, explanation
from blocktrace.tracing.recorder import PREVIEW_MAX_TOKENS
from blocktrace.tracing.stats import STAT_NAMES
from blocktrace.vocab import WEIGHT_NAMES, Lang, Level, Placement, ReportKind
from blocktrace.wiring import wiring_of

STAT_HEADINGS = ("mean", "std", "min", "max", "rms", "max|x|", "nan/inf")
HEATMAP_RAMP = " .:-=+*#%@"  # ASCII only: block characters are double width in some CJK terminals


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(n) for n in shape) + "]"


def _stat_cells(stats: dict) -> list:
    return [*(stats[name] for name in STAT_NAMES[:6]), f"{stats['nan']}/{stats['inf']}"]


CONFIG_SHOWN = ("module", "d_model", "n_heads", "d_ff", "norm", "ffn", "placement", "causal")
# Shown too where they differ from BlockConfig's defaults: what makes a modern family's block its own.
CONFIG_EXTRAS = ("kv_heads", "head_size", "rope_theta", "rope_scaling", "rotary_fraction", "rope_interleaved", "nope",
                 "qkv_bias", "qk_norm", "norm_offset",
                 "norm_gain_float32", "attn_scale",
                 "sliding_window", "attention", "parallel_residual", "residual_multiplier",
                 "latent", "experts", "glu_clamp", "attn_output_gate", "token_mixer")
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(BlockConfig)}


# The settings that are pieces: each read back from its dict and said by its str
PIECE_READERS = {"experts": Experts.of, "rope_scaling": RopeScaling.of, "latent": LatentWidths.of,
                 "qk_norm": QKNorm.of, "attention": AttentionParts.of, "glu_clamp": GLUClamp.of,
                 "token_mixer": token_mixer_of}


def _setting(key: str, value) -> str:
    if value is None:
        return "None"
    if key in PIECE_READERS:
        return f"'{PIECE_READERS[key](value)}'"
    return f"{value:.4g}" if isinstance(value, float) else f"{value}"


def config_settings(config: dict, skip: str = "") -> str:
    """key=value for the settings a reader needs: the core ones, and every other that is not a default."""
    shown = [f"{key}={config[key]}" for key in CONFIG_SHOWN if key in config and key != skip]
    shown += [f"{key}={_setting(key, config[key])}" for key in CONFIG_EXTRAS
              if key != skip and config.get(key) not in (None, _DEFAULTS[key])]
    return " ".join(shown)


def _header(report: dict, lang: Lang) -> str:
    words = HEADINGS[lang]
    config = report["config"]
    settings = config_settings(config)
    if report["seed"] is not None:
        settings += f" seed={report['seed']}"
    lines = [f"blocktrace {report['blocktrace_version']}: {settings}"]
    weights = report.get("weights")
    if weights:
        lines.append(words["weights"].format(path=weights["path"], family=weights["family"], layer=weights["layer"],
                                             last=weights["n_layers"] - 1))
    if report["tokens"]:
        lines.append(f"{words['tokens']}: {' '.join(map(shown_token, report['tokens']))}")
    source = report.get("input")
    if source:
        lines.append(f"{words['input']}: {_shape(source['shape'])} {source['dtype']} ({source['source']})")
    return "\n".join(lines)


def steps_table(entries: list, lang: Lang, fmt: str) -> str:
    """The tutorial's table: one row per step (and the input x as row 0)."""
    words = HEADINGS[lang]
    headers = [words["index"], words["step"], words["operation"], words["shape"], *STAT_HEADINGS]
    rows = [
        [entry["index"], entry["name"], entry["operation"], _shape(entry["shape"]), *_stat_cells(entry["stats"])]
        for entry in entries
    ]
    if any(entry.get("flags") for entry in entries):  # the column appears only when a check fired
        headers.append("flags")
        for row, entry in zip(rows, entries):
            row.append(", ".join(entry.get("flags") or []))
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4f")


def _ramp(printed: str) -> str:
    """The mark of a weight as printed to 2 decimals (so one printed value always carries one mark, the one the
    legend gives its range), from its hundredths in integers: no float product lands on the wrong side of a tenth."""
    weight = float(printed)
    if not math.isfinite(weight):
        return "?"  # NaN or Inf: the cell's number says which
    index = round(weight * 100) * len(HEATMAP_RAMP) // 100
    return HEATMAP_RAMP[max(0, min(len(HEATMAP_RAMP) - 1, index))]


def _heat_cell(weight: float) -> str:
    printed = f"{weight:.2f}"
    return f"{printed} {_ramp(printed)}"


def _number(value, spec: str = ".4f") -> str:
    """A statistic as text; "n/a" when it could not be measured (None)."""
    return "n/a" if value is None else format(value, spec)


def heatmaps(report: dict, labels: Sequence[str], lang: Lang, fmt: str) -> str:
    words = HEADINGS[lang]
    attention = report["attention"]
    preview = attention["weights_first_sequence"]
    if preview is None:
        return words["heatmap_skipped"].format(tokens=attention["shape"][-1], limit=PREVIEW_MAX_TOKENS)
    batch_note = words["heatmap_batch"] if len(attention["shape"]) == 4 else ""
    blocks = []
    for head, matrix in enumerate(preview):
        rows = [[label, *(_heat_cell(w) for w in row)] for label, row in zip(labels, matrix)]
        title = words["heatmap"].format(head=head, batch_note=batch_note)
        blocks.append(title + "\n" + tabulate(rows, headers=["", *labels], tablefmt=fmt, stralign="right", disable_numparse=True))
    return "\n\n".join(blocks) + "\n" + words["heatmap_marks"].format(marks=_ramp_legend())


def _ramp_legend() -> str:
    """Each mark of HEATMAP_RAMP with the weights it stands for: '.' 0.1–0.2, ':' 0.2–0.3, … '@' 0.9–1."""
    n = len(HEATMAP_RAMP)
    return "  ".join(f"{mark} {round(k / n, 2):g}–{round((k + 1) / n, 2):g}" for k, mark in enumerate(HEATMAP_RAMP)
                     if mark != " ")


def attention_section(report: dict, labels: Sequence[str], lang: Lang, fmt: str) -> str:
    words = HEADINGS[lang]
    a = report["attention"]
    entropy = "  ".join(f"h{head}={value:.4f}" for head, value in enumerate(a["entropy_per_head"]))
    lines = [
        f"{words['attention']}:",
        f"attention_shape={_shape(a['shape'])}",
        f"future_weight_sum={a['future_weight_sum']:.4f}",
        words["entropy"].format(uniform=a["uniform_entropy"]) + f": {entropy}",
        words["max_weight"].format(weight=_number(a["max_weight"]), logit=_number(a["max_logit"])),
        "",
        heatmaps(report, labels, lang, fmt),
    ]
    return "\n".join(lines)


def values_section(report: dict, token_index: int, labels: Sequence[str], lang: Lang, fmt: str) -> str:
    entries = [report["input"], *report["steps"]]
    n = len(entries[0]["values"])
    title = HEADINGS[lang]["values"].format(n=n, index=token_index, label=labels[token_index])
    rows = [[entry["name"], *entry["values"]] for entry in entries]
    return title + "\n" + tabulate(rows, headers=["", *range(n)], tablefmt=fmt, floatfmt=".4f")


def measured_line(measured: dict, lang: Lang = Lang.EN) -> str:
    words, parts = HEADINGS[lang], []
    if measured["causal"] is not None:
        parts.append(words["causal"] if measured["causal"] else
                     words["not_causal"].format(leak=f"{measured['causal_leak']:.3g}"))
    if measured["norms"]:
        parts.append(f"{words['norms']}: " + ", ".join(f"{name} {kind}" for name, kind in measured["norms"].items()))
    return f"{words['measured']}: " + "; ".join(parts)


def _substeps_title(entries: list, lang: Lang = Lang.EN) -> str:
    words, names = HEADINGS[lang], {entry["name"] for entry in entries}
    if "attn.convolved" in names:
        return words["inside_conv"]
    if "attn.delta" in names:
        return words["inside_delta"]
    if "attn.scan" in names:
        return words["inside_mamba"]
    stage_of = {"attn.q_norm": words["after_qk_norm"], "attn.q_rope": words["after_rope"]}
    stages = [words["projected"]] + [stage_of[entry["name"]] for entry in entries if entry["name"] in stage_of]
    return words["inside_attn"].format(stages=words["then"].join(stages))


def routing_lines(routing: dict, labels: Sequence[str]) -> str:
    """What the router did: each expert's share of the token slots, its entropy and the two router losses."""
    k, experts = routing["per_token"], routing["experts"]
    shares = " ".join(f"{share:.2f}" for share in routing["load"])
    dead = routing["dead_experts"]
    return "\n".join([
        f"routing: {routing['tokens']} tokens, each to {k} of {experts} experts; share of the token slots by expert "
        f"(uniform {1 / experts:.2f}): {shares}" + (f"; no token: experts {', '.join(map(str, dead))}" if dead else ""),
        f"router entropy {routing['entropy']:.3f} (uniform {routing['uniform_entropy']:.3f}), load-balance loss "
        f"{routing['balance_loss']:.3f} ({k} balanced, {experts} all on {k}), z-loss {routing['z_loss']:.3g}, "
        f"largest |logit| {routing['max_logit']:.3g}",
        *(["experts chosen, largest weight first: " + "  ".join(
            f"{label}→{','.join(map(str, row))}" for label, row in zip(labels, routing["chosen"]))]
          if routing.get("chosen") else [])])


def explanations(report: dict, lang: Lang) -> str:
    config = report["config"]
    wiring = wiring_of(Placement(config["placement"]),
                       parallel_of(config.get("parallel_residual", False), config.get("one_norm", False)))
    lines = [f"{HEADINGS[lang]['why']}:"]
    lines += [f"{e['index']} {e['name']}: {explanation(lang, wiring, e['name'])}" for e in report["steps"]]
    return "\n".join(lines)


# Characters a terminal acts on instead of showing: bidirectional overrides reorder what follows them.
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def shown_token(token: str) -> str:
    """A token as the terminal should show it: control characters (an escape sequence, a newline) and bidi
    overrides written as escapes, never acted on; everything else — CJK included — as it is."""
    return "".join(_escaped(c) if unicodedata.category(c) == "Cc" or c in BIDI_CONTROLS else c for c in token)


def _escaped(character: str) -> str:
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def token_labels(report: dict) -> list[str]:
    return [shown_token(token) for token in report["tokens"] or []] or [f"t{i}" for i in range(report["input"]["shape"][-2])]


def render_run(
    report: dict,
    *,
    lang: Lang = Lang.EN,
    fmt: str = "simple",
    explain: bool = False,
    token_index: int = 0,
    steps: bool = False,
) -> str:
    """The whole `blocktrace run` text output for one report dict."""
    kind = ReportKind(report["kind"])
    if kind is ReportKind.STACK:
        return render_stack(report, lang=lang, fmt=fmt, explain=explain, steps=steps)
    if kind is ReportKind.SWEEP:
        return render_sweep(report, fmt=fmt, lang=lang)
    labels = token_labels(report)
    parts = [_header(report, lang), steps_table([report["input"], *report["steps"]], lang, fmt)]
    if report.get("attn_substeps"):
        parts.append(_substeps_title(report["attn_substeps"], lang) + "\n"
                     + steps_table(report["attn_substeps"], lang, fmt))
    if report.get("ffn_substeps"):
        parts.append(HEADINGS[lang]["inside_ffn"] + "\n"
                     + steps_table(report["ffn_substeps"], lang, fmt) + "\n" + routing_lines(report["routing"], labels))
    if explain:
        parts.append(explanations(report, lang))
    if "values" in report["input"]:
        parts.append(values_section(report, token_index, labels, lang, fmt))
    if report["attention"] is not None:
        parts.append(attention_section(report, labels, lang, fmt))
    if report.get("measured"):
        parts.append(measured_line(report["measured"], lang))
    if report.get("gradients"):
        parts.append(gradients_section(report["gradients"], fmt))
    if report.get("notes"):
        parts.append("\n".join(f"{HEADINGS[lang]['note']}: {say(note, lang)}" for note in report["notes"]))
    parts.append(f"block_shape_preserved={report['block_shape_preserved']}")
    return "\n\n".join(parts) + "\n"


def _findings_table(shown: list[dict], fmt: str = "simple") -> str:
    """One row per kind of finding: where it hit (layers, steps) and its worst instance."""
    kinds: dict[str, list[dict]] = {}
    for finding in shown:
        kinds.setdefault(finding["name"], []).append(finding)
    rows = []
    for name, hits in kinds.items():
        layers = sorted({f["layer"] for f in hits if f["layer"] is not None})
        steps = ", ".join(dict.fromkeys(f["step"] for f in hits if f["step"]))
        rows.append([hits[0]["level"].upper(), name, hits[0]["cause"], layer_ranges(layers) or "-", steps or "-",
                     len(hits), hits[0]["detail"]])
    return tabulate(rows, headers=["level", "finding", "cause", "layers", "steps", "times", "first"],
                    tablefmt=fmt, disable_numparse=True)


def _loss_line(report: dict) -> Optional[str]:
    if "loss_detail" not in report:
        return None
    detail = report["loss_detail"]
    if report.get("loss") is None:
        return f"loss: n/a ({report.get('loss_note')})"
    return (f"loss: {report['loss']:.4f} ({detail['kind'].replace('_', '-')} cross-entropy over {detail['tokens']} "
            f"predicted tokens; uniform guessing: log V = {detail['uniform']:.4f}; mean log Z {detail['log_z_mean']:.3g})")


def render_findings(report: dict, fail_on: Level, fmt: str = "simple") -> str:
    """`blocktrace check`: one row per kind of finding, the most likely cause with its evidence and advice,
    then what each finding means, its threshold and its source."""
    flags = report.get("flags") or []
    shown = [f for f in flags if f["level"] != Level.INFO.value]
    lines = [_model_header(report) if report["kind"] == ReportKind.MODEL.value else _header(report, Lang.EN), ""]
    loss = _loss_line(report)
    lines += [loss, ""] if loss else []
    infos = sorted({f["name"] for f in flags if f["level"] == Level.INFO.value})
    info_line = f"info (context, not a verdict): {', '.join(infos)}" if infos else ""
    notes = [f"note: {note}" for note in report.get("notes") or []]
    gradients = ["", gradients_section(report["gradients"], fmt)] if report.get("gradients") else []
    if not shown:  # --grad: the numbers the gradient checks judged, findings or none
        lines.append("no findings at warning or error level" + (f"\n{info_line}" if infos else ""))
        return "\n".join(lines + gradients + ([""] + notes if notes else [])) + "\n"
    counts = {level: sum(f["level"] == level for f in shown) for level in ("error", "warning")}
    kinds = len({f["name"] for f in shown})  # the table has a row per kind; its "times" column counts each
    of_kinds = f" of {kinds} kind{'s' if kinds > 1 else ''}" if kinds < len(shown) else ""
    lines += [f"{len(shown)} finding{'s' if len(shown) > 1 else ''}{of_kinds}: {counts['error']} error, "
              f"{counts['warning']} warning (exit 1 on {Level(fail_on).value} or worse)", "", _findings_table(shown, fmt)]
    diagnosis = report.get("diagnosis") or []
    if diagnosis:
        top = diagnosis[0]
        lines += ["", f"most likely: {top['cause'].replace('_', ' ')} — evidence: {top['evidence']}",
                  f"advice: {top['advice']}"]
        lines += [f"also possible: {d['cause'].replace('_', ' ')} — {d['evidence']}" for d in diagnosis[1:]]
    if info_line:
        lines += ["", info_line]
    lines += gradients
    lines.append("")
    for name in dict.fromkeys(f["name"] for f in shown):
        finding = next(f for f in shown if f["name"] == name)
        lines += [f"{name}: {finding['meaning']}", f"  threshold: {finding['threshold']}",
                  f"  source: {finding['source']}"]
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def _layers_that_differ(layers: list[dict]) -> list[str]:
    """One line per set of settings some traced layers have in place of the header's, naming those layers."""
    groups: dict[str, list[int]] = {}
    for entry in layers:
        differences = entry.get("config_differences") or {}
        if differences:
            said = " ".join(f"{key}={_setting(key, value)}" for key, value in differences.items())
            groups.setdefault(said, []).append(entry["layer"])
    return [f"  {'layers' if len(found) > 1 else 'layer'} {layer_ranges(found)}: {said}"
            for said, found in groups.items()]


def _model_header(report: dict) -> str:
    config, weights, source = report["config"], report["weights"], report["input"]
    traced = report["traced_layers"]
    span = f"layers {traced[0]}–{traced[-1]}" if len(traced) > 1 else f"layer {traced[0]}"
    differ = _layers_that_differ(report["layers"])
    return "\n".join([
        f"blocktrace {report['blocktrace_version']}: {config_settings(config)}",
        *(["where a layer's block differs from that:", *differ] if differ else []),
        f"weights: {weights['path']} ({weights['family']}), {weights['n_layers']} layers, checked: {span}",
        f"input: {source['sequences']} sequence{'s' if source['sequences'] > 1 else ''}, {source['tokens']} tokens",
    ])


def gradients_section(gradients: dict, fmt: str) -> str:
    """Per layer: ‖∂L/∂output‖ of each step, and ‖mean ∂L/∂W‖_F of each weight matrix."""
    layers = gradients["layers"]
    step_names = list(layers[0]["step_grad_norms"])
    step_rows = [[layer["layer"], *(layer["step_grad_norms"][n] for n in step_names)] for layer in layers]
    # None where a layer has no such matrix (a mixture's FFN, latent attention's K and V): shown as —, and the column
    # still formatted as numbers
    weight_rows = [[layer["layer"], *(layer["weight_grad_norms"].get(n) for n in WEIGHT_NAMES)] for layer in layers]
    batches = gradients["batches"]
    if gradients.get("loss_kind", "xiong") == "xiong":
        loss = (f"cross-entropy of a seeded random readout against Zipf-distributed targets; {batches} "
                f"mini-batch{'es' if batches > 1 else ''}")
    else:
        loss = f"the model's own {gradients['loss_kind'].replace('_', '-')} loss on the input"
    lines = [
        f"gradients (loss {gradients['loss']:.4f}: {loss}):",
        "‖∂L/∂output‖ of each step",
        tabulate(step_rows, headers=["layer", *step_names], tablefmt=fmt, floatfmt=".4g"),
        "",
        "‖∂L/∂W‖_F of each weight matrix (the gradient averaged over the mini-batches, then the norm)",
        tabulate(weight_rows, headers=["layer", *WEIGHT_NAMES], tablefmt=fmt, floatfmt=".4g", missingval="—"),
    ]
    return "\n".join(lines)


def layers_table(report: dict, fmt: str) -> str:
    rows = [["input", report["input"]["stats"]["rms"], report["input"]["sq_norm_per_d"], "", ""]]
    rows += [[layer["layer"], layer["rms"], layer["sq_norm_per_d"], layer["attn_share"], layer["ffn_share"]]
             for layer in report["layers"]]
    headers = ["layer", "rms", "‖x‖²/d", "attn share", "ffn share"]
    layer_flags = [sorted({name for step in layer["steps"] for name in step.get("flags") or []})
                   for layer in report["layers"]]
    if any(layer_flags):  # as in the step table: the column appears only when a check fired
        headers.append("flags")
        rows[0].append("")
        for row, names in zip(rows[1:], layer_flags):
            row.append(", ".join(names))
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4f")


def render_stack(report: dict, *, lang: Lang = Lang.EN, fmt: str = "simple", explain: bool = False,
                 steps: bool = False) -> str:
    parts = [
        _header(report, lang),
        f"{report['n_layers']} blocks; after each: the residual stream's rms and ‖x‖²/d, and each branch's "
        "share Var[f(x)] / Var[x + f(x)]",
        layers_table(report, fmt),
    ]
    if steps:
        for layer in report["layers"]:
            parts.append(f"layer {layer['layer']}\n" + steps_table(layer["steps"], lang, fmt))
    if explain:
        parts.append(explanations({"config": report["config"], "steps": report["layers"][0]["steps"]}, lang))
    if report.get("gradients"):
        parts.append(gradients_section(report["gradients"], fmt))
    parts.append(f"block_shape_preserved={report['block_shape_preserved']}")
    return "\n\n".join(parts) + "\n"


def render_sweep(report: dict, *, fmt: str = "simple", lang: Lang = Lang.EN) -> str:
    rows = [[row["depth"], row["loss"], *(row["last_layer"][n] for n in WEIGHT_NAMES)] for row in report["sweep"]]
    title = ("per depth N: ‖∂L/∂W‖_F of layer N's weight matrices (Xiong et al. 2020, Theorem 1: "
             "flat in N for Post-LN, falling for Pre-LN)")
    table = tabulate(rows, headers=["depth", "loss", *WEIGHT_NAMES], tablefmt=fmt, floatfmt=".4g")
    return "\n\n".join([_header(report, lang), title, table]) + "\n"
