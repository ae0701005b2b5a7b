"""Trace files: a trace's tensors in one safetensors file, config and step order in its metadata.

Written by blocktrace's own safetensors serialiser so that the same trace always gives the
same bytes (tensors and metadata in sorted order) and tensors stream to disk one at a time;
committed through blocktrace.files (atomic, no clobbering). Read back with safetensors.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import BinaryIO, Optional, Sequence

import torch

from blocktrace._version import __version__
from blocktrace.errors import InputError
from blocktrace.files import check_output_path, write_atomically
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.reading import parse_json

# safetensors' dtype codes (https://github.com/huggingface/safetensors, format description)
_DTYPE_CODES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                torch.bool: "BOOL"}
_HEADER_ALIGNMENT = 8  # the header is padded with spaces so the data starts 8-byte aligned


def write_safetensors(handle: BinaryIO, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """The safetensors format, deterministically: tensors by name, metadata keys sorted."""
    ordered = {name: tensors[name].detach().contiguous().cpu() for name in sorted(tensors)}
    header: dict = {"__metadata__": dict(sorted(metadata.items()))}
    offset = 0
    for name, tensor in ordered.items():
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _DTYPE_CODES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    encoded += b" " * (-len(encoded) % _HEADER_ALIGNMENT)
    handle.write(struct.pack("<Q", len(encoded)))
    handle.write(encoded)
    for tensor in ordered.values():
        if tensor.numel():
            handle.write(tensor.reshape(-1).view(torch.uint8).numpy().data)


def save_trace_file(path: Path, tensors: dict, *, config: dict, step_order: Sequence[str],
                    tokens: Optional[Sequence[str]] = None, extra: Optional[dict] = None,
                    force: bool = False) -> None:
    metadata = {
        "format": "pt",
        "blocktrace_version": __version__,
        "config": json.dumps(config, sort_keys=True),
        "step_order": json.dumps(list(step_order)),
        "tokens": json.dumps(list(tokens) if tokens else None, ensure_ascii=False),
        **{key: json.dumps(value, sort_keys=True) for key, value in (extra or {}).items()},
    }
    write_atomically(Path(path), lambda handle: write_safetensors(handle, tensors, metadata), force)


def save_trace(trace, path, tokens: Optional[Sequence[str]] = None, force: bool = False) -> None:
    """Save a trace (kept tensors) in the `--save` format: for `blocktrace diff`, from any block.

    `trace` must have been made with keep_tensors=True; works for a user's block too.
    """
    path = Path(path)
    check_output_path(path, force)
    save_trace_file(path, trace.tensors(), config=trace.describe(), step_order=[s.name for s in trace.steps],
                    tokens=tokens, extra={"module": trace.module, "placement": trace.placement}, force=force)


def open_trace(path: Path):
    """(checkpoint, step order) of a trace file; refuses files that are not blocktrace traces."""
    checkpoint = Checkpoint(path)
    raw = checkpoint.metadata().get("step_order")
    hint = "make one with `blocktrace run --save` or blocktrace.sources.tracefile.save_trace"
    if raw is None:
        raise InputError(f"{path} is not a blocktrace trace file (no step_order in its metadata): {hint}")
    try:
        order = parse_json(raw)
    except ValueError:
        order = None
    if not isinstance(order, list) or not all(isinstance(name, str) for name in order):
        raise InputError(f"{path}: step_order in its metadata must be a JSON list of step names, not {raw[:60]!r}")
    return checkpoint, order
