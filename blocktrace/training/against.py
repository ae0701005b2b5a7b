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
from typing import Callable, Iterable, Iterator, Optional

from blocktrace.errors import InputError
from blocktrace.training.thinning import Kept, how_thinned

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


class Identity:
    """What a run is a run of, gathered record by record: its depth, and the family, model class, width,
    vocabulary and kinds of weight tensor its records say."""

    def __init__(self):
        self.layers = 0
        self.values: dict[str, set] = {key: set() for key, _ in IDENTITY}

    def add(self, entry: dict) -> None:
        self.layers = max(self.layers, len(entry["layers"]))
        for key, values in self.values.items():
            value = _kinds(entry) if key == "kinds" else entry.get(key)
            if value is not None and len(values) < 2:  # a second value already says "not one": no need for more
                values.add(value)

    def found(self) -> dict:
        return {"layers": self.layers, **{key: next(iter(values)) if len(values) == 1 else None
                                          for key, values in self.values.items()}}


def _identity(records: Iterable[dict]) -> dict:
    identity = Identity()
    for entry in records:
        identity.add(entry)
    return identity.found()


def require_comparable(run: list[dict], reference: list[dict], reference_name) -> None:
    """A reference judges a run only if both are runs of one model: refused, by name, when either has no layer
    records or they differ in depth, family, model class, width or vocabulary (what each says of itself)."""
    _refuse_unlike(_identity(run), _identity(reference), reference_name)


def _refuse_unlike(mine: dict, theirs: dict, reference_name) -> None:
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


def _merged(run: Iterable[dict], reference: Iterable[dict]) -> Iterator[tuple[Optional[dict], Optional[dict]]]:
    """(run record, reference record) by step, both in step order: one side None where the other has the step."""
    run, reference = iter(run), iter(reference)
    mine, theirs = next(run, None), next(reference, None)
    while mine is not None or theirs is not None:
        if theirs is None or (mine is not None and mine["step"] < theirs["step"]):
            yield mine, None
            mine = next(run, None)
        elif mine is None or theirs["step"] < mine["step"]:
            yield None, theirs
            theirs = next(reference, None)
        else:
            yield mine, theirs
            mine, theirs = next(run, None), next(reference, None)


def _first_parted(step: dict) -> Optional[dict]:
    if not step["parted"]:
        return None
    return {"step": step["step"], **min(step["parted"], key=lambda p: (p["layer"] is None, p["layer"] or 0))}


def _comparison(run: Iterable[dict], reference: Iterable[dict]) -> tuple[dict, dict, dict]:
    """(the comparison, the run's identity, the reference's), in one pass over both, one record of each at a time:
    its lists thinned as a long run's records are (training/thinning.py), the first parted step always kept."""
    steps, run_only, reference_only = Kept(), Kept(), Kept()
    mine, theirs = Identity(), Identity()
    first = None
    for entry, other in _merged(run, reference):
        for identity, record in ((mine, entry), (theirs, other)):
            if record is not None:
                identity.add(record)
        if other is None or entry is None:
            (run_only.add(entry["step"]) if other is None else reference_only.add(other["step"]))
            continue
        loss = _loss_parted(entry, other)
        step = {"step": entry["step"], "loss": entry.get("loss"), "reference_loss": other.get("loss"),
                "parted": ([loss] if loss else []) + _parted_layers(entry, other)}
        parted_first = first is None and bool(step["parted"])
        first = _first_parted(step) if parted_first else first
        steps.add(step, keep=parted_first)
    comparison = {"matched": steps.seen, "seed_factor": SEED_FACTOR, "seed_loss": SEED_LOSS, "steps": steps.items(),
                  "first_parted": first, "run_only": run_only.items(), "reference_only": reference_only.items()}
    if any(kept.thinned for kept in (steps, run_only, reference_only)):
        comparison["thinning"] = {"steps_kept": len(comparison["steps"]), "run_only": run_only.seen,
                                  "reference_only": reference_only.seen,
                                  "how": how_thinned(max(kept.every for kept in (steps, run_only, reference_only)))}
    return comparison, mine.found(), theirs.found()


def compare_runs(run: Iterable[dict], reference: Iterable[dict]) -> dict:
    """Per matched step, what parted the runs; the first step and layer where they part (None: they never do).
    Both in step order, read one record at a time."""
    return _comparison(run, reference)[0]


def compared_runs(run: Iterable[dict], reference: Iterable[dict], reference_name) -> dict:
    """compare_runs, refused (require_comparable) when the two are runs of different models."""
    comparison, mine, theirs = _comparison(run, reference)
    _refuse_unlike(mine, theirs, reference_name)
    return comparison
