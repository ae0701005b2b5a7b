"""Reading ahead: `check` of a real-size checkpoint from a cold page cache, with and without the read-ahead
(sources/readahead.py), beside the same check from a warm cache.

    sudo python benchmarks/bench_read_ahead.py              # the 1b of bench_real_sizes.py, bfloat16; 3 rounds
    sudo python benchmarks/bench_read_ahead.py --size 3b

Needs root: each cold case empties the page cache first (`sync; echo 1 > /proc/sys/vm/drop_caches`). The cases run
interleaved (cold with, cold without, warm with), each a fresh `python -m blocktrace check` process; "without" is
the same command with the read-ahead switched off in that process only. Also measures what one posix_fadvise call
over a whole shard caches against the same advice given 8 MB at a time (what readahead.CHUNK is set from). Writes
its section of RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_real_sizes import checkpoint, token_ids
from common import OWN_SECTIONS, machine_facts, write_section

SECTION = OWN_SECTIONS[3]
WITHOUT = "import blocktrace.sources.readahead as r; r.supported = lambda: False; from blocktrace.cli import main; main()"


def drop_page_cache() -> None:
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def cached_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) * 1024
    return 0


def advice_caches(file: Path, chunk: int) -> int:
    """Bytes the page cache gained 3 s after advising the whole file WILLNEED, in calls of `chunk` bytes (0: one
    call with length 0, "to the end")."""
    drop_page_cache()
    before = cached_bytes()
    descriptor = os.open(file, os.O_RDONLY)
    size = os.fstat(descriptor).st_size
    for offset in range(0, size, chunk) if chunk else [0]:
        os.posix_fadvise(descriptor, offset, chunk, os.POSIX_FADV_WILLNEED)
    os.close(descriptor)
    time.sleep(3)
    return cached_bytes() - before


def run(command: list[str], cold: bool) -> tuple[float, float]:
    if cold:
        drop_page_cache()
    start = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if out.returncode not in (0, 1):
        raise RuntimeError(out.stderr[-2000:])
    return seconds, json.loads(out.stdout)["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1b", choices=["1b", "3b", "8b"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    directory, ids = checkpoint(args.size), token_ids()
    check = ["check", "--weights", str(directory), "--token-ids-file", str(ids), "--dtype", "bfloat16", "--json"]
    commands = {"cold, read ahead": ([sys.executable, "-m", "blocktrace", *check], True),
                "cold, without": ([sys.executable, "-c", WITHOUT, *check], True),
                "warm, read ahead": ([sys.executable, "-m", "blocktrace", *check], False)}
    times: dict = {name: [] for name in commands}
    losses = set()
    for _ in range(args.rounds):
        for name, (command, cold) in commands.items():
            seconds, loss = run(command, cold)
            times[name].append(seconds)
            losses.add(loss)
            print(f"{name}: {seconds:.1f} s", flush=True)
    shard = sorted(directory.glob("*.safetensors"))[1]
    whole, chunked = advice_caches(shard, 0), advice_caches(shard, 8 << 20)
    facts = machine_facts()
    warm = statistics.median(times["warm, read ahead"])
    rows = [f"| {name} | {statistics.median(values):.1f} s | {statistics.median(values) / warm:.2f}× | "
            f"{', '.join(f'{v:.1f}' for v in values)} |" for name, values in times.items()]
    lines = [SECTION, "",
             f"Written by `python benchmarks/bench_read_ahead.py --size {args.size}` on {facts['date']}: {facts['cpu']}, "
             f"{os.cpu_count()} cores, torch {facts['torch']}. `check --weights` of bench_real_sizes.py's random {args.size} "
             f"checkpoint in bfloat16 ({sum(f.stat().st_size for f in directory.glob('*.safetensors')) / 2**30:.1f} GiB "
             "of safetensors shards), each case a fresh process, the page cache emptied before each cold case; "
             f"{args.rounds} interleaved rounds, median. Every run's loss equal: "
             f"{'yes' if len(losses) == 1 else 'NO: ' + str(sorted(losses))}.", "",
             "| case | median | × warm | each round (s) |", "|---|---|---|---|", *rows, "",
             f"One `posix_fadvise(WILLNEED)` over a whole {shard.stat().st_size / 2**20:.0f} MiB shard (length 0) "
             f"cached {whole / 2**20:.0f} MiB of it; the same advice in 8 MiB calls cached {chunked / 2**20:.0f} MiB "
             f"(kernel {os.uname().release}): hence sources/readahead.py's chunks, and a read-ahead the earlier "
             "single call never was.", ""]
    print("\n".join(lines))
    write_section(SECTION, lines)


if __name__ == "__main__":
    main()
