"""`blocktrace compare` as text: the two variants side by side, their differences, and why."""

from __future__ import annotations

from tabulate import tabulate

from blocktrace.diagnose.compare import Phrasing, describe
from blocktrace.render.text import _shape, config_settings, explanations, gradients_section, shown_token, steps_table
from blocktrace.render.words import COMPARE_WORDS, HEADINGS, NOTES_ZH, VALUE_SENTENCES_ZH
from blocktrace.vocab import Lang, ReportKind


def _title(report: dict, lang: Lang) -> str:
    words, headings = COMPARE_WORDS[lang], HEADINGS[lang]
    a, b = report["values"]
    variant = report["variants"][0]["report"]
    config = dict(variant["config"])
    common = config_settings(config, skip=report["axis"])
    lines = [words["title"].format(axis=report["axis"], a=a, b=b),
             f"{words['common']}: {common}" + (f" seed={report['seed']}" if report["seed"] is not None else "")]
    if report["weights"]:
        w = report["weights"]
        lines.append(words["weights"].format(path=w["path"], family=w["family"], layer=w["layer"],
                                             last=w["n_layers"] - 1))
    if report["tokens"]:
        lines.append(f"{headings['tokens']}: {' '.join(map(shown_token, report['tokens']))}")
    if "input" in variant:
        source = variant["input"]
        lines.append(f"{headings['input']}: {_shape(source['shape'])} {source['dtype']} ({source['source']})")
    return "\n".join(lines)


def _notes(report: dict, lang: Lang) -> list[str]:
    """What differs: the report's own sentences (English), or the same said in Chinese from the same numbers."""
    if lang is Lang.EN:
        return report["notes"]
    return describe(report["variants"], report["differences"] or None, Phrasing(VALUE_SENTENCES_ZH, **NOTES_ZH))


def _block_table(report: dict, fmt: str, lang: Lang) -> str:
    """One row per step of either variant (sandwich wiring has two more), in the longer one's order."""
    (a, b), reports = report["values"], [v["report"] for v in report["variants"]]
    by_name = [{step["name"]: step for step in r["steps"]} for r in reports]
    names = list(dict.fromkeys([*max(by_name, key=len), *by_name[0], *by_name[1]]))
    diffs = {d["name"]: d for d in report["differences"]["steps"]}
    rows = []
    for name in names:
        cells = []
        for steps in by_name:
            step = steps.get(name)
            cells += ["", "", "", ""] if step is None else \
                [step["index"], step["operation"], step["stats"]["rms"], step["stats"]["std"]]
        diff = diffs.get(name, {})
        rows.append([name, *cells, diff.get("max_abs_diff", ""), diff.get("cosine", "")])
    step, operation = COMPARE_WORDS[lang]["step"], COMPARE_WORDS[lang]["operation"]
    headers = [step, f"{a} #", f"{a} {operation}", f"{a} rms", f"{a} std",
               f"{b} #", f"{b} {operation}", f"{b} rms", f"{b} std", "max|Δ|", "cosine"]
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4f")


def _stack_table(report: dict, fmt: str) -> str:
    (a, b), reports = report["values"], [v["report"] for v in report["variants"]]
    diffs = report["differences"]["layers"]
    rows = [["input", reports[0]["input"]["sq_norm_per_d"], reports[1]["input"]["sq_norm_per_d"], "", "", "", "", "", ""]]
    for la, lb, d in zip(reports[0]["layers"], reports[1]["layers"], diffs):
        rows.append([la["layer"], la["sq_norm_per_d"], lb["sq_norm_per_d"], la["attn_share"], lb["attn_share"],
                     la["ffn_share"], lb["ffn_share"], d["max_abs_diff"], d["cosine"]])
    headers = ["layer", f"{a} ‖x‖²/d", f"{b} ‖x‖²/d", f"{a} attn share", f"{b} attn share",
               f"{a} ffn share", f"{b} ffn share", "max|Δ|", "cosine"]
    return tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4f")


def _sweep_table(report: dict, fmt: str) -> str:
    (a, b), reports = report["values"], [v["report"] for v in report["variants"]]
    rows = [[ra["depth"], ra["last_layer"]["ffn_w2"], rb["last_layer"]["ffn_w2"],
             ra["last_layer"]["ffn_w1"], rb["last_layer"]["ffn_w1"], ra["loss"], rb["loss"]]
            for ra, rb in zip(reports[0]["sweep"], reports[1]["sweep"])]
    headers = ["depth", f"{a} ffn_w2", f"{b} ffn_w2", f"{a} ffn_w1", f"{b} ffn_w1", f"{a} loss", f"{b} loss"]
    title = ("per depth N: ‖∂L/∂W‖_F of layer N's FFN matrices (Xiong et al. 2020, Theorem 1: "
             "flat in N for Post-LN, falling for Pre-LN)")
    return title + "\n" + tabulate(rows, headers=headers, tablefmt=fmt, floatfmt=".4g")


def render_compare(report: dict, *, fmt: str = "simple", lang: Lang = Lang.EN, steps: bool = False,
                   explain: bool = False) -> str:
    words = COMPARE_WORDS[lang]
    parts = [_title(report, lang)]
    kind = ReportKind(report["variants"][0]["report"]["kind"])
    if kind is ReportKind.SWEEP:
        parts.append(_sweep_table(report, fmt))
    elif kind is ReportKind.BLOCK:
        parts.append(_block_table(report, fmt, lang))
        if explain:  # each variant's steps in its own wiring's words: where the two orders part
            parts += [words["why"].format(value=entry["value"]) + "\n" +
                      explanations(entry["report"], lang).split("\n", 1)[1] for entry in report["variants"]]
    else:
        parts.append(_stack_table(report, fmt) + "\n" + words["columns"])
        if steps:
            for entry in report["variants"]:
                for layer in entry["report"]["layers"]:
                    parts.append(f"{entry['value']}, layer {layer['layer']}\n" + steps_table(layer["steps"], lang, fmt))
    for entry in report["variants"]:
        gradients = entry["report"].get("gradients")
        if gradients:
            parts.append(f"{entry['value']}: " + gradients_section(gradients, fmt))
    if report["differences"]:
        out = report["differences"]["output"]
        parts.append(f"{words['output']}: max|Δ|={out['max_abs_diff']:.4f} cosine={out['cosine']:.4f}")
    parts.append(f"{words['differs']}:\n" + "\n".join(f"- {note}" for note in _notes(report, lang)))
    return "\n\n".join(parts) + "\n"
