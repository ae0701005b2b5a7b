"""A run against a healthy one (`track RUN --against REFERENCE`): where they part, beyond what a seed explains.

Both are timelines (a Watch's, or `track --out`'s), or both checkpoint series traced on one input, and
their records are matched by step. At each matched step the loss and, per layer, the residual stream's
rms, the largest attention logit, the block's gradient norm and its largest ‖ΔW‖/‖W‖ are set side by
side. Two runs of one recipe that differ only in their seed — other weights at initialisation, other
batches — stay within SEED_FACTOR of each other on each of those and within SEED_LOSS nats on the loss
(measured on the failure benchmark's seed pairs: benchmarks/FAILURES.md). Beyond that the runs part;
a quantity present in one run and missing or zero in the other (a gradient that stopped) parts them too.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from blocktrace.errors import InputError

SEED_FACTOR = 4.0  # per-layer quantities of two seeds of one recipe, each the larger over the smaller
SEED_LOSS = 0.5  # nats between two seeds' losses at one step (a Watch's loss is one batch's: measured up to 0.34)


def _largest_update(layer: dict) -> Optional[float]:
    ratios = [w["update_ratio"] for w in (layer.get("weights") or {}).values()
              if isinstance(w.get("update_ratio"), (int, float))]
    return max(ratios) if ratios else None


# (name, how a layer entry holds it, a floor added to both magnitudes). Attention logits start near 0 and may be
# negative: they are compared as |logit| + 1, on the scale of a logit at initialisation.
LAYER_QUANTITIES: tuple[tuple[str, Callable[[dict], Optional[float]], float], ...] = (
    ("rms", lambda layer: layer.get("rms"), 0.0),
    ("max_logit", lambda layer: layer.get("max_logit"), 1.0),
    ("grad_norm", lambda layer: layer.get("grad_norm"), 0.0),
    ("update_ratio", _largest_update, 0.0),
)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _factor(value, reference, floor: float = 0.0) -> Optional[float]:
    """How far apart two quantities are (≥ 1): the larger magnitude over the smaller, each plus `floor`; inf when
    one is there and the other missing, zero or not finite; None when neither says anything."""
    sizes = [abs(v) + floor if _number(v) and math.isfinite(v) else None for v in (value, reference)]
    if all(size is None or size == 0 for size in sizes):
        return None
    if any(size is None or size == 0 for size in sizes):
        return math.inf
    return max(sizes) / min(sizes)


def _parted_layers(entry: dict, reference: dict) -> list[dict]:
    theirs = {layer["layer"]: layer for layer in reference["layers"]}
    parted = []
    for layer in entry["layers"]:
        other = theirs.get(layer["layer"])
        if other is None:
            continue
        for name, read, floor in LAYER_QUANTITIES:
            factor = _factor(read(layer), read(other), floor)
            if factor is not None and factor > SEED_FACTOR:
                parted.append({"layer": layer["layer"], "quantity": name, "run": read(layer),
                               "reference": read(other), "factor": factor})
    return parted


def _loss_parted(entry: dict, reference: dict) -> Optional[dict]:
    mine, theirs = entry.get("loss"), reference.get("loss")
    if not all(isinstance(v, (int, float)) for v in (mine, theirs)):
        return None
    if math.isfinite(mine) and math.isfinite(theirs) and abs(mine - theirs) <= SEED_LOSS:
        return None
    if not math.isfinite(mine) and not math.isfinite(theirs):
        return None
    return {"layer": None, "quantity": "loss", "run": mine, "reference": theirs,
            "factor": mine - theirs if math.isfinite(mine - theirs) else math.inf}


IDENTITY = (("family", "family"), ("model", "model class"), ("width", "width (d_model)"), ("vocab", "vocabulary"),
            ("kinds", "kinds of weight tensor"))


def _kinds(entry: dict) -> Optional[str]:
    """The kinds of weight tensor a record's layers hold (attn_qkv, router, …): a family's signature."""
    kinds = {kind for layer in entry["layers"] for kind in (layer.get("weights") or {})}
    return ", ".join(sorted(kinds)) if kinds else None


def _identity(records: list[dict]) -> dict:
    """What a run is a run of: its depth, and the family, model class, width, vocabulary and kinds of weight tensor
    its records say."""
    found = {"layers": max((len(entry["layers"]) for entry in records), default=0)}
    for key, _ in IDENTITY:
        values = {_kinds(entry) if key == "kinds" else entry.get(key) for entry in records} - {None}
        found[key] = values.pop() if len(values) == 1 else None
    return found


def require_comparable(run: list[dict], reference: list[dict], reference_name) -> None:
    """A reference judges a run only if both are runs of one model: refused, by name, when either has no layer
    records or they differ in depth, family, model class, width or vocabulary (what each says of itself)."""
    mine, theirs = _identity(run), _identity(reference)
    for who, identity in (("the run", mine), (f"--against {reference_name}", theirs)):
        if identity["layers"] == 0:
            raise InputError(f"{who} has no layer records: there is nothing to set side by side")
    if mine["layers"] != theirs["layers"]:
        raise InputError(f"--against {reference_name} has {theirs['layers']} layers and the run {mine['layers']}: "
                         "compare runs of one model")
    for key, words in IDENTITY:
        if mine[key] is not None and theirs[key] is not None and mine[key] != theirs[key]:
            raise InputError(f"--against {reference_name} is a run of another model: its {words} is {theirs[key]}, "
                             f"the run's {mine[key]}; compare runs of one model")


def compare_runs(run: list[dict], reference: list[dict]) -> dict:
    """Per matched step, what parted the runs; the first step and layer where they part (None: they never do)."""
    by_step = {entry["step"]: entry for entry in reference}
    steps = []
    for entry in run:
        other = by_step.get(entry["step"])
        if other is None:
            continue
        loss = _loss_parted(entry, other)
        steps.append({"step": entry["step"], "loss": entry.get("loss"), "reference_loss": other.get("loss"),
                      "parted": ([loss] if loss else []) + _parted_layers(entry, other)})
    first = next(({"step": s["step"], **min(s["parted"], key=lambda p: (p["layer"] is None, p["layer"] or 0))}
                  for s in steps if s["parted"]), None)
    return {"matched": len(steps), "seed_factor": SEED_FACTOR, "seed_loss": SEED_LOSS, "steps": steps,
            "first_parted": first,
            "run_only": sorted({e["step"] for e in run} - set(by_step)),
            "reference_only": sorted(set(by_step) - {e["step"] for e in run})}
