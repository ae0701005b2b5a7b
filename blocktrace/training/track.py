"""A model over training time: the records of checkpoints (pipeline/track.py makes them) or of a Watch's timeline
as one story, step by step — the checkpoints named and put in step order, the findings each record raised first,
the first and last sign of trouble, a training log's numbers beside each record."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

from blocktrace.diagnose.checks import Flag
from blocktrace.diagnose.diagnosis import Context, conclude
from blocktrace.diagnose.dynamics import judge
from blocktrace.diagnose.history import History
from blocktrace.errors import InputError, UsageError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.training_step import step_of
from blocktrace.training.timeline import diagnosis_entries, flag_entries, json_lines
from blocktrace.vocab import Level

GLOB_CHARACTERS = "*?["
LOG_FIELDS = ("loss", "lr", "grad_norm")  # what a training log line may say about its step


@dataclass(frozen=True)
class Point:
    """One checkpoint and the training step it holds."""

    step: int
    path: Path


def expand(paths: Sequence[Path]) -> list[Path]:
    """The checkpoints named: paths as given, and glob patterns (quoted, so the shell left them) expanded."""
    found = []
    for path in paths:
        text = str(path)
        if not path.exists() and any(c in text for c in GLOB_CHARACTERS):
            matches = sorted(glob.glob(text))
            if not matches:
                raise InputError(f"no checkpoint matches {text}")
            found += [Path(match) for match in matches]
        else:
            found.append(path)
    return found


def order(paths: Sequence[Path], steps: Optional[Sequence[int]] = None) -> list[Point]:
    """The checkpoints in step order: the steps given (one per path, in the order given), else each one's own
    (trainer_state.json, or a name such as step_400 / checkpoint-400)."""
    if steps is not None and len(steps) != len(paths):
        raise UsageError(f"--steps gives {len(steps)} step(s) for {len(paths)} checkpoint(s): give one per checkpoint, "
                         "in the order the checkpoints are given")
    points = []
    for index, path in enumerate(paths):
        if not os.path.lexists(path):
            raise UsageError(f"checkpoint {path} does not exist")
        step = steps[index] if steps is not None else step_of(path)
        if step is None:
            raise UsageError(f"cannot tell the training step of {path} from the file, its name or a trainer_state.json: give "
                             "--steps, one per checkpoint (e.g. --steps 0,100,200)")
        points.append(Point(step, path))
    seen: dict[int, Path] = {}
    for point in points:
        if point.step in seen:
            raise UsageError(f"{seen[point.step]} and {point.path} both hold step {point.step}: give each checkpoint "
                             "its own step (--steps)")
        seen[point.step] = point.path
    return sorted(points, key=lambda point: point.step)


def mark_new_flags(records: list[dict]) -> list[dict]:
    """Each record's findings not raised (same name, same layer) at their level or above by any record before it:
    `new_flags` — a finding that escalates (info, then an error: where a first sign often is) is new again."""
    highest: dict = {}  # (name, layer) -> the highest level rank raised so far
    for entry in records:
        flags = entry.get("flags") or []
        entry["new_flags"] = [f for f in flags if Level(f["level"]).rank > highest.get((f["name"], f.get("layer")), -1)]
        for f in flags:
            key = (f["name"], f.get("layer"))
            highest[key] = max(highest.get(key, -1), Level(f["level"]).rank)
    return records


def judged(records: list[dict]) -> list[dict]:
    """Each record with the findings over training (diagnose/dynamics.py) judged against the records before it,
    and its diagnosis made again over all its findings where some were added (a Watch's records hold them
    already; checkpoints and older timelines gain them here)."""
    history = History()  # the records before, in bounded memory: linear in the records, as the Watch judges them
    for entry in records:
        added = judge(history, entry)
        history.add(entry)
        if added:
            held = [Flag.from_entry(finding) for finding in entry.get("flags") or [] if Flag.readable(finding)]
            found = conclude(held + added, Context(step=entry["step"]))
            entry["flags"] = (entry.get("flags") or []) + flag_entries([f.to_dict() for f in found.flags[len(held):]])
            entry["diagnosis"] = diagnosis_entries(found.diagnosis)
    return records


def _serious(entry: dict, level: Level) -> list[dict]:
    return [f for f in entry.get("flags") or [] if Level(f["level"]).reaches(level)]


def last_sign(records: list[dict], level: Level) -> Optional[dict]:
    """The findings at `level` or above still raised at the last record (whether the trouble is still there)."""
    last = records[-1]
    findings = _serious(last, level)
    return {"step": last["step"], "names": sorted({f["name"] for f in findings})} if findings else None


def first_sign(records: list[dict], level: Level) -> Optional[dict]:
    """The first finding at `level` or above, over the records in step order: where trouble shows first."""
    found = next(((entry, findings[0]) for entry in records for findings in [_serious(entry, level)] if findings), None)
    if found is None:
        return None
    entry, finding = found
    return {"step": entry["step"], "layer": finding.get("layer"), "name": finding["name"], "level": finding["level"],
            "cause": finding.get("cause"), "detail": finding.get("detail")}


# HF Trainer's names in trainer_state.json's log_history, as the log's fields.
TRAINER_STATE_NAMES = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}


def _log_entries(path: Path) -> Iterator[dict]:
    """The entries of a training log: JSON lines, or HF Trainer's trainer_state.json (its log_history)."""
    if Path(path).suffix.lower() == ".json":
        history = ConfigFile.read(path).raw("log_history")
        if not isinstance(history, list):
            raise InputError(f"{path} has no log_history list: --log takes JSON lines with a \"step\" key or HF "
                             "Trainer's trainer_state.json")
        for entry in history:
            if isinstance(entry, dict):
                yield {TRAINER_STATE_NAMES.get(k, k): v for k, v in entry.items()}
        return
    for _, entry in json_lines(path, '--log takes JSON lines with a "step" key, or trainer_state.json'):
        if isinstance(entry, dict):
            yield entry


def read_log(path: Path) -> dict[int, dict]:
    """A training log, each entry with a `step` key: its loss, lr and grad_norm by step (others ignored;
    entries without a step — headers, evaluation lines — are skipped)."""
    by_step: dict[int, dict] = {}
    for entry in _log_entries(path):
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            continue
        values = {key: entry[key] for key in LOG_FIELDS
                  if isinstance(entry.get(key), (int, float)) and not isinstance(entry.get(key), bool)}
        if values:
            by_step.setdefault(step, {}).update(values)
    if not by_step:
        raise InputError(f"{path} has no entry with an integer \"step\" and one of {', '.join(LOG_FIELDS)}")
    return by_step


def attach_log(records: list[dict], log: dict[int, dict]) -> list[dict]:
    """Each record gets the training log's numbers at its step (`log`: null when the log has no such step)."""
    for entry in records:
        entry["log"] = log.get(entry["step"])
    return records
