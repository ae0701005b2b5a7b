"""Writing the user's files safely: every file blocktrace writes goes through here.

- Checked before any work (`check_output_path`), so a long run does not fail at its end
  for a path that could never be written.
- Written under a temporary name in the target's directory, then committed in one step:
  without `force` by a hard link, which fails if the name appeared meanwhile (no check-then-
  write race between two runs); with `force` by a rename over the old file.
- Only a regular file may be replaced: a directory, a symbolic link, a FIFO or a device is
  refused, with or without `force`.
- The temporary file is removed on any error, on Ctrl-C and on SIGTERM (then the signal's
  own action runs), so no half-written file is left under either name.
- New files get the usual mode (0666 less the umask); a replaced file keeps its mode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO, Callable

from blocktrace.errors import BlocktraceError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a stat mode that is not a regular file's is, in words ("a FIFO"); "a regular file" otherwise."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")

Writer = Callable[[BinaryIO], None]


class OutputError(BlocktraceError):
    """An output path that cannot be written, or a write that failed."""


def _kind(mode: int) -> str:
    return "a symbolic link" if stat.S_ISLNK(mode) else file_kind(mode)


def _existing(path: Path):
    """lstat of path, or None when nothing is there."""
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror}") from None


def check_output_path(path: Path, force: bool) -> None:
    """Fail before any work is done if `path` cannot be written (or may not be replaced)."""
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise OutputError(f"cannot write {path}: directory {parent} is not writable")
    found = _existing(path)
    if found is None:
        return
    if not stat.S_ISREG(found.st_mode):
        raise OutputError(f"cannot write {path}: it is {_kind(found.st_mode)}; only a regular file may be replaced")
    if not force:
        raise OutputError(f"{path} already exists: pass --force to overwrite it")


def check_distinct_outputs(outputs: dict) -> None:
    """Two outputs of one command (option → path) may not name the same file: one would replace the other."""
    seen: dict = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise OutputError(f"{seen[key]} and {option} both name {path}: give each output its own file")
        seen[key] = option


def _new_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


class _Terminated(BaseException):
    """SIGTERM arrived while a file was being written (BaseException: nothing may swallow it)."""


@contextlib.contextmanager
def _terminate_cleanly():
    """While active, SIGTERM raises inside the write so `finally` can clean up; afterwards the
    signal is delivered again to its previous handler (by default: the process ends)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived = []

    def on_term(signum, frame):
        arrived.append(signum)
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    except _Terminated:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    if arrived:
        signal.raise_signal(signal.SIGTERM)  # the default action ends the process here
        raise OutputError("interrupted by SIGTERM: nothing was written")


def _commit(temporary: Path, path: Path, force: bool) -> None:
    found = _existing(path)
    if found is not None and not stat.S_ISREG(found.st_mode):
        raise OutputError(f"cannot write {path}: it is {_kind(found.st_mode)}; only a regular file may be replaced")
    if force:
        if found is not None:
            os.chmod(temporary, stat.S_IMODE(found.st_mode))
        os.replace(temporary, path)
        return
    try:
        os.link(temporary, path)  # atomic, and fails if the name exists: no clobbering a file made meanwhile
    except FileExistsError:
        raise OutputError(f"{path} already exists (it appeared while blocktrace was working): "
                          "pass --force to overwrite it") from None
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
        _copy_exclusively(temporary, path)  # a filesystem without hard links


def _copy_exclusively(source: Path, path: Path) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        raise OutputError(f"{path} already exists: pass --force to overwrite it") from None
    try:
        with os.fdopen(fd, "wb") as target, open(source, "rb") as origin:
            while chunk := origin.read(1 << 20):
                target.write(chunk)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


_GROUPS: list[list[Path]] = []  # the files created inside each open all_or_none(), innermost last


@contextlib.contextmanager
def all_or_none():
    """A command's outputs, kept only if every one is written: an error inside removes the files it created (a file
    `force` replaced is not restored: its old content was given up when --force was passed)."""
    created: list[Path] = []
    _GROUPS.append(created)
    try:
        yield
    except BaseException:
        for path in reversed(created):
            with contextlib.suppress(OSError):
                path.unlink()
        raise
    finally:
        _GROUPS.remove(created)


def write_atomically(path: Path, write: Writer, force: bool) -> None:
    """Write through `write(handle)` to a temporary file, then commit it as `path`."""
    path = Path(path)
    new = _existing(path) is None
    temporary = None
    try:
        with _terminate_cleanly():
            try:
                fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
                temporary = Path(name)
                os.chmod(temporary, _new_file_mode())
                with os.fdopen(fd, "wb") as handle:
                    write(handle)
                _commit(temporary, path, force)
                if new and _GROUPS:
                    _GROUPS[-1].append(path)
            finally:
                if temporary is not None:
                    with contextlib.suppress(OSError):
                        temporary.unlink()
    except OSError as error:
        raise OutputError(f"cannot write {path}: {error.strerror or error}") from None
