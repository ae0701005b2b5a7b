"""`blocktrace track` as text: one row per checkpoint (or watch record), then the per-layer story.

The first table has each record's loss and, per quantity, its worst layer (so a row reads
"the largest logit is 312 in layer 2"); the tables after it give every layer, so a layer that
drifts can be followed step by step; the last line names the first sign of trouble.
"""

from __future__ import annotations

from typing import Callable, Optional

from tabulate import tabulate

from blocktrace.training.track import notes_of
from blocktrace.vocab import Level

KIND_ORDER = ("attn_qkv", "attn_q", "attn_k", "attn_v", "attn_o", "ffn_w1", "ffn_w2", "router", "norm")
# Per-layer quantities: (title, what a layer entry holds, whether the worst is the largest)
LAYER_QUANTITIES = (
    ("residual stream rms after the block", lambda layer: layer.get("rms"), True),
    ("largest attention logit", lambda layer: layer.get("max_logit"), True),
    ("lowest head entropy (nats)", lambda layer: layer.get("min_entropy"), False),
    ("gradient norm of the block's parameters", lambda layer: layer.get("grad_norm"), True),
)


def _busiest(layer: dict) -> Optional[float]:
    load = (layer.get("routing") or {}).get("load")
    return max(load) if load else None


# A mixture of experts' router (the load-balance loss is k when balanced, E when every token goes to the same k)
ROUTING_QUANTITIES = (
    ("router load-balance loss", lambda layer: (layer.get("routing") or {}).get("balance_loss"), True),
    ("busiest expert's share of the token slots", _busiest, True),
    ("router entropy (nats)", lambda layer: (layer.get("routing") or {}).get("entropy"), False),
)
ROUTING_HEADERS = ("max balance loss", "busiest expert", "min router entropy")


def _cell(value, spec: str = ".4g") -> str:
    return "—" if value is None else format(value, spec)


def _worst(layers: list[dict], read: Callable, largest: bool) -> str:
    """The worst layer's value, as "value Lk"."""
    values = [(read(layer), layer["layer"]) for layer in layers if read(layer) is not None]
    if not values:
        return "—"
    value, layer = (max if largest else min)(values, key=lambda pair: pair[0] if pair[0] == pair[0] else float("inf"))
    return f"{_cell(value)} L{layer}"


def _largest_update(layers: list[dict]) -> str:
    """The largest ‖ΔW‖/‖W‖ of any kind in any layer, as "ratio kind Lk"."""
    found = [(w["update_ratio"], kind, layer["layer"]) for layer in layers
             for kind, w in (layer.get("weights") or {}).items() if w.get("update_ratio") is not None]
    if not found:
        return "—"
    ratio, kind, layer = max(found)
    return f"{ratio:.3g} {kind} L{layer}"


NEW_FINDINGS_SHOWN = 3  # per row; the rest are counted (--json has them all)


def _new_findings(entry: dict) -> str:
    shown = [f for f in entry.get("new_flags") or [] if f["level"] != Level.INFO.value]
    names = [f"{f['name']} L{f['layer']}" if f.get("layer") is not None else f["name"] for f in shown]
    more = len(names) - NEW_FINDINGS_SHOWN
    return ", ".join(names[:NEW_FINDINGS_SHOWN]) + (f" (+{more} more)" if more > 0 else "")


def _routed(records: list[dict]) -> bool:
    return any(layer.get("routing") for entry in records for layer in entry["layers"])


def summary_table(records: list[dict], fmt: str) -> str:
    with_log, routed = any(entry.get("log") for entry in records), _routed(records)
    headers = ["step", "loss"]
    if with_log:
        headers += ["log loss", "log lr", "log grad norm"]
    headers += ["max rms", "max logit", "min entropy", *(ROUTING_HEADERS if routed else ()), "‖ΔW‖/‖W‖ (largest)",
                "new findings"]
    rows = []
    for entry in records:
        layers = entry["layers"]
        row = [entry["step"], _cell(entry.get("loss"), ".4f")]
        if with_log:
            log = entry.get("log") or {}
            row += [_cell(log.get("loss"), ".4f"), _cell(log.get("lr"), ".3g"), _cell(log.get("grad_norm"), ".4g")]
        shown = LAYER_QUANTITIES[:3] + (ROUTING_QUANTITIES if routed else ())
        row += [_worst(layers, quantity, largest) for _, quantity, largest in shown]
        row += [_largest_update(layers), _new_findings(entry)]
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)


def _layer_tables(records: list[dict], fmt: str) -> list[str]:
    n_layers = max(len(entry["layers"]) for entry in records)
    headers = ["step", *(f"L{k}" for k in range(n_layers))]
    sections = []
    for title, read, _ in LAYER_QUANTITIES + ROUTING_QUANTITIES:
        rows = [[entry["step"], *(_cell(read(layer)) for layer in entry["layers"])] for entry in records]
        if any(cell != "—" for row in rows for cell in row[1:]):
            sections += [f"{title}, per layer", tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True), ""]
    return sections


def _kinds(records: list[dict]) -> list[str]:
    seen = {kind for entry in records for layer in entry["layers"] for kind in (layer.get("weights") or {})}
    return [kind for kind in KIND_ORDER if kind in seen] + sorted(seen - set(KIND_ORDER))


def _weight_tables(records: list[dict], fmt: str) -> list[str]:
    kinds = _kinds(records)
    if not kinds:
        return []

    def by_kind(entry: dict, kind: str, key: str):
        values = [(layer["weights"][kind][key], layer["layer"]) for layer in entry["layers"]
                  if (layer.get("weights") or {}).get(kind, {}).get(key) is not None]
        return max(values) if values else None

    def cell(found) -> str:
        return "—" if found is None else f"{found[0]:.3g} L{found[1]}"

    updates = [[entry["step"], *(cell(by_kind(entry, kind, "update_ratio")) for kind in kinds)] for entry in records]
    norms = [[entry["step"], *(cell(by_kind(entry, kind, "norm")) for kind in kinds)] for entry in records]
    return ["‖ΔW‖/‖W‖ against the previous record, by tensor kind (the layer where it is largest)",
            tabulate(updates, headers=["step", *kinds], tablefmt=fmt, disable_numparse=True), "",
            "weight norm ‖W‖ by tensor kind (the largest layer)",
            tabulate(norms, headers=["step", *kinds], tablefmt=fmt, disable_numparse=True), ""]


def first_sign_line(first: Optional[dict], records: list[dict], level: Level, read: Optional[int] = None) -> str:
    """The first sign of trouble in words; `read`: how many records were judged, when more than `records` hold."""
    if first is None:
        count = len(records) if read is None else read
        return (f"no finding at {level.value} level or worse over {count} record{'s' if count > 1 else ''} "
                f"(steps {records[0]['step']}–{records[-1]['step']})")
    where = f", layer {first['layer']}" if first.get("layer") is not None else ""
    cause = f" (likely cause: {first['cause'].replace('_', ' ')})" if first.get("cause") else ""
    return f"first sign of trouble: step {first['step']}{where}, {first['name']}{cause}: {first['detail']}"


def last_sign_line(first: Optional[dict], last: Optional[dict], records: list[dict]) -> Optional[str]:
    """Whether the trouble is still there at the last record (None when there was none)."""
    if first is None:
        return None
    step = records[-1]["step"]
    if last is None:
        return f"at the last step ({step}) no such finding remains: check that the loss recovered as well"
    return f"still there at the last step ({step}): {', '.join(last['names'])}"


def _header(records: list[dict], source: str, read: int) -> str:
    """The run in one line; `read`: how many records it has (the report may keep fewer)."""
    first = records[0]
    layers = len(first["layers"])
    if source == "timeline":
        return f"{_counted(read, 'watch record')}, {_counted(layers, 'block')} ({_step_span(records)})"
    family = first.get("family", "model")
    return (f"{_counted(read, 'checkpoint')} of a {layers}-layer {family} model, the same "
            f"{first.get('tokens')} tokens through {'each' if read > 1 else 'it'} ({_step_span(records)})")


def _counted(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _step_span(records: list[dict]) -> str:
    first, last = records[0]["step"], records[-1]["step"]
    return f"step {first}" if len(records) == 1 else f"steps {first}–{last}"


def rollback_line(first: Optional[dict], rollback: Optional[dict], records: list[dict]) -> Optional[str]:
    """Where to resume from (training/rollback.py), when there was trouble."""
    if first is None:
        return None
    if rollback is None:
        return (f"roll back to: no record before the first sign is healthy (the first is step {records[0]['step']}): "
                "the run was broken from its start; fix the cause and start again")
    where = f" ({rollback['path']})" if rollback.get("path") else " (reload the last checkpoint saved at or before it)"
    loss = f", loss {rollback['loss']:.4f}" if isinstance(rollback.get("loss"), (int, float)) else ""
    return f"roll back to: step {rollback['step']}{where}{loss}, the last healthy record before the first sign"


def render_track(records: list[dict], first: Optional[dict], last: Optional[dict], level: Level, source: str,
                 fmt: str = "simple", brief: bool = False, rollback: Optional[dict] = None,
                 header: Optional[str] = None, trained: bool = True, thinning: Optional[dict] = None) -> str:
    """The records' tables and signs; `header` in place of the one the source gives, and no rollback point when
    the records were not `trained` (check --model's one record). `thinning`: the report's, when it keeps a
    selection of a long run's records (training/thinning.py): the counts and notes are then the whole run's."""
    read = thinning["records_read"] if thinning else len(records)
    lines = [header or _header(records, source, read), "", summary_table(records, fmt), ""]
    if not brief:
        lines += _layer_tables(records, fmt)
        lines += _weight_tables(records, fmt)
    if first is not None:
        diagnosis = next((entry.get("diagnosis") for entry in records if entry["step"] == first["step"]), None)
        if diagnosis:
            top = diagnosis[0]
            lines.append(f"most likely at step {first['step']}: {top['cause'].replace('_', ' ')} — {top['evidence']}")
            if top.get("advice"):
                lines.append(f"advice: {top['advice']}")
    lines += note_lines(thinning["notes"] if thinning else notes_of(records))
    if thinning:
        lines.append(thinning_line(thinning))
    lines.append(first_sign_line(first, records, level, read))
    rolled = rollback_line(first, rollback, records) if trained else None
    lines += [line for line in [last_sign_line(first, last, records), rolled] if line]
    return "\n".join(lines) + "\n"


NOTES_SHOWN = 5  # distinct notes; --json has every record's


def note_lines(notes: list[dict]) -> list[str]:
    """What the records say they could not measure (training/track.Notes) — each distinct note once, with the steps
    it was made at: a measurement missing is said, not only left null."""
    lines = [f"note: {seen['note']} (at {_steps(seen)})" for seen in notes[:NOTES_SHOWN]]
    more = len(notes) - NOTES_SHOWN
    return lines + ([f"note: {more} more distinct notes (--json has them)"] if more > 0 else [])


def _steps(seen: dict) -> str:
    if seen["records"] == 1:
        return f"step {seen['first_step']}"
    return f"{seen['records']} records, steps {seen['first_step']}–{seen['last_step']}"


def thinning_line(thinning: dict) -> str:
    """What a long run's report left out, in one line: its tables show a selection, its findings are all."""
    return (f"note: {thinning['records_kept']} of {thinning['records_read']} records shown — {thinning['how']}; the "
            "findings, first and last sign, rollback and diagnosis are judged over every record")


def _parted_cell(parted: dict) -> str:
    where = f"L{parted['layer']} " if parted["layer"] is not None else ""
    if parted["quantity"] == "loss":
        return f"loss {_cell(parted['run'], '.4f')} vs {_cell(parted['reference'], '.4f')}"
    factor = "missing" if parted["factor"] == float("inf") else f"{parted['factor']:.3g}×"
    return f"{where}{parted['quantity']} {_cell(parted['run'], '.3g')} vs {_cell(parted['reference'], '.3g')} ({factor})"


PARTED_SHOWN = 3  # per row; --json has them all


def render_against(comparison: dict, reference, fmt: str = "simple") -> str:
    """The run against a healthy one: per matched step the loss of each and what parted them; then where they part."""
    rows = []
    for step in comparison["steps"]:
        parted = [_parted_cell(p) for p in step["parted"]]
        more = len(parted) - PARTED_SHOWN
        rows.append([step["step"], _cell(step["loss"], ".4f"), _cell(step["reference_loss"], ".4f"),
                     "; ".join(parted[:PARTED_SHOWN]) + (f" (+{more} more)" if more > 0 else "") or "-"])
    lines = [f"against {reference}: {comparison['matched']} steps matched (a seed explains ×{comparison['seed_factor']:g} "
             f"per layer and {comparison['seed_loss']:g} nats of loss)", "",
             tabulate(rows, headers=["step", "loss", "reference loss", "parted beyond a seed"], tablefmt=fmt,
                      disable_numparse=True), ""]
    if comparison.get("thinning"):
        thinning = comparison["thinning"]
        lines.append(f"note: {thinning['steps_kept']} of {comparison['matched']} matched steps shown — "
                     f"{thinning['how']}; where the runs part is judged over every step")
    first = comparison["first_parted"]
    if first is None:
        lines.append(f"the runs do not part beyond what a different seed explains over {comparison['matched']} steps")
    else:
        lines.append(f"the runs part at step {first['step']}: {_parted_cell(first)}")
    return "\n".join(lines) + "\n"
