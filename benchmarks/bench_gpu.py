"""blocktrace on a GPU: the Watch inside a bf16 training loop and tracing one block, beside HF's sdpa layer.

    python benchmarks/bench_gpu.py            # on a CUDA machine: writes benchmarks/RESULTS_GPU.md
    python benchmarks/bench_gpu.py --small    # any machine: toy sizes on the CPU, printed, nothing written

Watch: GPT-2 small (12 layers, d 768), batch 8 × 1,024 tokens, AdamW, bf16 autocast, HF sdpa attention;
plain steps, steps between records and recording steps of one run with `Watch(every=10)`, against a run
without a Watch on the same data; every=50 and every=10 are computed from those medians. Tracing: one
GPT-2 block (small and XL), B 8 × T 1024, fp32 and bf16: blocktrace's own block untraced, `trace` bare
and with checks, HF's GPT2Block with sdpa; each case once per round, rounds interleaved, medians.
Host reads: what one trace and one recording step make the host wait for (the profiler's
`aten::_local_scalar_dense` and copies to the host), on this device. Without CUDA it says so and exits 0.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import DATA, interleaved, machine_facts  # noqa: E402

SMALL = "--small" in sys.argv
DEVICE = "cpu" if SMALL else "cuda"
ROUNDS = 3 if SMALL else 20
TARGETS = {"recording step": 1.5, "every=50": 1.01, "every=10": 1.05}
TRACE_TARGETS = {("bfloat16", "bare"): 2.0, ("bfloat16", "checks"): 2.5, ("float32", "bare"): 1.3,
                 ("float32", "checks"): 1.5}  # × HF's sdpa layer
SIZES = {"toy": (64, 4, 2, 64)} if SMALL else {"GPT-2 small": (768, 12, 8, 1024), "GPT-2 XL": (1600, 25, 8, 1024)}


def synchronise() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def host_reads(action) -> int:
    """How often `action` makes the host wait: on CUDA the stream synchronisations the profiler sees (every
    .item(), .cpu(), .tolist() of a device tensor makes one); on the CPU the scalar-read operators."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        action()
    names = {"cudaStreamSynchronize", "cudaDeviceSynchronize"} if DEVICE == "cuda" else \
        {"aten::_local_scalar_dense", "aten::equal", "aten::nonzero"}
    return sum(event.name in names for event in profile.events())


def gpt2_layer(d_model: int, heads: int, dtype: torch.dtype):
    """blocktrace's own block and HF's sdpa GPT2Block, on the same random weights."""
    from transformers import GPT2Config, GPT2Model

    from blocktrace.sources.checkpoint import Checkpoint
    from blocktrace.sources.families import checkpoint_config, model_info
    from blocktrace.sources.loader import load_block

    directory = DATA / f"gpu-gpt2-1x{d_model}"
    if not (directory / "model.safetensors").is_file():
        torch.manual_seed(0)
        GPT2Model(GPT2Config(n_embd=d_model, n_head=heads, n_layer=1, vocab_size=64)).save_pretrained(directory)
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    own = load_block(checkpoint, info, 0, checkpoint_config(checkpoint, info, {})).to(DEVICE, dtype).eval()
    hf = GPT2Model.from_pretrained(directory, attn_implementation="sdpa").to(DEVICE, dtype).eval().h[0]
    return own, hf


def tracing_rows() -> list[dict]:
    from blocktrace.tracing.tracer import trace

    rows = []
    for label, (d_model, heads, batch, tokens) in SIZES.items():
        for dtype in (torch.float32, torch.bfloat16):
            own, hf = gpt2_layer(d_model, heads, dtype)
            x = torch.randn(batch, tokens, d_model, device=DEVICE, dtype=dtype)
            with torch.no_grad():
                reference = own(x)
            traced = trace(own, x, keep_tensors=True).tensors()["residual2"]
            difference = float((traced.float() - reference.float()).abs().max())

            def untraced():
                with torch.no_grad():
                    own(x)

            def sdpa():
                with torch.no_grad():
                    hf(x)

            times = interleaved({"untraced": untraced, "bare": lambda: trace(own, x),
                                 "checks": lambda: trace(own, x, checks=True), "hf_sdpa": sdpa}, ROUNDS,
                                synchronise=synchronise)
            rows.append({"size": label, "dtype": str(dtype).replace("torch.", ""), "ms": times, "difference": difference,
                         "reads": {"bare": host_reads(lambda: trace(own, x)),
                                   "checks": host_reads(lambda: trace(own, x, checks=True))}})
            del own, hf, x
    return rows


def watch_row(every: int = 10) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from blocktrace import Watch

    layers, d_model, heads, batch, tokens = (2, 64, 4, 2, 64) if SMALL else (12, 768, 12, 8, 1024)
    steps = 4 * every + 1  # records at 0, every, … 4·every: the last one is profiled, not timed
    config = GPT2Config(n_embd=d_model, n_head=heads, n_layer=layers, vocab_size=256 if SMALL else 50257,
                        attn_implementation="sdpa")
    data = torch.randint(0, config.vocab_size, (steps, batch, tokens), device=DEVICE)
    found: dict = {}
    for watched in (False, True):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(config).to(DEVICE).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
        watch = Watch(model, DATA / "gpu-watch.jsonl", every=every, optimizer=optimizer, overwrite=True) \
            if watched else None
        plain, recording, reads = [], [], []
        for step in range(steps):
            synchronise()
            start = time.perf_counter()
            with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
                loss = model(data[step], labels=data[step]).loss
            loss.backward()
            records = watch is not None and watch.recording
            profiled = records and step == steps - 1
            if profiled:
                reads.append(host_reads(lambda: watch.step(loss)))
            elif watch is not None:
                watch.step(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            synchronise()
            if step >= 2 and not profiled:
                (recording if records else plain).append(time.perf_counter() - start)
        if watch is not None:
            watch.close()
        found["watch" if watched else "none"] = {"plain": statistics.median(plain),
                                                 "recording": statistics.median(recording) if recording else None,
                                                 "reads": reads}
    return found


def report(rows: list[dict], watch: dict) -> list[str]:
    base, watched = watch["none"]["plain"], watch["watch"]
    lines = ["| case | ms | × reference | target |", "|---|---|---|---|",
             f"| training step, no Watch (bf16 autocast, AdamW) | {base * 1e3:.1f} | 1.000 | |",
             f"| training step between records | {watched['plain'] * 1e3:.1f} | {watched['plain'] / base:.3f} | |",
             f"| a recording step | {watched['recording'] * 1e3:.1f} | {watched['recording'] / base:.2f} | "
             f"≤ {TARGETS['recording step']} |"]
    for every in (50, 10):
        overall = ((every - 1) * watched["plain"] + watched["recording"]) / (every * base)
        lines.append(f"| every={every} overall | | {overall:.4f} | ≤ {TARGETS[f'every={every}']} |")
    lines += ["", f"Host reads per recording step (profiler): {watched['reads']}", "",
              "## Tracing one block", "",
              "| block | dtype | untraced ms | HF sdpa ms | bare ms (× sdpa) | checks ms (× sdpa) | target × sdpa "
              "(bare / checks) | host reads (bare / checks) | max abs(traced − untraced) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ms, sdpa = row["ms"], row["ms"]["hf_sdpa"]
        lines.append(f"| {row['size']} | {row['dtype']} | {ms['untraced'] * 1e3:.2f} | {sdpa * 1e3:.2f} | "
                     f"{ms['bare'] * 1e3:.2f} ({ms['bare'] / sdpa:.2f}×) | {ms['checks'] * 1e3:.2f} "
                     f"({ms['checks'] / sdpa:.2f}×) | {TRACE_TARGETS[(row['dtype'], 'bare')]} / "
                     f"{TRACE_TARGETS[(row['dtype'], 'checks')]} | {row['reads']['bare']} / {row['reads']['checks']} | "
                     f"{row['difference']:.3g} |")
    return lines


def main() -> None:
    if not SMALL and not torch.cuda.is_available():
        print("bench_gpu: no CUDA device here, nothing measured (RESULTS_GPU.md left as it is); "
              "`--small` checks the script on the CPU")
        return
    facts = machine_facts()
    device = torch.cuda.get_device_name(0) if DEVICE == "cuda" else facts["cpu"]
    lines = ["# blocktrace on a GPU", "",
             f"Written by `python benchmarks/bench_gpu.py` on {facts['date']}: {device}, torch {torch.__version__}; "
             f"medians of {ROUNDS} interleaved rounds.", "",
             f"## The Watch in a training loop: {'a toy GPT-2, B 2 × T 64' if SMALL else 'GPT-2 small, B 8 × T 1024'}",
             "", *report(tracing_rows(), watch_row())]
    text = "\n".join(lines) + "\n"
    print(text)
    if not SMALL:
        (HERE / "RESULTS_GPU.md").write_text(text)


if __name__ == "__main__":
    main()
