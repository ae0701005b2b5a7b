"""Real sizes: `blocktrace check` of a 3B and an 8B Llama-3-shaped checkpoint beside HF's own forward (and backward).

    python benchmarks/bench_real_sizes.py                 # 3b and 8b; writes the "Real sizes" section of RESULTS.md
    python benchmarks/bench_real_sizes.py --sizes 1b      # a quick look (not written to RESULTS.md)
    python benchmarks/bench_real_sizes.py --grad-where-hf-fits   # 1b, --grad beside HF's forward + backward: the
                                                          # largest size whose HF backward fits here (its own section)

The checkpoints are written here, once, with random weights (std 0.02, norm gains 1) as sharded bfloat16
safetensors with the real config.json shapes (llama3 RoPE scaling, GQA 8, vocabulary 128,256), under
benchmarks/_data/real/ (git-ignored; 6.4 GB and 16 GB). Nothing is downloaded. The input is 2 × 128 token ids
(--token-ids-file). Each case runs in a fresh process (a forward case twice on each side, alternated, the faster
kept; a gradient case once), under the same load, and is sampled every 50 ms for its anonymous memory (RssAnon: what the process allocated) and its file-backed memory (RssFile:
safetensors' mapped pages, which the kernel may drop); time is the process's wall time, start-up included (both
sides pay `import torch`). HF: `from_pretrained(dtype=…)` then one forward with labels (and `.backward()` for the
gradient rows); a case that would not fit in this machine's memory is not started and says so. The bfloat16
gradient rows run only where bfloat16 is native (the header's bracket, from common.bf16_capability).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from common import DATA, OWN_SECTIONS, bf16_native, machine_facts, write_section

HERE = Path(__file__).resolve().parent
SECTION, GRAD_SECTION = OWN_SECTIONS[0], OWN_SECTIONS[2]
SHAPES = {  # Llama-3.2-1B / 3B and Llama-3.1-8B's config.json, as on the hub
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, intermediate_size=8192,
               tie_word_embeddings=True, factor=32.0),
    "3b": dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24, intermediate_size=8192,
               tie_word_embeddings=True, factor=32.0),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=14336,
               tie_word_embeddings=False, factor=8.0),
}
VOCAB, KV_HEADS, BATCH, TOKENS = 128_256, 8, 2, 128
LAYERS_PER_SHARD = 4
BYTES = {"float32": 4, "bfloat16": 2}
LOSS_TOLERANCE = 1e-3  # relative: "equal" losses (bfloat16 sums in another order differ in the 4th digit)


def config_json(size: str) -> dict:
    shape = dict(SHAPES[size])
    factor = shape.pop("factor")
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": VOCAB,
            "num_key_value_heads": KV_HEADS, "head_dim": shape["hidden_size"] // shape["num_attention_heads"],
            "hidden_act": "silu", "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192},
            "attention_bias": False, "mlp_bias": False, "torch_dtype": "bfloat16", "bos_token_id": 128000,
            "eos_token_id": 128001, **shape}


def layer_shapes(config: dict) -> dict[str, tuple]:
    d, f, hd = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, KV_HEADS * hd
    return {"input_layernorm.weight": (d,), "self_attn.q_proj.weight": (q, d), "self_attn.k_proj.weight": (kv, d),
            "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, q),
            "post_attention_layernorm.weight": (d,), "mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d),
            "mlp.down_proj.weight": (d, f)}


def _random(shape: tuple, generator):
    import torch

    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)


def checkpoint(size: str) -> Path:
    """The size's checkpoint, written once: a shard per LAYERS_PER_SHARD layers, the embedding and head apart."""
    import torch
    from safetensors.torch import save_file

    directory = DATA / "real" / size
    if (directory / "model.safetensors.index.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    config = config_json(size)
    generator, weight_map, shards = torch.Generator().manual_seed(0), {}, []
    layers = config["num_hidden_layers"]
    groups = [range(k, min(k + LAYERS_PER_SHARD, layers)) for k in range(0, layers, LAYERS_PER_SHARD)]
    shards.append({"model.embed_tokens.weight": (VOCAB, config["hidden_size"]), "model.norm.weight": (config["hidden_size"],),
                   **({} if config["tie_word_embeddings"] else {"lm_head.weight": (VOCAB, config["hidden_size"])})})
    shards += [{f"model.layers.{k}.{name}": shape for k in group for name, shape in layer_shapes(config).items()}
               for group in groups]
    for index, shapes in enumerate(shards):
        name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({key: _random(shape, generator) for key, shape in shapes.items()}, str(directory / name),
                  metadata={"format": "pt"})
        weight_map.update({key: name for key in shapes})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    return directory


def token_ids() -> Path:
    import torch

    path = DATA / "real" / "ids.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    ids = torch.randint(0, VOCAB, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1)).tolist()
    path.write_text(json.dumps(ids))
    return path


def _memory(pid: int) -> tuple[int, int]:
    """(RssAnon, RssFile) of a process in bytes; zeros once it is gone."""
    try:
        fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if line.startswith(("RssAnon", "RssFile")))
    except (OSError, ValueError):
        return 0, 0
    return tuple(int(fields.get(key, "0 kB").split()[0]) * 1024 for key in ("RssAnon", "RssFile"))


def measured(command: list[str]) -> dict:
    """Run `command`; its wall time, peak anonymous and file-backed memory, and its last line of output."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks, done = [0, 0], threading.Event()

    def sample():
        while not done.is_set():
            anon, mapped = _memory(process.pid)
            peaks[0], peaks[1] = max(peaks[0], anon), max(peaks[1], mapped)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = process.communicate()
    seconds = time.perf_counter() - start
    done.set()
    sampler.join()
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(command)} failed ({process.returncode}): {err.strip()[-2000:]}")
    return {"seconds": seconds, "anon": peaks[0], "file": peaks[1], "output": out, "error": err.strip()[-1000:]}


HF_SCRIPT = """
import json, sys, torch, transformers
directory, dtype, backward = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3] == "1"
ids = torch.tensor(json.load(open(sys.argv[4])))
model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation="sdpa")
if not backward:
    model.eval(); torch.set_grad_enabled(False)
loss = model(ids, labels=ids).loss
if backward:
    loss.backward()
print(json.dumps({"loss": loss.item()}))
"""


def startup_seconds(command: list[str]) -> float:
    """The seconds `command` (a Python process) spends importing modules: the sum of `-X importtime`'s top-level
    cumulative times, from one run of its own (the flag's bookkeeping would slow the timed runs)."""
    result = subprocess.run([command[0], "-X", "importtime", *command[1:]], capture_output=True, text=True)
    total = 0
    for line in result.stderr.splitlines():
        fields = line.split("|")
        # a top-level import is named after one space; the modules it pulls in are indented further
        if line.startswith("import time:") and len(fields) == 3 and fields[2][1:2] != " " and fields[1].strip().isdigit():
            total += int(fields[1])
    return total / 1e6


def blocktrace_command(directory: Path, ids: Path, dtype: str, grad: bool) -> list[str]:
    return [sys.executable, "-m", "blocktrace", "check", "--weights", str(directory), "--token-ids-file", str(ids),
            "--dtype", dtype, "--json", *(["--grad"] if grad else [])]


def hf_command(directory: Path, ids: Path, dtype: str, grad: bool) -> list[str]:
    return [sys.executable, "-c", HF_SCRIPT, str(directory), dtype, "1" if grad else "0", str(ids)]


def blocktrace_case(directory: Path, ids: Path, dtype: str, grad: bool) -> dict:
    command = blocktrace_command(directory, ids, dtype, grad)
    result = measured(command)
    try:
        result["loss"] = json.loads(result["output"])["loss"]
    except ValueError:
        raise RuntimeError(f"{' '.join(command)} printed no JSON: {result['output'][:300]!r} / {result['error']}")
    return result


def parameters(size: str) -> int:
    config = config_json(size)
    layer = sum(_count(shape) for shape in layer_shapes(config).values())
    head = 0 if config["tie_word_embeddings"] else VOCAB * config["hidden_size"]
    return config["num_hidden_layers"] * layer + VOCAB * config["hidden_size"] + head


def _count(shape: tuple) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def hf_case(directory: Path, ids: Path, dtype: str, grad: bool, size: str, available: int) -> dict:
    """HF's forward (and backward), or why it was not run: weights (×2 with gradients, ×3 in float32 where HF
    upcasts the bfloat16 file) past 90% of the machine's memory would swap or be killed."""
    needed = parameters(size) * BYTES[dtype] * (2 if grad else 1)
    if needed > 0.9 * available:
        return {"skipped": f"needs {needed / 2**30:.0f} GiB for its weights{' and gradients' if grad else ''}, "
                           f"over 90% of the {available / 2**30:.0f} GiB here"}
    result = measured(hf_command(directory, ids, dtype, grad))
    result["loss"] = json.loads(result["output"].strip().splitlines()[-1])["loss"]
    return result


FORWARD_ROUNDS = 2  # forward rows: best of two, the two commands interleaved; gradient rows (minutes each): one run


def best_of(directory: Path, ids: Path, dtype: str, grad: bool, size: str, available: int) -> tuple[dict, dict]:
    """blocktrace's and HF's runs of one case, alternated, each side's fastest kept."""
    ours, theirs = [], []
    for _ in range(1 if grad else FORWARD_ROUNDS):
        ours.append(blocktrace_case(directory, ids, dtype, grad))
        theirs.append(hf_case(directory, ids, dtype, grad, size, available))
    ours, theirs = min(ours, key=_seconds), min(theirs, key=_seconds)
    if not grad and "skipped" not in theirs:
        ours["startup"] = startup_seconds(blocktrace_command(directory, ids, dtype, grad))
        theirs["startup"] = startup_seconds(hf_command(directory, ids, dtype, grad))
    return ours, theirs


def _seconds(result: dict) -> float:
    return result.get("seconds", 0.0)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f}"


def row(size: str, dtype: str, grad: bool, ours: dict, theirs: dict) -> str:
    what = f"{size.upper()}, {dtype}{', `--grad` / backward' if grad else ''}"
    mine = f"{ours['seconds']:.1f} s, {_gib(ours['anon'])} GiB anon (+{_gib(ours['file'])} mapped)"
    if "skipped" in theirs:
        return f"| {what} | {mine} | not run: {theirs['skipped']} | — | loss {ours['loss']:.4f} |"
    ratio = ours["seconds"] / theirs["seconds"]
    hf = f"{theirs['seconds']:.1f} s, {_gib(theirs['anon'])} GiB anon (+{_gib(theirs['file'])} mapped)"
    same = abs(ours["loss"] - theirs["loss"]) <= LOSS_TOLERANCE * abs(theirs["loss"])
    return (f"| {what} | {mine} | {hf} | {ratio:.2f}×{_after_startup(ours, theirs)} | {ours['loss']:.4f} vs "
            f"{theirs['loss']:.4f} ({'equal' if same else 'DIFFERENT'}) |")


def _after_startup(ours: dict, theirs: dict) -> str:
    """The ratio with each side's imports taken off (HF's `import transformers` is seconds, blocktrace's a fraction
    of one: the whole-process ratio flatters blocktrace by that difference)."""
    if "startup" not in ours:
        return ""
    mine, hf = ours["seconds"] - ours["startup"], theirs["seconds"] - theirs["startup"]
    return (f"; after start-up {mine:.1f} s vs {hf:.1f} s = {mine / hf:.2f}× (imports {ours['startup']:.1f} s vs "
            f"{theirs['startup']:.1f} s)")


def section(sizes: list[str], cases: list[tuple[str, bool]], heading: str = SECTION) -> list[str]:
    facts = machine_facts()
    available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    ids = token_ids()
    rows = []
    for size in sizes:
        directory = checkpoint(size)
        for dtype, grad in cases:
            ours, theirs = best_of(directory, ids, dtype, grad, size, available)
            rows.append(row(size, dtype, grad, ours, theirs))
            print(rows[-1], flush=True)
    return [heading, "",
            f"Written by `python benchmarks/bench_real_sizes.py` on {facts['date']}: {facts['cpu']}, "
            f"{os.cpu_count()} cores, {available / 2**30:.0f} GiB memory, torch {facts['torch']}. "
            f"Random Llama-3-shaped checkpoints ({', '.join(sizes)}; sharded bfloat16 safetensors, llama3 RoPE, GQA 8, "
            f"vocabulary 128,256), `check --weights DIR --token-ids-file ids.json` ({BATCH} × {TOKENS} tokens) against "
            "HF's `from_pretrained` + forward with labels (+ backward). Each case a fresh process; a forward row is "
            f"the best of {FORWARD_ROUNDS} runs of each side, alternated, a gradient row one run of each; peak anonymous memory (RssAnon) and file-backed pages (RssFile) sampled every 50 ms; wall time, "
            f"start-up included; a forward row also gives the ratio after start-up: each side's wall time less its "
            "imports (`-X importtime`'s top-level total, from one run of its own). "
            f"Losses are equal within {LOSS_TOLERANCE:g} relative. {_gradient_rows(cases)} "
            "Targets: `check` ≤ 1.2× HF in the same dtype; `check --grad` of the 8B within 8 GiB "
            "anonymous and ≤ 3× HF's forward + backward where HF fits.", "",
            "| checkpoint, compute dtype | blocktrace `check` | HF | blocktrace / HF | loss |", "|---|---|---|---|---|",
            *rows, ""]


CASES = [("float32", False), ("bfloat16", False), ("float32", True)]
# A bfloat16 backward only where bfloat16 is native: elsewhere torch's bf16 matmul with the weight as stored ([out, in],
# the backward's dx = g @ W) takes a slow path — 33 s for one 256×8192 · 8192×2048 product against 0.14 s in float32
# (torch 2.13.0, a CPU without AVX512-BF16) — so neither HF's nor blocktrace's bf16 backward finishes in useful time.
NATIVE_CASES = CASES + [("bfloat16", True)]


def _gradient_rows(cases: list[tuple[str, bool]]) -> str:
    if ("bfloat16", True) in cases:
        return "bfloat16 is native on this CPU (see its bracket above), so the gradient rows include bfloat16."
    return ("The gradient rows are float32 only: a bfloat16 backward takes a slow matmul path on this CPU (one "
            "256×8192 · 8192×2048 bf16 product, as a backward computes it, 33 s against 0.14 s in float32), HF's and "
            "blocktrace's alike.")


def cases_here() -> list[tuple[str, bool]]:
    return NATIVE_CASES if bf16_native() else CASES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["3b", "8b"], choices=sorted(SHAPES))
    parser.add_argument("--grad-where-hf-fits", action="store_true",
                        help="1b only, float32 --grad beside HF's forward + backward (whose 3B and 8B do not fit here)")
    args = parser.parse_args()
    if args.grad_where_hf_fits:
        lines = section(["1b"], [("float32", True)], GRAD_SECTION)
        print("\n".join(lines))
        write_section(GRAD_SECTION, lines)
        return
    lines = section(args.sizes, cases_here())
    print("\n".join(lines))
    if args.sizes == ["3b", "8b"]:
        write_section(SECTION, lines)


if __name__ == "__main__":
    main()
