"""`blocktrace diff A B`: two trace files step by step — "my implementation against the reference".

Steps are compared in A's execution order (its `step_order` metadata), after the input `x`
and before `attn_weights`. A step is within tolerance when every element satisfies
|a − b| ≤ atol + rtol·|b| (numpy's allclose); the first step that is not is named.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.errors import InputError


def _trace_file(path: Path) -> tuple[Checkpoint, list[str]]:
    checkpoint = Checkpoint(path)
    order = checkpoint.metadata().get("step_order")
    if order is None:
        raise InputError(f"{path} is not a blocktrace trace file (no step_order in its metadata): "
                         "make one with `blocktrace run --save` or blocktrace.tracefile.save_trace")
    return checkpoint, json.loads(order)


def compare_step(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> dict:
    if a.shape != b.shape:
        return {"shape_a": list(a.shape), "shape_b": list(b.shape), "max_abs_diff": None, "max_rel_diff": None,
                "cosine": None, "within": False}
    from blocktrace.diagnose.compare import difference

    measured = difference(a, b)
    worst, largest = measured["max_abs_diff"], b.double().abs().max().item()
    return {
        "shape_a": list(a.shape), "shape_b": list(b.shape),
        "max_abs_diff": worst,
        "max_rel_diff": worst / largest if largest > 0 else (0.0 if worst == 0 else float("inf")),
        "cosine": None if math.isnan(measured["cosine"]) else measured["cosine"],  # undefined for a zero tensor
        "within": bool(torch.all((a.double() - b.double()).abs() <= atol + rtol * b.double().abs())),
    }


def diff_traces(path_a: Path, path_b: Path, atol: float = 1e-5, rtol: float = 1e-4) -> dict:
    a, order = _trace_file(path_a)
    b, _ = _trace_file(path_b)
    names = [name for name in ["x", *order, "attn_weights"] if name in a]
    steps = []
    for name in names:
        if name not in b:
            steps.append({"name": name, "missing_in_b": True, "within": False})
            continue
        steps.append({"name": name, **compare_step(a.get(name), b.get(name), atol, rtol)})
    first = next((step["name"] for step in steps if not step["within"]), None)
    return {"schema": 1, "kind": "diff", "a": str(path_a), "b": str(path_b), "atol": atol, "rtol": rtol,
            "steps": steps, "first_divergence": first, "diverged": first is not None}


def render_diff(report: dict, fmt: str) -> str:
    from tabulate import tabulate

    rows = []
    for step in report["steps"]:
        if step.get("missing_in_b"):
            rows.append([step["name"], "missing in B", "", "", "", "no"])
        elif step["max_abs_diff"] is None:
            rows.append([step["name"], f"{step['shape_a']} vs {step['shape_b']}", "", "", "", "no"])
        else:
            rows.append([step["name"], str(step["shape_a"]), step["max_abs_diff"], step["max_rel_diff"],
                         step["cosine"], "yes" if step["within"] else "no"])
    table = tabulate(rows, headers=["step", "shape", "max|Δ|", "max|Δ| / max|B|", "cosine", "within"],
                     tablefmt=fmt, floatfmt=".3g")
    verdict = (f"first step beyond atol={report['atol']:g}, rtol={report['rtol']:g}: {report['first_divergence']}"
               if report["diverged"] else f"every step within atol={report['atol']:g}, rtol={report['rtol']:g}")
    return f"A: {report['a']}\nB: {report['b']}\n\n{table}\n\n{verdict}\n"
