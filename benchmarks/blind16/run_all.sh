#!/usr/bin/env bash
# Train every run of the sixteenth blind benchmark, track each Watch timeline, write the report.
#   bash run_all.sh VENV [train.py options, e.g. --steps 12 --only H1 F03]
# Output: $BLIND_WORK (default /work/bench-out/blind16)/<run>/{watch,log}.jsonl, track.json, REPORT.md
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: bash run_all.sh VENV [train.py options]" >&2
    exit 2
fi
VENV=$1
shift
HERE=$(cd "$(dirname "$0")" && pwd)
export BLIND_WORK=${BLIND_WORK:-/work/bench-out/blind16}
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
mkdir -p "$BLIND_WORK"
# the Watch's own warnings go to train.stderr, the progress to the terminal
"$VENV/bin/python" "$HERE/train.py" "$@" 2> "$BLIND_WORK/train.stderr"
"$VENV/bin/python" "$HERE/evaluate.py" --blocktrace "$VENV/bin/blocktrace"
"$VENV/bin/python" "$HERE/report.py" > /dev/null
echo "report: $BLIND_WORK/REPORT.md"
