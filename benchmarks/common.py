"""Shared benchmark helpers: a GPT-2-shaped checkpoint, machine facts, interleaved timing, and peak-memory probes."""

from __future__ import annotations

import functools
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parent / "_data"  # ignored by git: files are rebuilt on demand


def interleaved(cases: dict, rounds: int, warmup: int = 2, synchronise=lambda: None) -> dict[str, float]:
    """Each case once per round, rounds interleaved (so machine noise hits every case alike), after `warmup`
    rounds; the median seconds per case. `synchronise` waits for a device's queue around each call."""
    for _ in range(warmup):
        for run in cases.values():
            run()
    times: dict = {name: [] for name in cases}
    for _ in range(rounds):
        for name, run in cases.items():
            synchronise()
            start = time.perf_counter()
            run()
            synchronise()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


# CPU flags of native bfloat16 arithmetic: x86's AVX512-BF16 and AMX, Arm's BF16 extension
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile", "bf16")
BF16_PROBE = 4096  # the side of the square matmul timed in both dtypes
# a first look at a small matmul: where bfloat16 is this many times slower than float32 it is emulated beyond doubt,
# and the 4096² product (15 minutes in bfloat16 on this project's emulating AVX2 CPU) is not run
BF16_GLANCE, BF16_EMULATED_RATIO = 512, 4.0


def _cpu_lines() -> dict[str, str]:
    """The first core's /proc/cpuinfo fields ({} where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.lru_cache(maxsize=1)
def _bf16_probe() -> tuple[bool, str]:
    """(whether bfloat16 is native here, what says so): the CPU's flags and a [4096 × 4096] matmul timed in bfloat16
    and in float32 (best of two, after one warm-up); native when bfloat16 is the faster. A [512 × 512] one first:
    where bfloat16 is 4 × slower or more there, it is emulated, said with those times."""
    fields = _cpu_lines()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    found = ", ".join(flag for flag in BF16_FLAGS if flag in flags) or "no bf16 flag"
    side = BF16_GLANCE
    seconds = _matmul_seconds(side)
    if seconds["bfloat16"] < BF16_EMULATED_RATIO * seconds["float32"]:
        side = BF16_PROBE
        seconds = _matmul_seconds(side)
    native = seconds["bfloat16"] < seconds["float32"]
    return native, (f"bfloat16 {'native' if native else 'emulated'} ({found}; a {side}² matmul "
                    f"{seconds['bfloat16']:.3g} s in bfloat16 against {seconds['float32']:.3g} s in float32)")


def _matmul_seconds(side: int) -> dict[str, float]:
    """A [side × side] matmul's seconds in float32 and in bfloat16, best of two after one warm-up."""
    import torch

    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a, b = (torch.randn(side, side, generator=torch.Generator().manual_seed(k)).to(dtype) for k in (0, 1))
        a @ b
        seconds[str(dtype).removeprefix("torch.")] = min(_timed(lambda: a @ b) for _ in range(2))
    return seconds


def bf16_native() -> bool:
    """Whether bfloat16 arithmetic is native on this CPU (_bf16_probe): a bfloat16 row of a benchmark is read
    against it."""
    return _bf16_probe()[0]


def bf16_capability() -> str:
    """The bfloat16 verdict in words, for a benchmark's header."""
    return _bf16_probe()[1]


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def machine_facts() -> dict:
    """The date, Python, torch, threads and the CPU — its model name with its bfloat16 capability (bf16_capability)."""
    import torch

    name = _cpu_lines().get("model name", "unknown")
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": platform.python_version(),
            "torch": torch.__version__, "cpu": f"{name} [{bf16_capability()}]", "threads": torch.get_num_threads()}


def gpt2_checkpoint(n_layer: int, d_model: int, n_head: int, vocab: int = 50257, positions: int = 1024) -> Path:
    """A GPT-2-layout safetensors file with random weights, written once and reused."""
    import torch
    from safetensors.torch import save_file

    directory = DATA / f"gpt2-{n_layer}x{d_model}"
    if (directory / "model.safetensors").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    d, f = d_model, 4 * d_model
    tensors = {"wte.weight": torch.randn(vocab, d, generator=g) * 0.02,
               "wpe.weight": torch.randn(positions, d, generator=g) * 0.01}
    for k in range(n_layer):
        shapes = {"ln_1.weight": (d,), "ln_1.bias": (d,), "attn.c_attn.weight": (d, 3 * d),
                  "attn.c_attn.bias": (3 * d,), "attn.c_proj.weight": (d, d), "attn.c_proj.bias": (d,),
                  "ln_2.weight": (d,), "ln_2.bias": (d,), "mlp.c_fc.weight": (d, f), "mlp.c_fc.bias": (f,),
                  "mlp.c_proj.weight": (f, d), "mlp.c_proj.bias": (d,)}
        for name, shape in shapes.items():
            tensors[f"h.{k}.{name}"] = torch.randn(*shape, generator=g) * 0.02
    tensors["ln_f.weight"], tensors["ln_f.bias"] = torch.ones(d), torch.zeros(d)
    save_file(tensors, str(directory / "model.safetensors"))
    config = {"model_type": "gpt2", "n_embd": d, "n_head": n_head, "n_layer": n_layer, "n_positions": positions,
              "vocab_size": vocab, "layer_norm_epsilon": 1e-5, "activation_function": "gelu_new"}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def in_subprocess(code: str) -> dict:
    """Run `code` in a fresh interpreter; it prints one JSON dict. Adds that process's peak RSS (MiB).

    The peak is VmHWM from /proc/self/status, not getrusage's ru_maxrss: Linux keeps ru_maxrss
    across execve, so a child of a large process would report its parent's peak.
    """
    wrapped = code + "\nimport json as _j\n" \
        "_hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0].split()[1]\n" \
        "print(_j.dumps({**RESULT, 'peak_rss_mib': int(_hwm) / 1024}))"
    output = subprocess.run([sys.executable, "-c", wrapped], capture_output=True, text=True, check=True)
    return json.loads(output.stdout.strip().splitlines()[-1])


RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
# Sections of RESULTS.md written by scripts of their own (long runs): bench.py keeps them when it rewrites the file.
OWN_SECTIONS = ("## Real sizes: 3B and 8B checkpoints, `check` beside HF",
                "## Where the trace's time goes (GPT-2 small and XL, T 1024, CPU)",
                "## Gradients where HF's backward fits: 1B, `check --grad` beside HF",
                "## Reading ahead: `check` from a cold page cache",
                "## A command's process, start to exit",
                # pasted from bench_training.py --watch-only and bench_track_records.py, which print and do not write
                "## The Watch with the audit, the invariants and the descent probe; track over many records (2026-12-03)",
                "## The Watch under DDP: cost and collectives (2 and 4 gloo ranks, CPU)")


def kept_section(text: str, heading: str) -> str:
    """The section under `heading` of a RESULTS.md text, as last written ("" when absent)."""
    _, found, after = text.partition(heading)
    return found + after.split("\n## ", 1)[0] if found else ""


def write_section(heading: str, lines: list[str]) -> None:
    """Replace the section under `heading` in RESULTS.md (or append it), leaving every other section as it was."""
    text = RESULTS.read_text() if RESULTS.is_file() else ""
    before, found, after = text.partition(heading)
    if found:
        rest = after.split("\n## ", 1)
        after = "\n## " + rest[1] if len(rest) > 1 else ""
    RESULTS.write_text(before.rstrip("\n") + "\n\n" + "\n".join(lines) + after)
