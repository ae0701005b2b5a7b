"""Run `blocktrace track <run>/watch.jsonl --json` on every trained run; store <run>/track.json.

    python evaluate.py [--work DIR] [--blocktrace PATH] [--only NAME ...]

The exit status of `blocktrace track` (0 clean, 1 findings at error level, 2 an error) is stored
beside the document in <run>/track.rc; a run whose track fails (2, or no JSON) gets track.err.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runs import RUNS  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind16"))
    ap.add_argument("--blocktrace", default=str(Path(sys.executable).parent / "blocktrace"),
                    help="the blocktrace command [the one beside this Python]")
    ap.add_argument("--only", nargs="+", metavar="NAME")
    a = ap.parse_args(argv)
    work = Path(a.work)
    names = [n for n in RUNS if not a.only or any(n == q or n.startswith(q) for q in a.only)]
    for n in names:
        folder = work / n
        tl = folder / "watch.jsonl"
        if not tl.exists():
            print(f"[{n}] no watch.jsonl, skipped")
            continue
        p = subprocess.run([a.blocktrace, "track", str(tl), "--json", "--quiet"],
                           capture_output=True, text=True)
        (folder / "track.rc").write_text(str(p.returncode))
        try:
            doc = json.loads(p.stdout)
        except json.JSONDecodeError:
            doc = None
        if doc is None or p.returncode == 2:
            (folder / "track.err").write_text(p.stderr + "\n--- stdout ---\n" + p.stdout[:4000])
            print(f"[{n}] blocktrace track failed (rc {p.returncode}); see {folder / 'track.err'}")
            if doc is None:
                continue
        (folder / "track.json").write_text(json.dumps(doc, indent=1))
        fs = doc.get("first_sign")
        print(f"[{n}] rc {p.returncode}, {len(doc.get('records', []))} records, first sign: "
              f"{'none' if not fs else str(fs.get('step')) + ' ' + str(fs.get('name'))}")


if __name__ == "__main__":
    main()
