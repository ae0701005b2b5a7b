"""Tracing cost of two source trees on this machine, at the same hour: one block's traced / untraced ratio.

    python benchmarks/ab_trace.py TREE [ROUNDS] [--xl] [--placement pre|post|deepnorm|sandwich|reordered]

TREE is a checkout of blocktrace (e.g. `git worktree add /tmp/old <commit>`, then `/tmp/old`, and `.` for this
one); run it once per tree, alternating, and compare the ratios printed. RESULTS.md's figures are from one run on
one day; a shared machine's speed moves between days, so a before/after claim needs both trees measured side by
side. GPT-2 small (or XL with --xl), T 1024, batch 1, float32: blocktrace's own block untraced, `trace` bare and
with checks, each once per round, rounds interleaved, medians. The untraced milliseconds compare the block's own
forward between trees (run alternately); --placement picks its wiring (default pre).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import interleaved  # noqa: E402


def main() -> None:
    tree = Path(sys.argv[1]).resolve()
    rounds = int(next((a for a in sys.argv[2:] if a.isdigit()), 16))
    d_model, heads = (1600, 25) if "--xl" in sys.argv else (768, 12)
    placement = sys.argv[sys.argv.index("--placement") + 1] if "--placement" in sys.argv else "pre"
    sys.path.insert(0, str(tree))
    import torch

    from blocktrace.config import BlockConfig
    from blocktrace.model.block import TransformerBlock
    from blocktrace.tracing.tracer import trace

    torch.manual_seed(0)
    block = TransformerBlock(BlockConfig(d_model=d_model, n_heads=heads, placement=placement)).eval()
    x = torch.randn(1, 1024, d_model)

    def untraced():
        with torch.no_grad():
            block(x)

    cases = {"untraced": untraced, "bare": lambda: trace(block, x), "checks": lambda: trace(block, x, checks=True)}
    medians = interleaved(cases, rounds)
    print(f"{tree}: bare {medians['bare'] / medians['untraced']:.3f}, checks {medians['checks'] / medians['untraced']:.3f} "
          f"× untraced ({medians['untraced'] * 1e3:.1f} ms untraced, {placement}, {rounds} rounds)")


if __name__ == "__main__":
    main()
