"""`track` over long timelines: time per record at 10⁴, 10⁵ (and 10⁶ with --million) records, each a fresh process.

    python benchmarks/bench_track_records.py [--million]

Small records (a loss, a learning rate, no layers: what a Watch at every=10 over 10⁶ steps writes 10⁵ of, less its
per-layer numbers) and full-size ones (two layers, as sample_weights/learner/watch.jsonl holds). Linear time shows
as a flat time per record; the peak memory of each run is printed beside it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, in_subprocess  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACK = """
import time
from click.testing import CliRunner
from blocktrace.cli import cli
start = time.perf_counter()
result = CliRunner().invoke(cli, ["track", {path!r}, "--brief"])
RESULT = {{'seconds': time.perf_counter() - start, 'exit': result.exit_code}}
"""


def _timeline(path: Path, count: int, full: bool) -> Path:
    from blocktrace.training.timeline import dumps, record

    if path.is_file():
        return path
    samples = [json.loads(line) for line in (ROOT / "sample_weights/learner/watch.jsonl").read_text().splitlines()]
    with open(path, "w", encoding="utf-8") as handle:
        for index in range(count):
            if full:
                entry = {**samples[1 + index % (len(samples) - 1)], "step": 10 * index}
            else:
                entry = record(10 * index, "watch", [], [], [], loss=3.0 + (index % 7) / 10, lr=1e-3)
            handle.write(dumps(entry) + "\n")
    return path


def main() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    counts = [(10_000, False), (100_000, False), (2_000, True), (10_000, True)]
    if "--million" in sys.argv:
        counts.insert(2, (1_000_000, False))
    print("| records | kind | seconds | µs per record | peak MiB |", "|---|---|---|---|---|", sep="\n")
    for count, full in counts:
        path = _timeline(DATA / f"timeline-{count}-{'full' if full else 'small'}.jsonl", count, full)
        found = in_subprocess(TRACK.format(path=str(path)))
        print(f"| {count} | {'full' if full else 'small'} | {found['seconds']:.1f} | "
              f"{1e6 * found['seconds'] / count:.0f} | {found['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
