"""Loading one layer of a 12-layer GPT-2-small-shaped checkpoint against loading the whole file.

    python benchmarks/bench_load.py

Each load runs in a fresh interpreter (same machine, same run), so time and peak RSS are its own.
The baseline is everything a process needs before loading: python + torch + safetensors imported.
Prints the table; benchmarks/bench.py puts it into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import gpt2_checkpoint, in_subprocess, machine_facts  # noqa: E402

REPEATS = 3

BASELINE = """
import time, torch, safetensors.torch, blocktrace.sources.families
RESULT = {'seconds': 0.0}
"""

WHOLE = """
import time, torch, safetensors.torch, blocktrace.sources.families
start = time.perf_counter()
tensors = safetensors.torch.load_file({path!r})
touched = sum(float(t.sum()) for t in tensors.values())  # load_file maps lazily: read every byte
RESULT = {{'seconds': time.perf_counter() - start, 'bytes': sum(t.numel() * t.element_size() for t in tensors.values())}}
"""

ONE_LAYER = """
import time, torch, safetensors.torch
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import load_block
start = time.perf_counter()
checkpoint = Checkpoint({path!r})
info = model_info(checkpoint)
block = load_block(checkpoint, info, 11, checkpoint_config(checkpoint, info, {{}}))
touched = sum(float(p.sum()) for p in block.parameters())  # the same reading of every loaded byte
RESULT = {{'seconds': time.perf_counter() - start, 'bytes': sum(p.numel() * p.element_size() for p in block.parameters())}}
"""


def evict_from_page_cache(path: str) -> None:
    """Drop the file's cached pages (no root needed), so the next read comes from disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(code: str, cold_file: Optional[str] = None) -> dict:
    runs = []
    for _ in range(REPEATS):
        if cold_file:
            evict_from_page_cache(cold_file)
        runs.append(in_subprocess(code))
    return {"seconds": statistics.median(r["seconds"] for r in runs),
            "peak_rss_mib": statistics.median(r["peak_rss_mib"] for r in runs), "bytes": runs[0].get("bytes", 0)}


def compare(path: str, directory: str, base: dict, cold: bool) -> tuple[list, float, float]:
    whole = measure(WHOLE.format(path=path), path if cold else None)
    layer = measure(ONE_LAYER.format(path=directory), path if cold else None)
    extra_whole = whole["peak_rss_mib"] - base["peak_rss_mib"]
    extra_layer = layer["peak_rss_mib"] - base["peak_rss_mib"]
    cache = "cold page cache" if cold else "warm page cache"
    rows = [
        (f"whole file, {cache} (safetensors load_file, every tensor read)", whole["seconds"], extra_whole,
         whole["bytes"] / 2**20),
        (f"layer 11 only, {cache} (blocktrace load_block, every parameter read)", layer["seconds"], extra_layer,
         layer["bytes"] / 2**20),
    ]
    return rows, layer["seconds"] / whole["seconds"], extra_layer / extra_whole


def load_section() -> list[str]:
    directory = gpt2_checkpoint(n_layer=12, d_model=768, n_head=12)
    path = str(directory / "model.safetensors")
    base = measure(BASELINE)
    cold_rows, cold_time, cold_memory = compare(path, str(directory), base, cold=True)
    warm_rows, warm_time, warm_memory = compare(path, str(directory), base, cold=False)

    def verdict(time_ratio, memory_ratio):
        return "met" if max(time_ratio, memory_ratio) <= 0.2 else "MISSED"

    facts = machine_facts()
    lines = [
        "### Loading one layer against the whole checkpoint",
        "",
        f"Written by `python benchmarks/bench_load.py` on {facts['date']}: {facts['cpu']}, "
        f"Python {facts['python']}, torch {facts['torch']}. 12-layer GPT-2-small-shaped file "
        f"({Path(path).stat().st_size / 2**20:.0f} MiB, float32); median of {REPEATS} fresh processes each. "
        "Memory is peak RSS above a process that has imported torch, safetensors and blocktrace "
        f"({base['peak_rss_mib']:.0f} MiB). Cold: the file's pages are evicted from the page cache "
        "(posix_fadvise DONTNEED) before each run, as on a first look at a checkpoint; warm: the file is cached.",
        "",
        "| load | seconds | peak memory above baseline (MiB) | tensor bytes loaded (MiB) |",
        "|---|---|---|---|",
        *[f"| {name} | {s:.4f} | {m:.1f} | {b:.1f} |" for name, s, m, b in cold_rows + warm_rows],
        "",
        f"Ratios, one layer / whole file, cold: time {cold_time:.3f}, peak memory {cold_memory:.3f} "
        f"(target ≤ 0.2: {verdict(cold_time, cold_memory)}).",
        f"Ratios, one layer / whole file, warm: time {warm_time:.3f}, peak memory {warm_memory:.3f} "
        f"(target ≤ 0.2: {verdict(warm_time, warm_memory)}).",
        "",
    ]
    return lines


def main() -> None:
    print("\n".join(load_section()))


if __name__ == "__main__":
    main()
