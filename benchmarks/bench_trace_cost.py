"""Where the block trace's time goes, pass by pass, at GPT-2 small and XL (T 1024, CPU, float32).

    python benchmarks/bench_trace_cost.py      # writes its section of benchmarks/RESULTS.md

The trace's cost beyond the untraced forward is its statistics. Each piece is timed alone on the
very tensors the block computes (its attention weights and masked scores, its six step outputs),
in the same process and interleaved with the untraced and traced forwards, and reported as a
share of the untraced forward: what each exact statistic costs, and how far the targets
(traced ≤ 1.05×, with the health checks ≤ 1.10×) are from what those passes alone take.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import interleaved, machine_facts, write_section  # noqa: E402

SECTION = "## Where the trace's time goes (GPT-2 small and XL, T 1024, CPU)"
SIZES = {"GPT-2 small": (768, 12), "GPT-2 XL": (1600, 25)}
TOKENS, ROUNDS, WARMUP = 1024, 15, 2


def without_diagnostics(block, x):
    """The trace with attention_chunk_stats swapped for zeros of its shapes: what the diagnostics cost inside the
    forward, where each chunk is fresh in cache (timed alone on the whole matrix, a pass costs more or less)."""
    import torch

    from blocktrace.tracing import recorder, tracer

    def zeros(weights, scores, rows, query_mask=None):
        heads, scalar = torch.zeros(weights.shape[-3]), torch.zeros(())
        return {**dict.fromkeys(("entropy_sum", "first_sum", "self_sum", "previous_sum"), heads),
                **dict.fromkeys(("future_weight_sum", "max_weight", "max_logit", "rows", "previous_rows"), scalar)}

    real, recorder.attention_chunk_stats = recorder.attention_chunk_stats, zeros
    try:
        return tracer.trace(block, x)
    finally:
        recorder.attention_chunk_stats = real


def pieces(d_model: int, heads: int) -> tuple[dict, dict]:
    """The cases to time for one size, and the attention matrix's size in MiB."""
    import torch

    from blocktrace.config import BlockConfig
    from blocktrace.model.block import build_block
    from blocktrace.tracing import stats
    from blocktrace.tracing.tracer import trace

    block = build_block(BlockConfig(d_model=d_model, n_heads=heads), seed=0)
    x = torch.randn(1, TOKENS, d_model, generator=torch.Generator().manual_seed(1))
    seen: dict = {}
    hooks = [block.attn.scores.register_forward_hook(lambda m, a, out: seen.__setitem__("s", out.detach())),
             block.attn.weights.register_forward_hook(lambda m, a, out: seen.__setitem__("w", out.detach())),
             *[getattr(block, name).register_forward_hook(
                 lambda m, a, out, name=name: seen.__setitem__(name, out.detach()))
               for name in ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")]]
    block.attn.query_chunk = TOKENS  # one chunk, so that the hooks see the whole [H, T, T] matrices
    with torch.no_grad():
        block(x)
    block.attn.query_chunk = None  # every timed forward chunks as the CPU's default does
    for hook in hooks:
        hook.remove()
    w, s = seen["w"].reshape(1, heads, TOKENS, TOKENS), seen["s"].reshape(1, heads, TOKENS, TOKENS)
    rows = slice(0, TOKENS)
    mask = torch.ones(TOKENS, TOKENS).triu_(1)
    outputs = [seen[name] for name in ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")]

    def forward():
        with torch.no_grad():
            block(x)

    cases = {
        "untraced forward": forward,
        "traced (6 steps, statistics, attention diagnostics)": lambda: trace(block, x),
        "traced, the attention diagnostics left out (their hooks still called)": lambda: without_diagnostics(block, x),
        "traced + health checks": lambda: trace(block, x, checks=True),
        "attention diagnostics alone (attention_chunk_stats)": lambda: stats.attention_chunk_stats(w, s, rows),
        "· row maxima of the scores (s.amax)": lambda: s.amax(dim=-1),
        "· row maxima of the weights (w.amax, the log-normaliser's fallback)": lambda: w.amax(dim=-1),
        "· Σ_j p·s per row (the entropy's dot product)": lambda: torch.einsum("nhij,nhij->nhi", w, s),
        "· weight above the diagonal (the causal check: only the keys after each query)":
            lambda: stats.future_rows(w, 0),
        "· first, own and previous key (diagonals)": lambda: stats._positional_sums(w, rows, None),
        "(alternative, not used) the entropy as −Σ p log p": lambda: torch.special.entr(w).sum(dim=(0, 2, 3)),
        "(alternative, the causal check before) a product with a [T, T] mask, reading every weight":
            lambda: w.reshape(-1, mask.numel()) @ mask.reshape(-1),
        "step statistics alone (6 × tensor_moments)": lambda: [stats.tensor_moments(t) for t in outputs],
    }
    return cases, {"matrix MiB": w.numel() * w.element_size() / 2**20}


def size_rows(name: str, d_model: int, heads: int) -> list[str]:
    cases, facts = pieces(d_model, heads)
    times = interleaved(cases, ROUNDS, WARMUP)
    base = times["untraced forward"]
    rows = [f"### {name}: d_model {d_model}, {heads} heads; the attention matrix {facts['matrix MiB']:.0f} MiB", "",
            "| case | median ms | × untraced forward |", "|---|---|---|"]
    rows += [f"| {case} | {seconds * 1e3:.1f} | {seconds / base:.3f} |" for case, seconds in times.items()]
    overhead = times["traced (6 steps, statistics, attention diagnostics)"] / base - 1
    attention = times["attention diagnostics alone (attention_chunk_stats)"] / base
    inside = (times["traced (6 steps, statistics, attention diagnostics)"]
              - times["traced, the attention diagnostics left out (their hooks still called)"]) / base
    steps = times["step statistics alone (6 × tensor_moments)"] / base
    rows += ["", f"The trace costs {overhead:.1%} of the forward; the attention diagnostics {inside:.1%} of it inside the "
             f"trace (the trace less the trace without them), {attention:.1%} timed alone on the whole matrix, and the "
             f"step statistics {steps:.1%}. The 1.05× target leaves 5%: the attention diagnostics inside the trace "
             f"{'fit' if inside <= 0.05 else 'do not fit'} in it.", ""]
    passes = [case for case in times if case.startswith("·")]
    rows[-1:-1] = [f"The five passes the diagnostics make take {sum(times[c] for c in passes) / base:.1%} together; "
                   "the two alternatives beside them are what the trace would pay instead for the entropy and for "
                   "the causal check."]
    return rows


def main() -> None:
    import torch

    torch.set_num_threads(2)
    facts = machine_facts()
    lines = [SECTION, "",
             f"Written by `python benchmarks/bench_trace_cost.py` on {facts['date']}: {facts['cpu']}, "
             f"{facts['threads']} torch threads, torch {facts['torch']}. A blocktrace GPT-2-shaped block with random "
             f"weights, batch 1, T {TOKENS}, float32; median of {ROUNDS} interleaved rounds after {WARMUP} warm-up "
             "rounds, one process. Each statistic is timed alone on the tensors the block computed. Every attention "
             "statistic is exact and reads the whole [H, T, T] weights or scores once per pass (the entropy is "
             "H = lse − Σ p·s, a dot product where −Σ p log p would take a logarithm of every weight; the "
             "log-normaliser reads the diagonal, with the row maxima of the weights as the fallback for rows whose "
             "diagonal weight is tiny): on a CPU those passes are bound by memory bandwidth, not arithmetic.", ""]
    for name, (d_model, heads) in SIZES.items():
        lines += size_rows(name, d_model, heads)
    print("\n".join(lines))
    write_section(SECTION, lines)


if __name__ == "__main__":
    main()
