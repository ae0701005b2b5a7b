"""`--token-ids-file`: token ids as training code keeps them, and the windows of them to use.

Formats, by suffix: `.npy` (a 1-D stream or 2-D rows; never a pickled array), `.bin` (raw
integers as nanoGPT's prepare.py writes them: uint16 unless `--ids-dtype` says otherwise),
`.json` (a list of ids, or a list of lists) and anything else as text (whitespace-separated
ids, one sequence per line). A stream longer than the context is cut into windows of
`--context` tokens (default: the model's positions); `--windows N` draws N of them at
offsets fixed by `--seed`, as a training loop draws its batches, and the same windows go
through every checkpoint of a `track`.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np
import torch

from blocktrace.errors import InputError, UsageError
from blocktrace.sources.reading import parse_json, read_bytes, read_text

if TYPE_CHECKING:
    from blocktrace.request import InputSpec

OPTION = "--token-ids-file"


@dataclass
class IdsFromFile:
    sequences: list[list[int]]
    note: str


def _npy_header(path: Path, data: bytes):
    """The .npy header's dtype and shape, checked against the file's size before anything is allocated (a header
    may claim 10^12 elements in a 64-byte file)."""
    stream = io.BytesIO(data)
    try:
        major, _ = np.lib.format.read_magic(stream)
        read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(stream)
    except Exception as error:  # not .npy, a header too long or malformed: numpy says so in several lines
        first = str(error).strip().splitlines()[0][:120] if str(error).strip() else type(error).__name__
        raise InputError(f"{OPTION} {path} is not a readable .npy file ({first})") from None
    if dtype.hasobject:
        raise InputError(f"{OPTION} {path} is not a .npy array of integers: it holds Python objects (never unpickled)")
    needed = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if needed != len(data) - stream.tell():
        raise InputError(f"{OPTION} {path}: its header claims shape {tuple(shape)} of {dtype} ({needed:,} bytes) but "
                         f"the file holds {len(data) - stream.tell():,} bytes of data")
    return dtype


def _from_npy(path: Path):
    data = read_bytes(path, OPTION)
    _npy_header(path, data)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as error:  # a pickled object array, or not .npy at all
        first = str(error).strip().splitlines()[0][:120]
        raise InputError(f"{OPTION} {path} is not a .npy array of integers ({first})") from None
    if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
        raise InputError(f"{OPTION} {path} holds a {array.ndim}-D {array.dtype} array: give a 1-D stream or 2-D rows "
                         "of integer ids")
    return [array.tolist()] if array.ndim == 1 else array.tolist()


def _from_raw(path: Path, dtype: str):
    data = read_bytes(path, OPTION)
    width = np.dtype(dtype).itemsize
    if len(data) % width:
        raise InputError(f"{OPTION} {path} is {len(data)} bytes, not a whole number of {dtype} ids ({width} bytes "
                         "each): is --ids-dtype right?")
    return [np.frombuffer(data, dtype=dtype).tolist()]


def _from_json(path: Path):
    text = read_text(path, OPTION)
    try:
        value = parse_json(text)
    except ValueError as error:
        raise InputError(f"{OPTION} {path} is not valid JSON: {str(error)[:80]}") from None
    rows = value if isinstance(value, list) and value and all(isinstance(v, list) for v in value) else [value]
    if not all(isinstance(row, list) and row and all(isinstance(i, int) and not isinstance(i, bool) for i in row)
               for row in rows):
        raise InputError(f"{OPTION} {path} must hold a list of integer ids or a list of such lists")
    return rows


ID_WORD = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: Python's int() also takes 1_0, ٣ and fullwidth digits
SEPARATORS = re.compile(r"[ \t\r\f\v,]+")  # ASCII whitespace and commas: str.split() splits on any Unicode space


def _from_text(path: Path):
    rows = []
    for number, line in enumerate(read_text(path, OPTION).split("\n"), start=1):
        words = [word for word in SEPARATORS.split(line) if word]
        if not words:
            continue
        bad = next((word for word in words if not ID_WORD.fullmatch(word)), None)
        if bad is not None:
            raise InputError(f"{OPTION} {path}: line {number} holds {bad[:20]!r}, not an id: ids are ASCII decimal "
                             "digits, separated by spaces, tabs or commas")
        rows.append([int(word) for word in words])
    if not rows:
        raise InputError(f"{OPTION} {path} holds no ids")
    return rows


def _rows(path: Path, raw_dtype: str) -> list[list[int]]:
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return _from_npy(path)
    if suffix == ".bin":
        return _from_raw(path, raw_dtype)
    if suffix == ".json":
        return _from_json(path)
    return _from_text(path)


def _draw_windows(stream: list[int], context: int, count: int, seed: int) -> tuple[list[list[int]], list[int]]:
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(len(stream) - context + 1, (count,), generator=generator).tolist()
    return [stream[start : start + context] for start in starts], starts


def read_token_ids_file(inputs: "InputSpec", positions: Optional[int]) -> IdsFromFile:
    """The sequences of inputs.token_ids_file (windows of it with inputs.windows), and a note on where they came
    from."""
    path = inputs.token_ids_file
    rows = _rows(path, inputs.ids_dtype)
    total = sum(map(len, rows))
    if total == 0 or not all(rows):
        raise InputError(f"{OPTION} {path} holds an empty sequence")
    context = inputs.context or positions
    if inputs.windows is None:
        too_long = [len(row) for row in rows if context is not None and len(row) > context]
        if too_long:
            raise UsageError(f"{OPTION} {path} holds a sequence of {too_long[0]} ids, longer than the "
                             f"{context}-token context: draw windows of it with --windows N")
        return IdsFromFile(rows, f"{len(rows)} sequence{'s' if len(rows) > 1 else ''} from {path.name}")
    if len(rows) != 1:
        raise UsageError(f"--windows draws windows from one stream of ids; {path} holds {len(rows)} sequences")
    if context is None:
        raise UsageError("--windows needs the window length: the checkpoint does not say its context, give --context")
    if len(rows[0]) < context:
        raise UsageError(f"{OPTION} {path} holds {len(rows[0])} ids, fewer than one {context}-token window")
    windows, starts = _draw_windows(rows[0], context, inputs.windows, inputs.window_seed)
    shown = ", ".join(map(str, starts[:6])) + (" …" if len(starts) > 6 else "")
    return IdsFromFile(windows, f"{inputs.windows} window{'s' if inputs.windows > 1 else ''} of {context} ids from "
                                f"{path.name} ({len(rows[0])} ids), drawn with --seed {inputs.window_seed} at offsets "
                                f"{shown}")
