"""A model over training time: the records of checkpoints (pipeline/track.py makes them) or of a Watch's timeline
as one story, step by step — the checkpoints named and put in step order, the findings each record raised first,
the first and last sign of trouble, a training log's numbers beside each record."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

from blocktrace.diagnose.checks import Flag
from blocktrace.diagnose.diagnosis import Context, conclude
from blocktrace.diagnose.dynamics import judge
from blocktrace.diagnose.history import History
from blocktrace.errors import InputError, UsageError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.training_step import step_of
from blocktrace.training.rollback import healthy, rollback_entry
from blocktrace.training.thinning import Kept, how_thinned
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


class NewFlags:
    """Which of a record's findings no record before it raised (same name, same layer) at their level or above."""

    def __init__(self):
        self.highest: dict = {}  # (name, layer) -> the highest level rank raised so far

    def mark(self, entry: dict) -> dict:
        """The record with its `new_flags` — a finding that escalates (info, then an error: where a first sign
        often is) is new again."""
        flags = entry.get("flags") or []
        highest = self.highest
        entry["new_flags"] = [f for f in flags if Level(f["level"]).rank > highest.get((f["name"], f.get("layer")), -1)]
        for f in flags:
            key = (f["name"], f.get("layer"))
            highest[key] = max(highest.get(key, -1), Level(f["level"]).rank)
        return entry


def mark_new_flags(records: list[dict]) -> list[dict]:
    """Each record's findings not raised (same name, same layer) at their level or above by any record before it:
    `new_flags` (NewFlags)."""
    new = NewFlags()
    return [new.mark(entry) for entry in records]


def judge_record(history: History, entry: dict) -> dict:
    """The record with the findings over training (diagnose/dynamics.py) judged against the records before it, and
    its diagnosis made again over all its findings where some were added (a Watch's records hold them already;
    checkpoints and older timelines gain them here); then added to the history."""
    added = judge(history, entry)
    history.add(entry)
    if added:  # conclude() only where a finding was added: the diagnosis of the others is the record's own
        held = [Flag.from_entry(finding) for finding in entry.get("flags") or [] if Flag.readable(finding)]
        found = conclude(held + added, Context(step=entry["step"]))
        entry["flags"] = (entry.get("flags") or []) + flag_entries([f.to_dict() for f in found.flags[len(held):]])
        entry["diagnosis"] = diagnosis_entries(found.diagnosis)
    return entry


def _serious(entry: dict, level: Level) -> list[dict]:
    return [f for f in entry.get("flags") or [] if Level(f["level"]).reaches(level)]


def last_sign(records: list[dict], level: Level) -> Optional[dict]:
    """The findings at `level` or above still raised at the last record (whether the trouble is still there)."""
    last = records[-1]
    findings = _serious(last, level)
    return {"step": last["step"], "names": sorted({f["name"] for f in findings})} if findings else None


def sign(entry: dict, level: Level) -> Optional[dict]:
    """The record's first finding at `level` or above, as a sign of trouble (None: it raises none)."""
    findings = _serious(entry, level)
    if not findings:
        return None
    finding = findings[0]
    return {"step": entry["step"], "layer": finding.get("layer"), "name": finding["name"], "level": finding["level"],
            "cause": finding.get("cause"), "detail": finding.get("detail")}


def first_sign(records: list[dict], level: Level) -> Optional[dict]:
    """The first finding at `level` or above, over the records in step order: where trouble shows first."""
    return next((found for entry in records for found in [sign(entry, level)] if found), None)


def record_notes(entry: dict) -> list[str]:
    """What a record says it could not measure — a probe that did not run, attention that is not visible —
    each distinct note once."""
    probe, descent = entry.get("probe") or {}, (entry.get("loop") or {}).get("descent") or {}
    failed = probe.get("ranks_failed")
    probes = [probe.get("note"), descent.get("note"),
              f"the causal probe could not run on {failed:g} of the ranks" if isinstance(failed, (int, float))
              and failed > 0 else None]
    said = [note for note in probes if note] + [note for layer in entry["layers"] for note in layer.get("notes") or []]
    return list(dict.fromkeys(said))


class Notes:
    """Each distinct note over the records: how many records made it, the first and the last step."""

    def __init__(self):
        self.tally: dict[str, dict] = {}

    def add(self, entry: dict) -> None:
        for note in record_notes(entry):
            seen = self.tally.setdefault(note, {"note": note, "records": 0, "first_step": entry["step"]})
            seen["records"] += 1
            seen["last_step"] = entry["step"]

    def listed(self) -> list[dict]:
        return list(self.tally.values())


def notes_of(records: list[dict]) -> list[dict]:
    """The records' notes (Notes), in the order first made."""
    notes = Notes()
    for entry in records:
        notes.add(entry)
    return notes.listed()


class Story:
    """A run's records in step order, taken one at a time: each judged against the ones before (judge_record), its
    new findings marked, the log's numbers beside it; the first and last sign at `level`, the rollback point, the
    notes — all over every record — and a bounded selection of the records (training/thinning.Kept) for the
    report's tables and charts."""

    def __init__(self, level: Level, log: Optional[dict[int, dict]] = None):
        self.level, self.log = level, log
        self.history, self.new, self.notes, self.kept = History(), NewFlags(), Notes(), Kept()
        self.first: Optional[dict] = None
        self.rollback: Optional[dict] = None
        self.last_healthy: Optional[tuple[int, dict]] = None  # (index, record), until the first sign
        self.last: Optional[dict] = None

    def add(self, entry: dict) -> None:
        self.new.mark(judge_record(self.history, entry))
        if self.log is not None:
            entry["log"] = self.log.get(entry["step"])
        self.notes.add(entry)
        index = self.kept.add(entry, keep=bool(entry["new_flags"]))
        self.last = entry
        if self.first is None:
            self._look_for_first_sign(index, entry)

    def _look_for_first_sign(self, index: int, entry: dict) -> None:
        self.first = sign(entry, self.level)
        if self.first is not None:
            self.kept.keep(index, entry)
            if self.last_healthy is not None:
                self.kept.keep(*self.last_healthy)
                self.rollback = rollback_entry(self.last_healthy[1])
        elif healthy(entry):
            self.last_healthy = (index, entry)

    def told(self, records: Iterable[dict]) -> "Story":
        for entry in records:
            self.add(entry)
        return self

    def thinning(self) -> Optional[dict]:
        """What the report says of the records it left out (None: it keeps every one)."""
        if not self.kept.thinned:
            return None
        return {"records_read": self.kept.seen, "records_kept": len(self.kept.items()),
                "how": how_thinned(self.kept.every), "notes": self.notes.listed()}


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
