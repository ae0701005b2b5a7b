"""Print the 0.5-nat rule figures from each run's log.jsonl (final held-out loss, gap to the twin).

    python calib.py [--work DIR]

Run it on a `train.py --no-watch` output for the calibration proper; on a watched run it gives the same
figures only if the Watch does not change the training.
"""
import argparse
import json
import math
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runs import RUNS  # noqa: E402


def final(work, name):
    p = Path(work) / name / "log.jsonl"
    if not p.exists():
        return None
    rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
    return rows[-1] if rows else None


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind16"))
    a = ap.parse_args(argv)
    for n, s in RUNS.items():
        r = final(a.work, n)
        if r is None:
            print(f"{n:40s} no log")
            continue
        v = r.get("val_loss")
        line = f"{n:40s} step {r['step']:4d} val {v:.3f} train {r.get('loss', float('nan')):.3f}"
        if s["twin"]:
            t = final(a.work, s["twin"])
            if t is not None:
                gap = v - t["val_loss"]
                ok = (not math.isfinite(v)) or gap >= 0.5
                line += f"  twin {t['val_loss']:.3f}  gap {gap:+.3f}  {'PASS' if ok else 'FAIL'}"
        print(line)


if __name__ == "__main__":
    main()
