"""What following training costs: the Watch inside a training loop, and `track` over checkpoints.

    python benchmarks/bench_training.py
    python benchmarks/bench_training.py --watch-only   # the Watch's cost on HF's GPT-2 and on hand-written attention

Watch: a GPT-2-small-shaped 2-layer model (d_model 768, 12 heads, d_ff 3072; a vocabulary of
8192, so that the blocks are most of the step), T 512, AdamW, HF's sdpa attention. Windows of
50 training steps without and with `Watch(every=50)` (one recording step per window),
interleaved; and single plain steps against single recording steps, interleaved.

track: 20 checkpoints of a 12-layer GPT-2-small-shaped model (vocabulary 50257, float32,
475 MiB each), every one distinct. With each file evicted from the page cache first, the time
`blocktrace track` spends per checkpoint against the time to read the file's bytes once; and
track's peak memory over 5 and over 20 checkpoints (it must not grow with their number).

Prints the section; benchmarks/bench.py puts it into benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_load import evict_from_page_cache  # noqa: E402
from common import DATA, gpt2_checkpoint  # noqa: E402

WATCH_EVERY, WINDOWS, PAIRS, TOKENS = 50, 2, 6, 512
SERIES, SERIES_SMALL, TRACK_TOKENS = 20, 5, 64
TARGET_WINDOW, TARGET_RECORDING = 1.03, 1.3


def _model():
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=768, n_head=12, n_layer=2, n_positions=TOKENS, vocab_size=8192,
                                     attn_implementation="sdpa")
    model = transformers.GPT2LMHeadModel(config).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _hand_written_model():
    """The learner's model (sample_weights/learner/charmodel.py: attention written by hand, forward(idx, targets))
    at the same sizes: the Watch sees its attention through the softmax it computes."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sample_weights" / "learner"))
    from charmodel import CharGPT

    torch.manual_seed(0)
    model = CharGPT(vocab_size=8192, n_embd=768, n_head=12, n_layer=2, block_size=TOKENS + 1).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def _loss(model, ids):
    """HF's forward(ids, labels=ids), or the hand-written forward(idx, targets) on the ids advanced by one."""
    if hasattr(model, "config"):
        return model(ids, labels=ids).loss
    return model(ids[:, :-1], ids[:, 1:].contiguous())[1]


def _step(model, optimizer, ids, watch=None) -> float:
    start = time.perf_counter()
    loss = _loss(model, ids)
    loss.backward()
    if watch is not None:
        watch.step(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def watch_cost(work: Path, make_model=_model) -> dict:
    import torch

    from blocktrace import Watch

    model, optimizer = make_model()
    ids = torch.randint(0, 8192, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        _step(model, optimizer, ids)
    plain, watched = [], []
    for _ in range(WINDOWS):
        plain.append(sum(_step(model, optimizer, ids) for _ in range(WATCH_EVERY)))
        watch = Watch(model, work / "window.jsonl", every=WATCH_EVERY, optimizer=optimizer, overwrite=True)
        watched.append(sum(_step(model, optimizer, ids, watch) for _ in range(WATCH_EVERY)))
        watch.close()
    single, recording = [], []
    for _ in range(PAIRS):
        single.append(_step(model, optimizer, ids))
        watch = Watch(model, work / "pairs.jsonl", every=1, optimizer=optimizer, overwrite=True)
        recording.append(_step(model, optimizer, ids, watch))
        watch.close()
    return {"plain_window": statistics.median(plain), "watched_window": statistics.median(watched),
            "plain_step": statistics.median(single), "recording_step": statistics.median(recording)}


def _series(base: Path, directory: Path) -> list[Path]:
    """SERIES distinct checkpoints: the base weights moved a little more at every step."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(base / "model.safetensors"))
    generator = torch.Generator().manual_seed(3)
    paths = []
    for index in range(SERIES):
        path = directory / f"step_{index * 100:05d}"
        path.mkdir(parents=True, exist_ok=True)
        if not (path / "model.safetensors").is_file():
            for name, tensor in tensors.items():
                tensor.add_(torch.randn(tensor.shape, generator=generator), alpha=1e-3)
            save_file(tensors, str(path / "model.safetensors"))
            shutil.copy(base / "config.json", path / "config.json")
        paths.append(path)
    return paths


def _read_seconds(paths: list[Path]) -> float:
    total = 0.0
    for path in paths:
        file = str(path / "model.safetensors")
        evict_from_page_cache(file)
        start = time.perf_counter()
        with open(file, "rb") as handle:
            while handle.read(1 << 24):
                pass
        total += time.perf_counter() - start
    return total


TRACK = """
import json, sys, time
from click.testing import CliRunner
from blocktrace.cli import cli
start = time.perf_counter()
result = CliRunner().invoke(cli, ["track", *{paths!r}, "--token-ids", {ids!r}, "--json"])
report = json.loads(result.stdout)
RESULT = {{'seconds': time.perf_counter() - start, 'records': len(report['records'])}}
"""


def _track(paths: list[Path]) -> dict:
    from common import in_subprocess

    for path in paths:
        evict_from_page_cache(str(path / "model.safetensors"))
    ids = " ".join(str(7 * i % 50257) for i in range(TRACK_TOKENS))
    return in_subprocess(TRACK.format(paths=[str(p) for p in paths], ids=ids))


def track_cost() -> dict:
    directory = DATA / "track-series"
    paths = _series(gpt2_checkpoint(12, 768, 12), directory)
    small = _track(paths[:SERIES_SMALL])
    full = _track(paths)
    read = _read_seconds(paths)
    size = (paths[0] / "model.safetensors").stat().st_size
    return {"track_seconds": full["seconds"], "read_seconds": read, "records": full["records"],
            "peak_small": small["peak_rss_mib"], "peak_full": full["peak_rss_mib"], "file_mib": size / 2**20}


def training_section() -> list[str]:
    work = DATA / "watch-bench"
    work.mkdir(parents=True, exist_ok=True)
    watch = watch_cost(work)
    window = watch["watched_window"] / watch["plain_window"]
    recording = watch["recording_step"] / watch["plain_step"]
    # The same cost from the paired single steps: 49 plain steps and one recording against 50 plain ones. Two
    # windows of 50 steps on a shared machine swing by several percent either way; the paired steps do not.
    implied = ((WATCH_EVERY - 1) + recording) / WATCH_EVERY
    track = track_cost()
    per_checkpoint = track["track_seconds"] / SERIES
    per_read = track["read_seconds"] / SERIES

    def verdict(ratio, target):
        return "met" if ratio <= target else "MISSED"

    return [
        "## Following training: the Watch and `track`", "",
        f"Watch: GPT-2-small-shaped, 2 layers (d_model 768, 12 heads, vocabulary 8192), 1×{TOKENS} tokens, AdamW, "
        f"sdpa attention; median of {WINDOWS} interleaved windows of {WATCH_EVERY} steps, and of {PAIRS} "
        "interleaved single steps.", "",
        "| case | seconds |", "|---|---|",
        f"| {WATCH_EVERY} plain steps | {watch['plain_window']:.2f} |",
        f"| {WATCH_EVERY} steps with `Watch(every={WATCH_EVERY})` (one recording) | {watch['watched_window']:.2f} |",
        f"| one plain step | {watch['plain_step']:.3f} |",
        f"| one recording step (statistics, attention, checks, gradient norms, ‖ΔW‖/‖W‖, one JSON line) | "
        f"{watch['recording_step']:.3f} |", "",
        f"- training time with the watch at every={WATCH_EVERY}: {window:.3f} × without (target ≤ {TARGET_WINDOW}: "
        f"{verdict(window, TARGET_WINDOW)})",
        f"- the same from the single steps, (49 plain + 1 recording) / 50 plain: {implied:.4f} × without (target ≤ "
        f"{TARGET_WINDOW}: {verdict(implied, TARGET_WINDOW)}; the windows measure the same thing, less steadily)",
        f"- a recording step: {recording:.3f} × a plain step (target ≤ {TARGET_RECORDING}: "
        f"{verdict(recording, TARGET_RECORDING)})", "",
        f"`blocktrace track` over {SERIES} checkpoints of a 12-layer GPT-2-small-shaped model "
        f"({track['file_mib']:.0f} MiB each, float32), {TRACK_TOKENS} token ids, every file evicted from the page "
        "cache first (`posix_fadvise DONTNEED`), in a fresh process:", "",
        f"- {per_checkpoint:.2f} s per checkpoint against {per_read:.2f} s to read its bytes once: "
        f"{per_checkpoint / per_read:.2f} × the read",
        f"- peak memory: {track['peak_small']:.0f} MiB over {SERIES_SMALL} checkpoints, {track['peak_full']:.0f} MiB "
        f"over {SERIES} (one checkpoint file: {track['file_mib']:.0f} MiB)", "",
    ]


def watch_section(work: Path) -> list[str]:
    """The Watch's cost alone (`--watch-only`), on HF's GPT-2 (sdpa) and on the hand-written model, interleaved per
    model; the recording step includes the audit, the checks and the descent probe at the optimizer step after."""
    lines = ["| model | every=50 window ratio | (49 plain + 1 recording) / 50 | recording step ratio |", "|---|---|---|---|"]
    for name, make in (("HF GPT-2, sdpa attention", _model), ("hand-written attention (learner's CharGPT)",
                                                               _hand_written_model)):
        watch = watch_cost(work, make)
        recording = watch["recording_step"] / watch["plain_step"]
        lines.append(f"| {name} | {watch['watched_window'] / watch['plain_window']:.3f} | "
                     f"{((WATCH_EVERY - 1) + recording) / WATCH_EVERY:.4f} | {recording:.3f} |")
    return lines


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--watch-only", action="store_true",
                        help="only the Watch's cost on HF's GPT-2 and on hand-written attention")
    if parser.parse_args().watch_only:
        folder = DATA / "watch-bench"
        folder.mkdir(parents=True, exist_ok=True)
        print("\n".join(watch_section(folder)))
    else:
        print("\n".join(training_section()))
