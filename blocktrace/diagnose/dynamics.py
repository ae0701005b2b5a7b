"""Training judged over time: what a series of records says that no single record can.

A layer that gets no gradient or never moves, an optimizer that changes nothing, updates that vanish
or spike, a learning rate that jumps, weights that collapse or are zeroed, the loss itself (above
uniform, stuck, spiking, too good to be true) and, where a Watch saw the batch, the data.

One function, `judge(history, entry)`, serves the Watch (each record against the records before it)
and `track` (each record of a timeline or of a checkpoint series against the ones before): the same
evidence gives the same findings everywhere. Records are timeline records (training/timeline.py);
`update_ratio` there is ‖ΔW‖/‖W‖ since the record before, so it is divided by the steps between the
two to compare intervals of different lengths. Each threshold is defined and cited in health.CHECKS.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

from blocktrace.diagnose.health import (
    ADAM_TINY,
    FROZEN_FRACTION,
    LABEL_COPY_LOSS,
    LEAK_LOSS,
    LOSS_MARGIN,
    LOSS_SPIKE_FLOOR,
    LOSS_SPIKE_SIGMAS,
    LOSS_SPIKE_WINDOW,
    LR_JUMP,
    MIN_HISTORY,
    NORM_COLLAPSE,
    SHRINK_PER_STEP,
    SPIKE_FACTOR,
    STILL,
    STUCK_MARGIN,
    STUCK_STEPS,
    TINY_LR,
    TINY_UPDATE,
    Cause,
    Flag,
    flag,
)
from blocktrace.vocab import Level

WATCH = "watch"
MIN_SPIKE_HISTORY = 8  # recorded losses before a spike is judged against their spread
NORM_KIND = "norm"  # norm gains move unlike matrices (and Gemma's start at 0): left out of the update statistics


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _interval_lr(before: dict, entry: dict) -> Optional[float]:
    """The learning rate of the steps between two records: the larger of the two recorded (None: not recorded)."""
    rates = [r for r in (before.get("lr"), entry.get("lr")) if _finite(r)]
    return max(rates) if rates else None


def _per_step_ratios(before: dict, entry: dict) -> dict[int, list[float]]:
    """Per layer: each matrix kind's ‖ΔW‖/‖W‖ between the two records, divided by the steps between them."""
    gap = entry["step"] - before["step"]
    if gap <= 0:
        return {}
    found = {}
    for layer in entry["layers"]:
        ratios = [w["update_ratio"] / gap for kind, w in (layer.get("weights") or {}).items()
                  if kind != NORM_KIND and _finite(w.get("update_ratio"))]
        if ratios:
            found[layer["layer"]] = ratios
    return found


def _median_update(before: dict, entry: dict) -> Optional[float]:
    """The median matrix's per-step ‖ΔW‖/‖W‖ between two records, per unit of learning rate when it is known."""
    ratios = [r for values in _per_step_ratios(before, entry).values() for r in values]
    if not ratios:
        return None
    lr = _interval_lr(before, entry)
    return statistics.median(ratios) / (lr if lr else 1.0)


def _gradient_flags(entry: dict) -> list[Flag]:
    """Layers whose parameters require a gradient and get none while others do (a Watch saw the gradients)."""
    if entry.get("source") != WATCH:
        return []
    norms = {layer["layer"]: layer.get("grad_norm") for layer in entry["layers"]}
    flowing = [n for n in norms.values() if _finite(n) and n > 0]
    if not flowing:
        return []  # nothing has a gradient: the Watch warns that step() came before backward()
    return [flag("no_gradient", Level.ERROR, None, layer["layer"], 0.0 if norm is None else norm,
                 f"gradient norm {'null' if norm is None else f'{norm:g}'} while other layers get up to "
                 f"{max(flowing):.3g}")
            for layer in entry["layers"] for norm in [norms[layer["layer"]]]
            if layer.get("trainable", True) is not False and (norm is None or norm == 0)]


def _movement_flags(before: dict, entry: dict) -> list[Flag]:
    """Between two records: nothing moved at all, one layer stood still while others moved, or all barely moved."""
    per_layer = _per_step_ratios(before, entry)
    if not per_layer:
        return []
    lr = _interval_lr(before, entry)
    largest = {layer: max(values) for layer, values in per_layer.items()}
    if max(largest.values()) < STILL:
        if lr is not None and lr <= 0:
            return []  # a learning rate of 0 is a choice (a frozen phase), not a fault
        return [flag("no_update", Level.ERROR, None, None, max(largest.values()),
                     f"no layer moved between steps {before['step']} and {entry['step']}"
                     + (f" at learning rate {lr:g}" if lr is not None else ""))]
    typical = statistics.median(largest.values())
    trainable = {layer["layer"]: layer.get("trainable", True) is not False for layer in entry["layers"]}
    flags = [flag("layer_frozen", Level.ERROR if trainable.get(layer, True) else Level.INFO, None, layer, moved,
                  f"per-step ‖ΔW‖/‖W‖ at most {moved:.3g} against the median layer's {typical:.3g}"
                  + ("" if trainable.get(layer, True) else " (its parameters do not require a gradient)"))
             for layer, moved in largest.items() if moved < FROZEN_FRACTION * typical]
    median = statistics.median(r for values in per_layer.values() for r in values)
    adam = "adam" in str(entry.get("optimizer") or "").lower()
    if median < TINY_UPDATE or (adam and lr and median < ADAM_TINY * lr):
        cause = Cause.LEARNING_RATE if lr is not None and lr < TINY_LR else Cause.OPTIMIZER
        flags.append(flag("updates_tiny", Level.ERROR, None, None, median,
                          f"the median matrix moves {median:.3g} of its norm per step"
                          + (f" at learning rate {lr:g}" if lr is not None else ""), cause))
    return flags


def _spike_flags(history: Sequence[dict], entry: dict) -> list[Flag]:
    """An update far larger, per unit of learning rate, than the ones before; a learning rate that jumped."""
    flags = []
    window = list(history[-LOSS_SPIKE_WINDOW:])
    earlier = [u for a, b in zip(window, window[1:]) for u in [_median_update(a, b)] if u]
    now = _median_update(history[-1], entry)
    if now is not None and len(earlier) >= MIN_HISTORY and now > SPIKE_FACTOR * statistics.median(earlier):
        factor = now / statistics.median(earlier)
        flags.append(flag("update_spike", Level.ERROR, None, None, factor,
                          f"‖ΔW‖/‖W‖ per unit of learning rate {factor:.3g}× its median over the previous "
                          f"{len(earlier)} intervals"))
    rates = [r["lr"] for r in history if _finite(r.get("lr"))]
    lr = entry.get("lr")
    if _finite(lr) and len(rates) >= MIN_HISTORY - 1 and max(rates) > 0 and lr > LR_JUMP * max(rates):
        flags.append(flag("lr_jump", Level.ERROR, None, None, lr,
                          f"learning rate {lr:g}, {lr / max(rates):.3g}× the largest recorded before ({max(rates):g})"))
    return flags


def _norms(entry: dict) -> dict[tuple[int, str], float]:
    return {(layer["layer"], kind): w["norm"] for layer in entry["layers"]
            for kind, w in (layer.get("weights") or {}).items() if _finite(w.get("norm"))}


def _weight_flags(first: dict, before: dict, entry: dict) -> list[Flag]:
    """Tensors zeroed since the record before; tensor kinds whose norm collapsed since the first record."""
    now, previous, start = _norms(entry), _norms(before), _norms(first)
    flags, seen = [], set()
    gap = max(1, entry["step"] - before["step"])
    for (layer, kind), norm in now.items():
        if layer not in seen and norm < SHRINK_PER_STEP ** gap * previous.get((layer, kind), 0):
            flags.append(flag("weights_zeroed", Level.ERROR, None, layer, norm,
                              f"{kind}: ‖W‖ {norm:.3g}, {previous[(layer, kind)]:.3g} at step {before['step']}"))
            seen.add(layer)
    for (layer, kind), norm in now.items():
        origin = start.get((layer, kind), 0)
        if layer not in seen and norm > 0 and origin > 0 and norm < NORM_COLLAPSE * origin:
            flags.append(flag("weight_norm_collapse", Level.ERROR, None, layer, norm / origin,
                              f"{kind}: ‖W‖ {norm:.3g}, {norm / origin:.2g}× its {origin:.3g} at step {first['step']}"))
            seen.add(layer)
    return flags


def _loss_flags(history: Sequence[dict], entry: dict) -> list[Flag]:
    loss, vocab, flags = entry.get("loss"), entry.get("vocab"), []
    if loss is None:
        return []
    uniform = math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None
    if uniform is not None and (not math.isfinite(loss) or loss > uniform + LOSS_MARGIN):
        flags.append(flag("loss_above_uniform", Level.ERROR, None, None, loss,
                          f"loss {loss:.4g} against log V = {uniform:.4g} for uniform guessing"))
    elif uniform is not None and entry["step"] >= STUCK_STEPS and loss > uniform - STUCK_MARGIN:
        flags.append(flag("loss_stuck", Level.ERROR, None, None, loss,
                          f"loss {loss:.4g} at step {entry['step']}, log V = {uniform:.4g}"))
    if math.isfinite(loss) and entry["step"] > 0 and loss < LEAK_LOSS:
        flags.append(flag("loss_near_zero", Level.ERROR, None, None, loss, f"loss {loss:.3g} nats per token"))
    recent = [r["loss"] for r in history[-LOSS_SPIKE_WINDOW:] if _finite(r.get("loss"))]
    if math.isfinite(loss) and len(recent) >= MIN_SPIKE_HISTORY:
        mean, spread = statistics.fmean(recent), statistics.pstdev(recent)
        if loss > mean + LOSS_SPIKE_SIGMAS * spread and loss > mean + LOSS_SPIKE_FLOOR:
            flags.append(flag("loss_spike", Level.ERROR, None, None, loss,
                              f"loss {loss:.4g} against {mean:.4g} ± {spread:.2g} over the previous {len(recent)} records"))
    return flags


def _data_flags(entry: dict) -> list[Flag]:
    data, loss = entry.get("data") or {}, entry.get("loss")
    flags = []
    if data.get("repeated"):
        flags.append(flag("repeated_batch", Level.ERROR, None, None, 1.0,
                          "this step's batch equals the batch of the record before"))
    if data.get("labels_are_inputs"):
        copying = _finite(loss) and loss < LABEL_COPY_LOSS
        flags.append(flag("labels_are_inputs", Level.ERROR if copying else Level.INFO, None, None, 1.0,
                          "the targets passed to the model are its input ids, unshifted" +
                          (f", and the loss is {loss:.3g} nats per token: the model copies them" if copying else "")))
    return flags


def judge(history: Sequence[dict], entry: dict) -> list[Flag]:
    """The findings over training at `entry`, judged against the records before it (oldest first; the first is the
    reference for trends). Findings the record already holds (same name and layer) are not repeated."""
    flags = _gradient_flags(entry) + _loss_flags(history, entry) + _data_flags(entry)
    if history:
        flags += _movement_flags(history[-1], entry) + _spike_flags(history, entry)
        flags += _weight_flags(history[0], history[-1], entry)
    held = {(f["name"], f.get("layer")) for f in entry.get("flags") or []}
    return [f for f in flags if (f.name, f.layer) not in held]
