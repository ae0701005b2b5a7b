"""How much memory a run needs, estimated before anything is allocated, and how much there is.

A request that cannot fit (`--d-model 20000`, `--layers 100000`, `--seq-len 100000`) is
refused at once with the estimate and what is available, instead of growing until the
machine runs out of memory. The estimate is deliberately simple and errs large: parameters
of every block, plus one block's working activations (or every block's, with --grad).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from blocktrace.errors import UsageError

FIT_FRACTION = 0.75  # refuse beyond this share of the available memory: the rest is headroom
# Sizes past any model blocktrace reads, refused as options: within them memory is estimated, beyond them
# a run would take hours even where it fits (attention is T², a gradient average is one backward per batch).
MAX_LAYERS = 1024  # DeepNet's 1,000-layer Transformer is the deepest published
MAX_TOKENS = 131_072  # the longest context of the families blocktrace reads (Llama-3.1, Qwen2.5: 128k)
MAX_WIDTH = 1 << 20  # d_model / d_ff: 64× GPT-3's d_model, 16× Llama-3-405B's d_ff
MAX_BATCHES = 1024  # mini-batches averaged for one gradient


@dataclass(frozen=True)
class Shape:
    batch: int
    tokens: int


def _block_parameters(config) -> int:
    d, f, hd = config.d_model, config.d_ff, config.head_dim
    attention = d * hd * (2 * config.n_heads + 2 * config.n_kv_heads)
    ffn = d * f * (3 if config.ffn.gated else 2)
    return attention + ffn + 4 * d


def _block_activations(config, shape: Shape, attention_rows: int) -> int:
    """Elements alive at once inside one block's forward: the stream, q/k/v, the FFN hidden,
    and one chunk of attention scores and weights."""
    tokens = shape.batch * shape.tokens
    stream = tokens * (8 * config.d_model + (3 if config.ffn.gated else 2) * config.d_ff)
    scores = 2 * shape.batch * config.n_heads * attention_rows * shape.tokens
    return stream + scores


def estimate_bytes(config, n_layers: int, shape: Shape, element_size: int, *, grad: bool,
                   keep_tensors: bool, chunk_bytes: int, attn_chunk: Optional[int], kept_streams: int = 0) -> int:
    """Parameters (three copies each with gradients: weight, grad, a float64 reduction's share), working
    activations (every block's with --grad over a whole stack), and `kept_streams` [B, T, d] streams held besides."""
    per_row = max(1, shape.batch * config.n_heads * shape.tokens * element_size)
    rows = min(shape.tokens, attn_chunk or max(1, chunk_bytes // per_row))
    if grad or keep_tensors:
        rows = shape.tokens  # autograd and --save keep every chunk
    parameters = n_layers * _block_parameters(config) * element_size * (3 if grad else 1)
    activations = _block_activations(config, shape, rows) * element_size
    if grad:
        activations *= n_layers
    streams = kept_streams * shape.batch * shape.tokens * config.d_model * element_size
    return parameters + activations + streams


def available_bytes(device) -> Optional[int]:
    """Free memory of the device: CUDA's own count, or MemAvailable of /proc/meminfo."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch  # here, not at the top: the CLI's options read this module, and --help stays free of torch

        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PiB"


def require_fit(needed: int, device, what: str) -> None:
    free = available_bytes(device)
    if free is not None and needed > FIT_FRACTION * free:
        raise UsageError(f"this run needs about {human(needed)} of memory ({what}) and {human(free)} is available "
                         "on the device: use fewer layers, a smaller width or fewer tokens")
