"""`blocktrace diff` as a table: one row per step, and the first step beyond tolerance."""

from __future__ import annotations

from tabulate import tabulate


def _row(step: dict) -> list:
    within = "yes" if step["within"] else "no"
    if "missing_in" in step:
        return [step["name"], f"missing in {step['missing_in']}", "", "", "", within]
    if step["shape_a"] != step["shape_b"]:
        return [step["name"], f"{step['shape_a']} vs {step['shape_b']}", "", "", "", within]
    mismatch = step.get("non_finite_mismatch") or 0
    shape = str(step["shape_a"]) + (f" ({mismatch} NaN/Inf differ)" if mismatch else "")
    cells = [step["max_abs_diff"], step["max_rel_diff"], step["cosine"]]
    return [step["name"], shape, *("n/a" if value is None else value for value in cells), within]


def _only_in_one(report: dict) -> str:
    """A line per side for what only that side traced (compared with nothing, so no verdict of its own)."""
    lines = []
    for side in ("A", "B"):
        names = [step["name"] for step in report["only_in_one"] if step["only_in"] == side]
        if names:
            lines.append(f"only in {side}, not compared: {', '.join(names)}\n")
    return "".join(lines)


def render_diff(report: dict, fmt: str) -> str:
    rows = [_row(step) for step in report["steps"]]
    table = tabulate(rows, headers=["step", "shape", "max|Δ|", "max|Δ| / max|B|", "cosine", "within"],
                     tablefmt=fmt, floatfmt=".3g")
    verdict = (f"first step beyond atol={report['atol']:g}, rtol={report['rtol']:g}: {report['first_divergence']}"
               if report["diverged"] else f"every step within atol={report['atol']:g}, rtol={report['rtol']:g}")
    return f"A: {report['a']}\nB: {report['b']}\n\n{table}\n\n{_only_in_one(report)}{verdict}\n"
