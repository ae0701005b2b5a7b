"""Tracing cost at GPT-2 sizes, beside HuggingFace and TransformerLens; memory; start-up; loading.

    python benchmarks/bench.py            # writes benchmarks/RESULTS.md

Timing: in one process, on the same weights and the same input, each case runs once per
round, rounds interleaved (so machine noise hits every case alike); the median of ROUNDS
rounds after WARMUP. Memory: each case in a fresh process, peak RSS above the RSS just
before the case (sampled every millisecond). Nothing in RESULTS.md is typed by hand.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import DATA, OWN_SECTIONS, RESULTS, interleaved, kept_section, machine_facts  # noqa: E402

ROUNDS, WARMUP = 15, 2
SIZES = {"GPT-2 small": (768, 12), "GPT-2 XL": (1600, 25)}
TOKENS = 1024
MEMORY_TOKENS = 4096  # the long-input memory check, GPT-2 small block


def gpt2_block_dir(d_model: int, n_head: int) -> Path:
    """A one-layer GPT-2 model saved by transformers, every parameter random (vocab kept tiny)."""
    import torch
    from transformers import GPT2Config, GPT2Model

    directory = DATA / f"hf-gpt2-1x{d_model}"
    if (directory / "model.safetensors").is_file():
        return directory
    config = GPT2Config(n_embd=d_model, n_head=n_head, n_layer=1, n_positions=MEMORY_TOKENS, vocab_size=64)
    model = GPT2Model(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.02 + (parameter.dim() == 1) * 0.01)
    model.save_pretrained(directory)
    return directory


# The cases, as code run in the timing process and in each memory process.
SETUP = """
import torch, json
from pathlib import Path
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import load_block
from blocktrace.tracing.tracer import trace
torch.manual_seed(0)
directory = Path({directory!r})
checkpoint = Checkpoint(directory)
info = model_info(checkpoint)
block = load_block(checkpoint, info, 0, checkpoint_config(checkpoint, info, {{}}))
x = torch.randn(1, {tokens}, {d_model})
causal = torch.full(({tokens}, {tokens}), torch.finfo(torch.float32).min).triu(1)[None, None]

def untraced():
    with torch.no_grad():
        return block(x)

def untraced_one_chunk():
    # the attention in one [H, T, T] chunk, as a GPU computes it (and a CPU did before its 8 MiB chunks)
    block.attn.query_chunk = {tokens}
    try:
        with torch.no_grad():
            return block(x)
    finally:
        block.attn.query_chunk = None

def traced():
    return trace(block, x)

def traced_checks():
    return trace(block, x, checks=True)

def make_hf():
    from transformers import GPT2Model
    hf = GPT2Model.from_pretrained(directory, attn_implementation="eager").eval()
    return hf.h[0]

def make_tl():
    # TransformerLens 4: a TransformerBridge around the same one-layer GPT-2, booted offline.
    import os
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast
    hf = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").eval()
    tokenizer = PreTrainedTokenizerFast(tokenizer_file={tokenizer!r}, unk_token="[UNK]")
    return TransformerBridge.boot_transformers(str(directory), hf_model=hf, tokenizer=tokenizer, device="cpu").eval()
"""

CASES = {
    "untraced forward (blocktrace block)": "untraced",
    "untraced forward, the attention in one chunk (the CPU's default before 8 MiB chunks)": "untraced_one_chunk",
    "traced: 6 steps, all statistics, attention diagnostics": "traced",
    "traced + health checks (run's default, `check`)": "traced_checks",
    "HuggingFace GPT2Block, eager attention": "hf",
    "TransformerLens 4 TransformerBridge, 1-layer forward": "tl_forward",
    "TransformerLens 4 TransformerBridge, run_with_cache": "tl_cache",
}

CALLS = """
hf_block = tl_model = None
def hf():
    with torch.no_grad():
        return hf_block(x, attention_mask=causal)
tokens_in = torch.zeros(1, {tokens}, dtype=torch.long)
def tl_forward():
    with torch.no_grad():
        return tl_model(tokens_in, return_type=None)
def tl_cache():
    with torch.no_grad():
        return tl_model.run_with_cache(tokens_in, return_type=None)
def available(name):
    global hf_block, tl_model
    try:
        if name == "hf" and hf_block is None:
            hf_block = make_hf()
        if name.startswith("tl") and tl_model is None:
            tl_model = make_tl()
        return True
    except ImportError:
        return False
"""


TOKENIZER = HERE.parent / "sample_weights" / "gpt2-tiny" / "tokenizer.json"  # any tokenizer: ids are given


def _setup(directory: Path, d_model: int, n_head: int, tokens: int) -> str:
    return SETUP.format(directory=str(directory), tokens=tokens, d_model=d_model, n_head=n_head,
                        tokenizer=str(TOKENIZER))


def _namespace(directory: Path, d_model: int, n_head: int, tokens: int) -> dict:
    namespace: dict = {}
    exec(_setup(directory, d_model, n_head, tokens), namespace)
    exec(CALLS.format(tokens=tokens), namespace)
    return namespace


def time_cases(directory: Path, d_model: int, n_head: int) -> dict[str, float]:
    namespace = _namespace(directory, d_model, n_head, TOKENS)
    cases = {label: namespace[name] for label, name in CASES.items() if namespace["available"](name)}
    return interleaved(cases, ROUNDS, WARMUP)


MEMORY_PROBE = """
import threading, time, os
PAGE = os.sysconf("SC_PAGE_SIZE")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE
if available({name!r}):
    {name}()  # warm: lazy initialisation is not the case's memory
    peak = [0]; done = [False]
    def sample():
        while not done[0]:
            peak[0] = max(peak[0], rss()); time.sleep(0.001)
    before = rss()
    thread = threading.Thread(target=sample); thread.start()
    result = {name}(); del result
    done[0] = True; thread.join()
    print(json.dumps({{"extra_mib": (max(peak[0], rss()) - before) / 2**20}}))
else:
    print(json.dumps({{"extra_mib": None}}))
"""


def peak_memory(directory: Path, d_model: int, n_head: int, tokens: int, name: str) -> float:
    code = _setup(directory, d_model, n_head, tokens) + CALLS.format(tokens=tokens) + MEMORY_PROBE.format(name=name)
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(output.stdout.strip().splitlines()[-1])["extra_mib"]


def startup_seconds(command: list[str], repeats: int = 5) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def timing_section() -> tuple[list[str], dict]:
    lines, verdicts = [], {}
    for size, (d_model, n_head) in SIZES.items():
        directory = gpt2_block_dir(d_model, n_head)
        medians = time_cases(directory, d_model, n_head)
        base = medians["untraced forward (blocktrace block)"]
        memory = {label: peak_memory(directory, d_model, n_head, TOKENS, CASES[label]) for label in medians}
        base_memory = memory["untraced forward (blocktrace block)"]
        lines += [f"### {size}: d_model {d_model}, {n_head} heads, T {TOKENS}, batch 1, float32", "",
                  "| case | median ms | × untraced | peak MiB above start | × untraced |", "|---|---|---|---|---|"]
        for label, seconds in medians.items():
            lines.append(f"| {label} | {seconds * 1000:.1f} | {seconds / base:.3f} | {memory[label]:.1f} | "
                         f"{memory[label] / base_memory:.2f} |")
        for label, target in TARGETS.items():
            verdicts[f"{size}: {label}"] = (medians[label] / base, target)
        traced = medians["traced: 6 steps, all statistics, attention diagnostics"]
        tl = medians.get("TransformerLens 4 TransformerBridge, run_with_cache")
        if tl is not None:
            verdicts[f"{size}: traced / TransformerLens run_with_cache"] = (traced / tl, None)
        lines.append("")
    return lines, verdicts


def memory_section() -> tuple[list[str], float]:
    d_model, n_head = SIZES["GPT-2 small"]
    directory = gpt2_block_dir(d_model, n_head)
    untraced = peak_memory(directory, d_model, n_head, MEMORY_TOKENS, "untraced")
    traced = peak_memory(directory, d_model, n_head, MEMORY_TOKENS, "traced")
    ratio = traced / untraced
    lines = [f"### Memory at T {MEMORY_TOKENS} (GPT-2 small block, batch 1, float32, default attention chunking)", "",
             "| case | peak MiB above start |", "|---|---|",
             f"| untraced forward | {untraced:.1f} |", f"| traced | {traced:.1f} |", "",
             f"Traced / untraced peak memory: {ratio:.3f} (target ≤ 1.5: {'met' if ratio <= 1.5 else 'MISSED'}).", ""]
    return lines, ratio


def startup_section() -> list[str]:
    help_seconds = startup_seconds([sys.executable, "-m", "blocktrace", "--help"])
    version_seconds = startup_seconds([sys.executable, "-m", "blocktrace", "--version"])
    torch_seconds = startup_seconds([sys.executable, "-c", "import torch"])
    return ["### Start-up (median of 5 fresh processes)", "",
            "| command | seconds |", "|---|---|",
            f"| `python -m blocktrace --help` | {help_seconds:.3f} |",
            f"| `python -m blocktrace --version` | {version_seconds:.3f} |",
            f"| `python -c 'import torch'` | {torch_seconds:.3f} |", ""]


WHOLE_MODEL_TOKENS, WHOLE_MODEL_ROUNDS = 1024, 5


def whole_model_dir() -> Path:
    """A 12-layer GPT-2-small-shaped GPT2LMHeadModel saved by transformers, every parameter random."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    directory = DATA / "hf-gpt2-12x768"
    if not (directory / "model.safetensors").is_file():
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(directory)
    return directory


def whole_model_section() -> tuple[list[str], float]:
    """`check --weights` on a whole 12-layer model (every layer traced and checked, the model's loss)
    against HF's own full-model forward with labels, on the same 1,024 tokens."""
    import torch
    from transformers import GPT2LMHeadModel

    from blocktrace.pipeline import check_model_request
    from blocktrace.request import Analysis, InputSpec, RunRequest

    directory = whole_model_dir()
    hf = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="eager").eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, WHOLE_MODEL_TOKENS), generator=torch.Generator().manual_seed(0))

    def hf_forward():
        with torch.no_grad():
            return hf(ids, labels=ids).loss.item()

    request = RunRequest(config_fields={}, inputs=InputSpec(token_ids=" ".join(map(str, ids[0].tolist()))),
                         weights=directory)

    def check():
        return check_model_request(request, Analysis(checks=True)).report["loss"]

    cases = {"HuggingFace GPT2LMHeadModel forward with labels (eager attention)": hf_forward,
             "blocktrace check --weights: 12 layers traced and checked, the model's loss": check}
    losses = {label: run() for label, run in cases.items()}  # the first call of each warms it up
    medians = interleaved(cases, WHOLE_MODEL_ROUNDS, warmup=0)
    base = medians[next(iter(cases))]
    ratio = list(medians.values())[1] / base
    lines = [f"### A whole GPT-2-small-shaped model: 12 layers, T {WHOLE_MODEL_TOKENS}, float32", "",
             "| case | median s | × HF forward | loss |", "|---|---|---|---|"]
    lines += [f"| {label} | {seconds:.3f} | {seconds / base:.3f} | {losses[label]:.6f} |"
              for label, seconds in medians.items()]
    lines += ["", f"Whole-model check / HF forward: {ratio:.3f} (target ≤ 1.5: {'met' if ratio <= 1.5 else 'MISSED'}); "
              f"median of {WHOLE_MODEL_ROUNDS} interleaved rounds; the weights are read from the page cache.", ""]
    return lines, ratio


TARGETS = {"traced: 6 steps, all statistics, attention diagnostics": 1.05,
           "traced + health checks (run's default, `check`)": 1.10}


def main() -> None:
    import torch
    from bench_load import load_section
    from bench_training import training_section

    facts = machine_facts()
    try:
        from importlib.metadata import version

        import transformer_lens  # noqa: F401

        tl_version = version("transformer-lens")
    except ImportError:
        tl_version = "not installed"
    import transformers

    timing, verdicts = timing_section()
    memory, memory_ratio = memory_section()
    whole_model, _ = whole_model_section()
    lines = [
        "# blocktrace benchmarks",
        "",
        f"Written by `python benchmarks/bench.py` on {facts['date']}: {facts['cpu']}, {facts['threads']} torch "
        f"threads, Python {facts['python']}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"TransformerLens {tl_version}. Random weights in the GPT-2 layout (one layer, saved by transformers); "
        f"the same weights and input for every case. Times: median of {ROUNDS} interleaved rounds after "
        f"{WARMUP} warm-up rounds, in one process. Memory: each case in a fresh process, peak RSS above the "
        "RSS just before the call. TransformerLens 4 (when installed) runs a TransformerBridge around the same "
        "one-layer GPT-2 with a 64-token vocabulary, booted offline; its embedding and unembedding are in its "
        "times. Install it beside blocktrace to include it: `pip install transformer-lens`.",
        "",
        "## Tracing overhead (targets: traced / untraced ≤ 1.05; with the health checks ≤ 1.10)",
        "",
        *timing,
        *[f"- {name}: {ratio:.3f}" + ("" if target is None else f" × untraced (target ≤ {target}: "
                                       f"{'met' if ratio <= target else 'MISSED'})")
          for name, (ratio, target) in verdicts.items()],
        "",
        *whole_model,
        *memory,
        *startup_section(),
        *load_section(),
        *training_section(),
    ]
    text = "\n".join(lines) + "\n"
    old = RESULTS.read_text() if RESULTS.is_file() else ""
    for heading in OWN_SECTIONS:  # written by their own scripts (bench_real_sizes.py, bench_trace_cost.py, …)
        section = kept_section(old, heading)
        text += ("\n" + section.rstrip("\n") + "\n") if section else ""
    print(text)
    RESULTS.write_text(text)


if __name__ == "__main__":
    main()
