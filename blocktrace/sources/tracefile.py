"""Trace files: a trace's tensors in one safetensors file, config and step order in its metadata.

Writes go to a temporary file beside the target and are renamed into place, so a failed
or interrupted run never leaves a half-written file under the user's name.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from blocktrace.errors import BlocktraceError


def check_output_path(path: Path, force: bool) -> None:
    """Fail before any work is done if `path` cannot be written."""
    parent = path.parent
    if not parent.is_dir():
        raise BlocktraceError(f"cannot write {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise BlocktraceError(f"cannot write {path}: directory {parent} is not writable")
    if path.is_dir():
        raise BlocktraceError(f"cannot write {path}: it is a directory")
    if path.exists() and not force:
        raise BlocktraceError(f"{path} already exists: pass --force to overwrite it")


def save_trace_file(path: Path, tensors: dict, *, config: dict, step_order: Sequence[str],
                    tokens: Optional[Sequence[str]] = None, extra: Optional[dict] = None) -> None:
    from safetensors.torch import save_file

    from blocktrace._version import __version__

    metadata = {
        "format": "pt",
        "blocktrace_version": __version__,
        "config": json.dumps(config),
        "step_order": json.dumps(list(step_order)),
        "tokens": json.dumps(list(tokens) if tokens else None, ensure_ascii=False),
        **{key: json.dumps(value) for key, value in (extra or {}).items()},
    }
    contiguous = {name: tensor.detach().contiguous().cpu() for name, tensor in tensors.items()}
    temporary = None
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        save_file(contiguous, temporary, metadata=metadata)
        os.replace(temporary, path)
    except OSError as error:
        raise BlocktraceError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        if temporary is not None and Path(temporary).exists():
            Path(temporary).unlink()


def save_trace(trace, path, tokens: Optional[Sequence[str]] = None, force: bool = False) -> None:
    """Save a trace (kept tensors) in the `--save` format: for `blocktrace diff`, from any block.

    `trace` must have been made with keep_tensors=True; works for a user's block too.
    """
    path = Path(path)
    check_output_path(path, force)
    save_trace_file(path, trace.tensors(), config=trace.describe(), step_order=[s.name for s in trace.steps],
                    tokens=tokens, extra={"layout": trace.layout, "placement": trace.placement})
