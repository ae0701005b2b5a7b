"""Reading the user's input files: each checked to be a regular file before it is opened.

A FIFO, a device or a socket given where a file is expected would block forever or read
without end; a directory or a missing path is named. Errors name the option the user gave.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from blocktrace.errors import InputError
from blocktrace.files import file_kind

MAX_JSON_DEPTH = 100  # far deeper than any config, trace metadata or timeline record; bounds every recursion after

def _named(path: Path, option: str) -> str:
    return f"{option} {path}" if option else str(path)


def require_regular(path: Path, option: str = "") -> int:
    """The size of the regular file at path; anything else is one error naming the option (if given)."""
    try:
        mode = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"{_named(path, option)}: no such file") from None
    except OSError as error:
        raise InputError(f"{_named(path, option)}: cannot read it: {error.strerror or error}") from None
    if not stat.S_ISREG(mode.st_mode):
        raise InputError(f"{_named(path, option)} is {file_kind(mode.st_mode)}: give a regular file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{_named(path, option)}: cannot read it: Permission denied")
    return mode.st_size


def read_bytes(path: Path, option: str = "") -> bytes:
    require_regular(path, option)
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise InputError(f"{_named(path, option)}: cannot read it: {error.strerror or error}") from None


def read_text(path: Path, option: str = "") -> str:
    data = read_bytes(path, option)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"{_named(path, option)} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def parse_json(text: str) -> object:
    """json.loads with a nesting limit: ValueError (saying why) for text that is not JSON or nests deeper than
    MAX_JSON_DEPTH, so a hostile file is refused in one line instead of a RecursionError."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    # a value nests no deeper than the brackets its text opens: counting them (fast) spares walking most values
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _nests_deeper(value, MAX_JSON_DEPTH):
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _nests_deeper(value: object, limit: int) -> bool:
    pending = [(value, 1)]  # a loop, not a recursion: the value may be as deep as the parser allowed
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False
