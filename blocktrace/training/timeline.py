"""One timeline format for a model over training: records a watch writes and `track` reads.

A timeline is JSON lines, one record per moment of training, each self-describing:

    {"format": "blocktrace.timeline", "version": 1, "source": "watch" | "checkpoint", "step": 400,
     "loss": 2.31, "lr": 0.001, "grad_norm": 0.8, "path": null,
     "layers": [{"layer": 0, "steps": {"norm1": {mean, std, min, max, rms, absmax, nan, inf}, ...},
                 "rms": …, "median_token_sq_norm_per_d": …, "max_logit": …, "min_entropy": …,
                 "entropy_per_head": […], "future_weight_sum": …, "grad_norm": …,
                 "weights": {"attn_q": {"norm": …, "update_ratio": …, "elements": …}, ...}, "notes": [...],
                 "routing": {"load": […], "entropy": …, "balance_loss": …, …} (a mixture of experts only)}, ...],
     "flags": [{"name", "level", "cause", "layer", "step", "detail"}, ...], "diagnosis": [{"cause", "evidence", "advice"}, ...]}

`update_ratio` is ‖ΔW‖/‖W‖ since the previous record, W the weights as they were then (null in the first;
a tensor zeroed since shows 1). A watch's records
also say how many processes' batches their statistics cover (`ranks`, see training/distributed.py). Every record is
flushed as soon as it is written, so a run that crashes keeps everything recorded before.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from blocktrace.errors import InputError, UsageError
from blocktrace.files import file_kind
from blocktrace.sources.reading import parse_json, require_regular
from blocktrace.training.schema import NON_FINITE, SchemaError, checked_record

FORMAT, VERSION = "blocktrace.timeline", 1
T = TypeVar("T")


def layer_entry(layer: int, trace, grad_norm: Optional[float] = None, weights: Optional[dict] = None) -> dict:
    """One block of one record: the statistics of its steps (by step name), its attention, its gradients and weights."""
    attention = trace.attention
    output = trace.steps[-1] if trace.steps else trace.input
    return {
        "layer": layer,
        "steps": {record.name: record.stats.to_dict() for record in trace.steps},
        "rms": output.stats.rms,
        "median_token_sq_norm_per_d": output.probe.token_sq_median,
        "max_logit": attention.max_logit if attention else None,
        "min_entropy": min(attention.entropy_per_head) if attention and attention.entropy_per_head else None,
        "entropy_per_head": attention.entropy_per_head if attention else None,
        "future_weight_sum": attention.future_weight_sum if attention else None,
        "grad_norm": grad_norm,
        # each norm step's effective gain (rms), as measured on the module: the model-wide norm checks read them
        "norm_gains": {record.name: record.probe.norm.gain_rms for record in trace.steps
                       if record.probe.norm is not None and record.probe.norm.gain_rms is not None},
        "weights": weights,
        "notes": list(trace.notes),
        **({"routing": trace.routing.to_dict()} if trace.routing is not None else {}),
    }


def compare_logits(traces: list, present: Iterable[int], before: Optional[dict]) -> None:
    """Each traced layer's largest attention logit at the record before (a Watch's record, a checkpoint's), on its
    attention summary: the logit checks judge its growth (diagnose/health.py)."""
    earlier = {layer.get("layer"): layer.get("max_logit") for layer in (before or {}).get("layers") or []}
    for index, trace in zip(present, traces):
        if trace.attention is not None:
            trace.attention.earlier_max_logit = earlier.get(index)


FLAG_KEYS = ("name", "level", "cause", "layer", "step", "detail")  # a finding in a timeline (what it means, its
# threshold and source are the check's own: `check` prints them)


def flag_entries(flags: list[dict]) -> list[dict]:
    """Findings (as Flag.to_dict() gives them) in the timeline's form: one form for watch and checkpoint records."""
    return [{key: finding[key] for key in FLAG_KEYS} for finding in flags]


def diagnosis_entries(diagnosis: list[dict]) -> list[dict]:
    """A diagnosis (diagnose.diagnosis.diagnose) in the timeline's form."""
    return [{"cause": d["cause"], "evidence": d["evidence"], "advice": d.get("advice")} for d in diagnosis]


def record(step: Optional[int], source: str, layers: list[dict], flags: list[dict], diagnosis: list[dict], *,
           loss: Optional[float] = None, lr: Optional[float] = None, grad_norm: Optional[float] = None,
           path: Optional[str] = None, extra: Optional[dict] = None) -> dict:
    return {"format": FORMAT, "version": VERSION, "source": source, "step": step, "path": path, "loss": loss,
            "lr": lr, "grad_norm": grad_norm, "layers": layers, "flags": flags,
            "diagnosis": diagnosis_entries(diagnosis), **(extra or {})}


def _finite(value):
    """JSON has no NaN/Inf: they travel as strings a reader turns back into floats."""
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE[0] if math.isnan(value) else NON_FINITE[1 if value > 0 else 2]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# Characters JSON leaves unescaped in a string that str.splitlines (and so many a reader of JSON lines) ends a line
# at: written as JSON escapes, a record is one line by every definition of a line.
LINE_BREAKS_IN_STRINGS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def dumps(entry: dict) -> str:
    return json.dumps(_finite(entry), ensure_ascii=False, allow_nan=False).translate(LINE_BREAKS_IN_STRINGS)


class TimelineWriter:
    """Writes records to a JSON-lines file, flushing each one. An existing timeline is never silently mixed
    with a new run: it is continued only with `append` (a resumed run) and replaced only with `overwrite`.

    The file is opened without following a symbolic link and must be a regular file (a FIFO would block the
    training loop); it is held under an exclusive lock while open, so a second writer — another Watch, in
    this process or another — is refused instead of interleaving its records with the first one's."""

    def __init__(self, path: Path, append: bool = False, overwrite: bool = False):
        self.path = Path(path)
        if append and overwrite:
            raise UsageError("append=True continues the timeline and overwrite=True replaces it: pass one")
        descriptor = _open_for_writing(self.path)
        try:
            _lock(descriptor, self.path)
            if not append and not overwrite and os.fstat(descriptor).st_size > 0:
                raise UsageError(f"{self.path} already holds a timeline: pass append=True to continue it (a resumed "
                                 "run) or overwrite=True to start it afresh")
            if overwrite:
                os.ftruncate(descriptor, 0)
            self.last_step = _last_step(self.path) if append and os.fstat(descriptor).st_size > 0 else None
            self.end = os.lseek(descriptor, 0, os.SEEK_END)  # where the last whole record ends
        except BaseException:
            os.close(descriptor)
            raise
        self.descriptor: Optional[int] = descriptor

    @property
    def closed(self) -> bool:
        return self.descriptor is None

    def write(self, entry: dict) -> None:
        """One record, written straight to the file (no buffer to flush later). If the write fails (a full disk),
        what it wrote of the line is cut off again, so the file ends with its last whole record, and the error goes
        on to the caller."""
        data = (dumps(entry) + "\n").encode("utf-8")
        try:
            written = 0
            while written < len(data):
                written += os.write(self.descriptor, data[written:])
        except OSError:
            try:
                os.ftruncate(self.descriptor, self.end)
                os.lseek(self.descriptor, self.end, os.SEEK_SET)
            except OSError:
                pass
            raise
        self.end += len(data)

    def close(self) -> None:
        if self.descriptor is not None:
            descriptor, self.descriptor = self.descriptor, None
            os.close(descriptor)  # closing the descriptor releases the lock


def _last_step(path: Path) -> Optional[int]:
    """The last step of a timeline being continued (its records are read as `track` reads them)."""
    return max(entry["step"] for entry in read_timeline(path))


def _open_for_writing(path: Path) -> int:
    """A descriptor of the regular file at path (created if missing), opened without following a link and
    without blocking on a FIFO."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        descriptor = os.open(path, flags, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP or os.path.islink(path):
            raise InputError(f"cannot write the timeline {path}: it is a symbolic link; give the file itself") from None
        if error.errno == errno.ENXIO:  # a FIFO with no reader
            raise InputError(f"cannot write the timeline {path}: it is a FIFO; give a regular file") from None
        raise InputError(f"cannot write {path}: {error.strerror or error}") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        raise InputError(f"cannot write the timeline {path}: it is {file_kind(mode)}; give a regular file")
    if hasattr(os, "set_blocking"):
        os.set_blocking(descriptor, True)
    return descriptor


def _lock(descriptor: int, path: Path) -> None:
    """An exclusive lock for as long as the descriptor is open; refused at once if another writer holds it."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; one writer per file is then the user's to keep
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise UsageError(f"{path} is being written by another Watch (in this process or another): give each "
                         "run its own timeline file") from None


def json_lines(path: Path, what: str, torn: Optional[list] = None) -> Iterator[tuple[int, object]]:
    """(line number, value) of a JSON-lines file, read one line at a time (memory does not grow with the file),
    blank lines skipped. A last line cut short (a run killed mid-write: no newline after it, as every line written
    whole has one) ends the file, its number added to `torn` so the caller can say so; any other line that is not
    JSON is refused with why, naming `what` the file should hold."""
    for number, line, whole in _text_lines_of(Path(path)):
        if not line.strip():
            continue
        try:
            yield number, parse_json(line)
        except ValueError as error:
            if not whole:
                if torn is not None:
                    torn.append(number)
                return
            raise InputError(f"{path}:{number} is not a JSON line ({what}): {str(error)[:120]}") from None


def _text_lines_of(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line number, text, whether a newline ended it) of a UTF-8 file, lines as the format defines them: ended by
    "\n" alone (a "\r" before it dropped), never at the other characters str.splitlines breaks at, which a string
    inside a record may hold. Each line is decoded with its newline, so an error names the byte of the file as
    decoding it whole would."""
    require_regular(path)
    try:
        with open(path, "rb") as handle:
            offset = 0
            for number, data in enumerate(handle, start=1):
                try:
                    line = data.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise InputError(f"{path} is not UTF-8 text ({error.reason} at byte {offset + error.start})") \
                        from None
                offset += len(data)
                whole = line.endswith("\n")
                line = line[:-1] if whole else line
                yield number, line[:-1] if line.endswith("\r") else line, whole
    except OSError as error:
        raise InputError(f"{path}: cannot read it: {error.strerror or error}") from None


def _shown_version(value) -> str:
    """A version as found, whole; one too long to print is said by its size (a cut 10³⁰ read as 10¹⁹)."""
    said = repr(value)
    if len(said) <= 20:
        return said
    return f"{said[:8]}… ({len(said)} characters long)"


class Timeline(list):
    """A timeline's records (a list of dicts, in step order) and the file they were read from; in a notebook it
    displays as `track --html`'s page of that file (render/notebook.py)."""

    def __init__(self, records, path: Path):
        super().__init__(records)
        self.path = Path(path)


class NotInStepOrder(Exception):
    """A timeline whose records are not written in step order: stream_timeline cannot give them in order."""


def _checked_records(path: Path, torn: Optional[list]) -> Iterator[tuple[int, dict]]:
    """(line number, record) of a timeline file as written, each checked against the schema (training/schema.py)."""
    for number, entry in json_lines(path, "a timeline holds one JSON record per line", torn):
        if not isinstance(entry, dict) or entry.get("format") != FORMAT:
            raise InputError(f"{path}:{number} is not a blocktrace timeline record (written by Watch or "
                             "`blocktrace track --out`)")
        if entry.get("version") != VERSION:
            raise InputError(f"{path}:{number} is timeline version {_shown_version(entry.get('version'))}; this "
                             f"blocktrace reads version {VERSION}")
        try:
            yield number, checked_record(entry)
        except SchemaError as error:
            raise InputError(f"{path}:{number}: {error} (the timeline format: docs/track.md)") from None


def read_timeline(path: Path, torn: Optional[list] = None) -> Timeline:
    """The records of a timeline file, in step order — every one of them in memory: a library call on the file
    the caller chose (`track` streams it instead: stream_timeline). Refuses files that are not timelines, and
    records that break the schema (training/schema.py) or repeat a step, naming the line; a last line cut short
    is left out and its number added to `torn`."""
    records, lines = [], {}
    for number, checked in _checked_records(path, torn):
        if checked["step"] in lines:
            raise InputError(f"{path}:{number} repeats step {checked['step']} of line {lines[checked['step']]}: "
                             "two runs were written into one file; give each run its own timeline")
        lines[checked["step"]] = number
        records.append(checked)
    if not records:
        raise InputError(f"{path} holds no timeline records")
    return Timeline(sorted(records, key=lambda entry: entry["step"]), path)


def stream_timeline(path: Path, torn: Optional[list] = None) -> Iterator[dict]:
    """The records of a timeline file one at a time, checked as read_timeline checks them, for a file written in
    step order (as a Watch writes it): NotInStepOrder at the first record whose step is not above the one before
    (a repeated step, or records out of order: read_timeline sorts them, or names the repeat)."""
    previous = None
    for _, checked in _checked_records(path, torn):
        if previous is not None and checked["step"] <= previous:
            raise NotInStepOrder(path)
        previous = checked["step"]
        yield checked
    if previous is None:
        raise InputError(f"{path} holds no timeline records")


def in_step_order(path: Path, torn: list, consume: Callable[[Iterable[dict]], T]) -> T:
    """consume(the timeline's records in step order): streamed, in bounded memory, when the file is in step
    order; else (a file written out of order, or one that repeats a step) all read and sorted by read_timeline,
    which refuses a repeated step naming both lines."""
    try:
        return consume(stream_timeline(path, torn))
    except NotInStepOrder:
        torn.clear()
        return consume(read_timeline(path, torn))
