"""`blocktrace diff A B`: two trace files step by step — "my implementation against the reference".

Every step of either file is compared, in A's execution order (its `step_order` metadata),
then steps only B has; the input `x` first and `attn_weights` last. A step is within
tolerance when both files hold it with the same shape, their non-finite values sit at the
same places with the same values (a NaN equals a NaN there: a trace with NaN does not
differ from itself), and every finite pair satisfies |a − b| ≤ atol + rtol·|b| (numpy's
allclose). The first step that is not is named. What only one side traced — attention
weights that the other's fused kernel never showed, a step only its own order names — is
said under "only_in_one" and compared with nothing; a step both orders name that one file
lacks is a divergence (that file does not hold the trace it claims).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from blocktrace.diagnose.compare import difference
from blocktrace.errors import InputError
from blocktrace.sources.tracefile import open_trace
from blocktrace.vocab import SCHEMA_VERSION, ReportKind


def _same_non_finite(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Where both are finite, and how many places hold a non-finite value in one but not the other."""
    finite_a, finite_b = torch.isfinite(a), torch.isfinite(b)
    both_nan = torch.isnan(a) & torch.isnan(b)
    same_inf = torch.isinf(a) & torch.isinf(b) & (a == b)
    agree = (finite_a & finite_b) | both_nan | same_inf
    return finite_a & finite_b, int((~agree).sum())


def compare_step(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> dict:
    shapes = {"shape_a": list(a.shape), "shape_b": list(b.shape)}
    if a.shape != b.shape:
        return {**shapes, "max_abs_diff": None, "max_rel_diff": None, "cosine": None, "non_finite_mismatch": None,
                "within": False}
    a, b = a.double(), b.double()
    finite, mismatch = _same_non_finite(a, b)
    fa, fb = a[finite], b[finite]
    if fa.numel() == 0:
        return {**shapes, "max_abs_diff": None, "max_rel_diff": None, "cosine": None,
                "non_finite_mismatch": mismatch, "within": mismatch == 0}
    measured = difference(fa, fb)
    worst, largest = measured["max_abs_diff"], fb.abs().max().item()
    return {
        **shapes,
        "max_abs_diff": worst,
        "max_rel_diff": worst / largest if largest > 0 else (0.0 if worst == 0 else math.inf),
        "cosine": None if math.isnan(measured["cosine"]) else measured["cosine"],  # undefined for a zero tensor
        "non_finite_mismatch": mismatch,
        "within": mismatch == 0 and bool(torch.all((fa - fb).abs() <= atol + rtol * fb.abs())),
    }


def diff_traces(path_a: Path, path_b: Path, atol: float = 1e-5, rtol: float = 1e-4) -> dict:
    a, order_a = open_trace(path_a)
    b, order_b = open_trace(path_b)
    names = list(dict.fromkeys(["x", *order_a, *order_b, "attn_weights"]))
    claimed_by_both = {"x", *(set(order_a) & set(order_b))}
    steps, only_in_one = [], []
    for name in names:
        in_a, in_b = name in a, name in b
        if not (in_a or in_b):
            continue
        if not (in_a and in_b):
            side, other = ("A", "B") if in_a else ("B", "A")
            if name in claimed_by_both:  # both ran the step and one file lacks it: that file is not the trace
                steps.append({"name": name, "missing_in": other, "within": False})
            else:  # one side traced what the other did not (attention weights a fused kernel hides, its own step)
                only_in_one.append({"name": name, "only_in": side})
            continue
        steps.append({"name": name, **compare_step(a.get(name), b.get(name), atol, rtol)})
    if only_in_one and not any("missing_in" not in step for step in steps):
        raise InputError(f"{path_a} and {path_b} hold no traced step in common (only in one: "
                         f"{', '.join(step['name'] for step in only_in_one)}): there is nothing to compare")
    if not steps:
        raise InputError(f"neither {path_a} nor {path_b} holds a traced step (x, {', '.join(order_a[:3]) or 'norm1'} …): "
                         "there is nothing to compare; save traces with `blocktrace run --save`")
    first = next((step["name"] for step in steps if not step["within"]), None)
    return {"schema": SCHEMA_VERSION, "kind": ReportKind.DIFF.value, "a": str(path_a), "b": str(path_b), "atol": atol, "rtol": rtol,
            "steps": steps, "only_in_one": only_in_one, "first_divergence": first, "diverged": first is not None}
