"""The timeline record's schema, checked field by field as a timeline is read.

A record that does not follow it is refused with its line and the field at fault, so a hand-edited
or foreign file never reaches the tables as a traceback or, worse, as a plausible row. Numbers that
JSON cannot hold (NaN, ±Inf) travel as the strings "nan", "inf", "-inf": they are turned back into
floats only where the schema says a number is, so a path or a note spelled "nan" stays a string.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from blocktrace.vocab import Level

NON_FINITE = ("nan", "inf", "-inf")
SOURCES = ("watch", "checkpoint")
RECORD_NUMBERS = ("loss", "lr", "grad_norm")
LAYER_NUMBERS = ("rms", "median_token_sq_norm_per_d", "max_logit", "min_entropy", "future_weight_sum", "grad_norm")
LEVELS = tuple(level.value for level in Level)
ROUTING_NUMBERS = ("entropy", "uniform_entropy", "balance_loss", "z_loss", "max_logit", "repeated_choice")
ROUTING_COUNTS = ("experts", "per_token", "tokens")


class SchemaError(ValueError):
    """A field that is not what the schema says; the message names the field."""


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number(value: Any, field: str):
    """None, an int or float, or a non-finite number spelled as JSON cannot (→ float)."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    if isinstance(value, str) and value in NON_FINITE:
        return float(value)
    raise SchemaError(f"{field} must be a number or null, not {_shown(value)}")


def _text(value: Any, field: str, optional: bool = True):
    if (value is None and optional) or isinstance(value, str):
        return value
    raise SchemaError(f"{field} must be a string{' or null' if optional else ''}, not {_shown(value)}")


def _index(value: Any, field: str, optional: bool = False):
    if (value is None and optional) or (_is_integer(value) and value >= 0):
        return value
    raise SchemaError(f"{field} must be an integer ≥ 0{' or null' if optional else ''}, not {_shown(value)}")


def _listed(value: Any, field: str, each: Callable[[Any, str], Any], optional: bool = False):
    if value is None and optional:
        return None
    if not isinstance(value, list):
        raise SchemaError(f"{field} must be a list, not {_shown(value)}")
    return [each(item, f"{field}[{i}]") for i, item in enumerate(value)]


def _mapped(value: Any, field: str, each: Callable[[Any, str], Any], optional: bool = False):
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise SchemaError(f"{field} must be an object, not {_shown(value)}")
    return {key: each(item, f"{field}.{_key(key)}") for key, item in value.items()}


def _key(key: str) -> str:
    """A key as a message may show it: plain names as they are, anything else quoted and escaped."""
    return key if key.replace("_", "").isalnum() and key.isascii() else json.dumps(key)


def _numbers(value: Any, field: str) -> dict:
    return _mapped(value, field, number)


def _layer(value: Any, field: str) -> dict:
    layer = _mapped(value, field, lambda item, name: item)
    layer["layer"] = _index(layer.get("layer"), f"{field}.layer")
    layer["steps"] = _mapped(layer.get("steps"), f"{field}.steps", _numbers)
    for key in LAYER_NUMBERS:
        layer[key] = number(layer.get(key), f"{field}.{key}")
    layer["entropy_per_head"] = _listed(layer.get("entropy_per_head"), f"{field}.entropy_per_head", number,
                                        optional=True)
    layer["weights"] = _mapped(layer.get("weights"), f"{field}.weights", _numbers, optional=True)
    if "frozen_kinds" in layer:  # a Watch's records only
        layer["frozen_kinds"] = _listed(layer["frozen_kinds"], f"{field}.frozen_kinds", _text)
    layer["norm_gains"] = _mapped(layer.get("norm_gains"), f"{field}.norm_gains", number, optional=True)
    layer["notes"] = _listed(layer.get("notes", []), f"{field}.notes", _text)
    if layer.get("routing") is not None:
        layer["routing"] = _routing(layer["routing"], f"{field}.routing")
    if "trainable" in layer:
        layer["trainable"] = _boolean(layer["trainable"], f"{field}.trainable")
    return layer


def _boolean(value: Any, field: str):
    if value is None or isinstance(value, bool):
        return value
    raise SchemaError(f"{field} must be true, false or null, not {_shown(value)}")


def _data(value: Any, field: str) -> dict:
    """What a Watch saw of the batch (training/watch.Batch.report)."""
    data = _mapped(value, field, lambda item, name: item)
    for key in ("repeated", "labels_are_inputs", "shifts_inside", "language_model"):
        data[key] = _boolean(data.get(key), f"{field}.{key}")
    data["counted"] = number(data.get("counted"), f"{field}.counted")
    data["hard_rows"] = number(data.get("hard_rows"), f"{field}.hard_rows")
    data["pulled_rows"] = number(data.get("pulled_rows"), f"{field}.pulled_rows")
    for key in ("padded_rows", "rows"):
        data[key] = _index(data.get(key), f"{field}.{key}", optional=True)
    data["padding_id"] = number(data.get("padding_id"), f"{field}.padding_id")
    data["targets_counted"] = _index(data.get("targets_counted"), f"{field}.targets_counted", optional=True)
    data["target_match"] = _mapped(data.get("target_match"), f"{field}.target_match", number, optional=True)
    data["order_repeats"] = _mapped(data.get("order_repeats"), f"{field}.order_repeats",
                                    lambda item, name: _index(item, name), optional=True)
    data["repetition"] = _mapped(data.get("repetition"), f"{field}.repetition",
                                 lambda item, name: _index(item, name), optional=True)
    data["coverage"] = _mapped(data.get("coverage"), f"{field}.coverage", lambda item, name: _index(item, name),
                               optional=True)
    return data


LOOP_NUMBERS = ("grads_before_backward", "step_gradient", "optimizer_share", "loss_over_cross_entropy", "loss_scale",
                "backward_factor", "grads_before_later_backward", "moments_lost", "first_moment_ratio",
                "loss_over_worst_cross_entropy", "loss_over_best_cross_entropy",
                "loss_over_mean_worst_cross_entropy")
LOOP_FLAGS = ("outputs_are_probabilities", "softmax_before_loss", "log_softmax_reads_logits")
LOOP_COUNTS = ("step_gradient_at", "eval_mode_modules", "sequences", "positions", "optimizer_steps", "micro_batches",
               "update_step")


def _loop(value: Any, field: str) -> dict:
    """What a Watch saw of the training loop (training/loop.LoopObserver.evidence)."""
    loop = _mapped(value, field, lambda item, name: item)
    for key in LOOP_NUMBERS:
        loop[key] = number(loop.get(key), f"{field}.{key}")
    for key in LOOP_COUNTS:
        loop[key] = _index(loop.get(key), f"{field}.{key}", optional=True)
    for key in LOOP_FLAGS:
        loop[key] = _boolean(loop.get(key), f"{field}.{key}")
    loop["outside_optimizer"] = _listed(loop.get("outside_optimizer", []), f"{field}.outside_optimizer", _text)
    loop["lr_groups"] = _listed(loop.get("lr_groups"), f"{field}.lr_groups", number, optional=True)
    loop["log_softmax_over"] = _listed(loop.get("log_softmax_over"), f"{field}.log_softmax_over", _index,
                                       optional=True)
    loop["update_moves"] = _listed(loop.get("update_moves"), f"{field}.update_moves", number, optional=True)
    loop["update_unexplained"] = _listed(loop.get("update_unexplained"), f"{field}.update_unexplained", number,
                                         optional=True)
    loop["schedulers"] = _listed(loop.get("schedulers"), f"{field}.schedulers", _scheduler, optional=True)
    loop["frozen_zero"] = _listed(loop.get("frozen_zero"), f"{field}.frozen_zero", _text, optional=True)
    loop["token_embedding_zero"] = _text(loop.get("token_embedding_zero"), f"{field}.token_embedding_zero")
    loop["requires_grad_attributes"] = _listed(loop.get("requires_grad_attributes"),
                                               f"{field}.requires_grad_attributes", _requires_grad_attribute,
                                               optional=True)
    for key, read in _LOOP_PIECES.items():
        loop[key] = read(loop.get(key), f"{field}.{key}")
    return loop


def _tempered(value: Any, field: str) -> Optional[dict]:
    """The loss's temperature read off its gradient at the logits (training/logit_gradient.py)."""
    tempered = _mapped(value, field, number, optional=True)
    if tempered is not None:
        tempered["rows"] = _index(tempered.get("rows"), f"{field}.rows")
    return tempered


def _row_weights(value: Any, field: str) -> Optional[dict]:
    """The weight each sampled logit row carries in the loss (training/logit_gradient.row_weights)."""
    weights = _mapped(value, field, number, optional=True)
    if weights is not None:
        for key in ("same_target_pairs", "low_target", "high_target", "probability_rows", "shared_rows"):
            weights[key] = _index(weights.get(key), f"{field}.{key}", optional=True)
    return weights


def _piece(optional: bool = True, **readers: Callable[[Any, str], Any]) -> Callable[[Any, str], Optional[dict]]:
    """The reader of a mapping whose named keys each pass their own reader (the others kept as they are): one
    piece of a record, null where `optional`."""
    def read(value: Any, field: str) -> Optional[dict]:
        found = _mapped(value, field, lambda item, name: item, optional=optional)
        if found is not None:
            for key, reader in readers.items():
                found[key] = reader(found.get(key), f"{field}.{key}")
        return found
    return read


def _names(value: Any, field: str) -> list:
    return _listed([] if value is None else value, field, _text)


# the parameters with a gradient that no optimizer holds (training/unheld.py)
_unheld = _piece(unheld=_index, partial_blocks=_index, unheld_names=_names)
# a module's own requires_grad attribute and the parameters that contradict it (model_facts)
_requires_grad_attribute = _piece(False, module=lambda value, field: _text(value, field, optional=False),
                                  value=_boolean, differing=_index, parameters=_index)
# whether a tied head is one tensor with the embedding (training/model_facts.embeddings_untied)
_embeddings = _piece(tied=_boolean)
# the autocast copy of a weight against its values now (training/model_facts.stale_autocast_casts)
_stale_casts = _piece(name=_text, share=number)
# Adam's second moments against every average they may be (training/stepping.StepSample)
_second_moment_outside = _piece(share=number, judged=_index)


def _between_steps(value: Any, field: str) -> Optional[dict]:
    """The weights between two optimizer steps (training/between.py): the first step found changed, or None."""
    found = _mapped(value, field, lambda item, name: item, optional=True)
    if found is None:
        return None
    found["changed_at"] = _index(found.get("changed_at"), f"{field}.changed_at", optional=True)
    back = found.get("returned_to")  # a step, or −1: the weights before step 0's update
    if back is not None and not (_is_integer(back) and back >= -1):
        raise SchemaError(f"{field}.returned_to must be an integer ≥ -1 or null, not {_shown(back)}")
    for key in ("change", "step_move", "growth"):
        found[key] = number(found.get(key), f"{field}.{key}")
    return found


def _descent(value: Any, field: str) -> Optional[dict]:
    """The descent probe of the step after an earlier record (training/loop.py): its numbers, or a note."""
    descent = _mapped(value, field, lambda item, name: item, optional=True)
    if descent is None:
        return None
    for key in ("predicted", "loss_before", "loss_after", "loss_given"):
        descent[key] = number(descent.get(key), f"{field}.{key}")
    descent["at"] = _index(descent.get("at"), f"{field}.at", optional=True)
    descent["first_step"] = descent.get("first_step") is True  # older timelines: unknown, taken as not the first
    return descent


OPTIMIZER_FLAGS = ("nesterov", "maximize", "decoupled_weight_decay", "holds_embedding", "holds_head")


def _setting(value: Any, field: str):
    """A param group's setting: a flag, a number, or a list of numbers (betas)."""
    if isinstance(value, bool):
        return value
    return _listed(value, field, number) if isinstance(value, list) else number(value, field)


def _optimizer(value: Any, field: str):
    """The optimizer's class and its param groups' settings (training/loop.optimizer_hyperparameters)."""
    optimizer = _mapped(value, field, lambda item, name: item, optional=True)
    if optimizer is None:
        return None
    optimizer["class"] = _text(optimizer.get("class"), f"{field}.class")
    groups = _listed(optimizer.get("groups", []), f"{field}.groups", lambda group, name: _mapped(group, name, _setting))
    for i, group in enumerate(groups):
        for key in OPTIMIZER_FLAGS:
            group[key] = _boolean(group.get(key), f"{field}.groups[{i}].{key}")
    optimizer["groups"] = groups
    return optimizer


SCHEDULE_NUMBERS = ("warmup", "end", "factor_now", "factor_at_end")


def _scheduler(value: Any, field: str) -> dict:
    """A scheduler that drives the optimizer: its class and step count, and a transformers schedule's lengths and
    factors (training/schedulers.py)."""
    scheduler = _mapped(value, field, lambda item, name: item)
    scheduler["class"] = _text(scheduler.get("class"), f"{field}.class")
    scheduler["last_epoch"] = number(scheduler.get("last_epoch"), f"{field}.last_epoch")
    if scheduler.get("schedule") is not None:
        schedule = _mapped(scheduler["schedule"], f"{field}.schedule", lambda item, name: item)
        schedule["function"] = _text(schedule.get("function"), f"{field}.schedule.function")
        for key in SCHEDULE_NUMBERS:
            schedule[key] = number(schedule.get(key), f"{field}.schedule.{key}")
        scheduler["schedule"] = schedule
    return scheduler


def _embedding_rows(value: Any, field: str) -> Optional[dict]:
    """The largest gradient on the token embedding's rows the batch read and on the others
    (training/embedding_rows.py)."""
    return _mapped(value, field, number, optional=True)


# the loop's nested pieces, each read by its own function (the order of the record's keys is kept)
_LOOP_PIECES: dict[str, Callable[[Any, str], Any]] = {
    "optimizer": _optimizer, "descent": _descent, "between_steps": _between_steps, "tempered": _tempered,
    "row_weights": _row_weights, "unheld": _unheld, "embeddings": _embeddings, "embedding_rows": _embedding_rows,
    "autocast_stale": _stale_casts, "second_moment_outside": _second_moment_outside}


def _probe(value: Any, field: str) -> dict:
    """The Watch's probes (training/independence.py): causal, padding, batch."""
    probe = _mapped(value, field, lambda item, name: item)
    probe["future_leak"] = number(probe.get("future_leak"), f"{field}.future_leak")
    probe["leak_position"] = _index(probe.get("leak_position"), f"{field}.leak_position", optional=True)
    probe["nondeterministic"] = number(probe.get("nondeterministic"), f"{field}.nondeterministic")
    probe["causal_model"] = _boolean(probe.get("causal_model"), f"{field}.causal_model")
    probe["padding_leak"] = number(probe.get("padding_leak"), f"{field}.padding_leak")
    probe["padding_probed"] = _boolean(probe.get("padding_probed"), f"{field}.padding_probed")
    probe["batch_leak"] = number(probe.get("batch_leak"), f"{field}.batch_leak")
    probe["note"] = _text(probe.get("note"), f"{field}.note")
    return probe


def _routing(value: Any, field: str) -> dict:
    """A mixture of experts' routing (tracing.routing.RoutingSummary.to_dict)."""
    routing = _mapped(value, field, lambda item, name: item)
    for key in ROUTING_COUNTS:
        routing[key] = _index(routing.get(key), f"{field}.{key}")
    for key in ROUTING_NUMBERS:
        routing[key] = number(routing.get(key), f"{field}.{key}")
    for key in ("load", "importance"):
        routing[key] = _listed(routing.get(key), f"{field}.{key}", number)
    routing["dead_experts"] = _listed(routing.get("dead_experts", []), f"{field}.dead_experts", _index)
    routing["chosen"] = _listed(routing.get("chosen"), f"{field}.chosen",
                                lambda row, name: _listed(row, name, _index), optional=True)
    return routing


def _level(value: Any, field: str) -> str:
    if value in LEVELS:
        return value
    raise SchemaError(f"{field} must be one of {', '.join(LEVELS)}, not {_shown(value)}")


def _flag(value: Any, field: str) -> dict:
    flag = _mapped(value, field, lambda item, name: item)
    flag["name"] = _text(flag.get("name"), f"{field}.name", optional=False)
    flag["level"] = _level(flag.get("level"), f"{field}.level")
    for key in ("cause", "step", "detail"):
        flag[key] = _text(flag.get(key), f"{field}.{key}")
    flag["layer"] = _index(flag.get("layer"), f"{field}.layer", optional=True)
    return flag


def _finding(value: Any, field: str) -> dict:
    finding = _mapped(value, field, lambda item, name: item)
    finding["cause"] = _text(finding.get("cause"), f"{field}.cause", optional=False)
    for key in ("evidence", "advice"):
        finding[key] = _text(finding.get(key), f"{field}.{key}")
    return finding


def checked_record(entry: dict) -> dict:
    """The record with its numbers restored; SchemaError naming the first field that breaks the schema."""
    record = dict(entry)
    if record.get("source") not in SOURCES:
        raise SchemaError(f"source must be one of {', '.join(SOURCES)}, not {_shown(record.get('source'))}")
    record["step"] = _index(record.get("step"), "step")
    record["path"] = _text(record.get("path"), "path")
    for key in RECORD_NUMBERS:
        record[key] = number(record.get(key), key)
    record["layers"] = _listed(record.get("layers"), "layers", _layer)
    record["flags"] = _listed(record.get("flags", []), "flags", _flag)
    record["diagnosis"] = _listed(record.get("diagnosis", []), "diagnosis", _finding)
    if "optimizer" in record:
        record["optimizer"] = _text(record["optimizer"], "optimizer")
    for key in ("vocab", "width"):
        if key in record:
            record[key] = _index(record[key], key, optional=True)
    for key in ("family", "model", "entry"):
        if key in record:
            record[key] = _text(record[key], key)
    if record.get("data") is not None:
        record["data"] = _data(record["data"], "data")
    if record.get("loop") is not None:
        record["loop"] = _loop(record["loop"], "loop")
    if record.get("probe") is not None:
        record["probe"] = _probe(record["probe"], "probe")
    if "rollback" in record:
        record["rollback"] = _index(record["rollback"], "rollback", optional=True)
    return record


def _shown(value: Any) -> str:
    text = ascii(value)  # escaped: a value may hold line breaks or terminal escapes
    return text if len(text) <= 40 else text[:37] + "…"
