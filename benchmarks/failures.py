"""The failure benchmark: tiny models trained healthy and broken, each checkpoint checked.

    python benchmarks/failures.py            # trains every run, checks every checkpoint, writes FAILURES.md
    python benchmarks/failures.py --only gpt2-healthy gpt2-lr-high
    python benchmarks/failures.py --sample sample_weights/training   # the small failing run docs/track.md tracks

Character-level language models on Python's own standard-library sources (a local corpus: no
download), a few minutes on 2 CPU cores. Healthy runs (GPT-2 and Llama layouts, a Post-LN BERT
decoder with warm-up, a Mixtral-style mixture of experts with its load-balance loss) and failing
runs with one known cause each: learning rate too high without warm-up, a bad initialisation
scale, a deep Post-LN model without warm-up, float16 overflow, a missing causal mask, a residual
adding the normed tensor, dead ReLU units, a router that collapses (no load-balance loss, router
learning rate 100×). Every
checkpoint is checked with `blocktrace check` (the model's own loss, --grad) — or, for the bugs
that live in code, `check --module` on the run's block — and FAILURES.md reports, per run: the
step at which `check` first errs, the step at which the loss curve shows the failure, whether
the diagnosis' top cause is the known one, and every false alarm. Every run trains with a
blocktrace Watch (every 10 steps) in its loop, and FAILURES.md sets the step at which the watch
first raises an ERROR against the step at which the loss curve shows the failure (early warning).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from common import DATA, machine_facts  # noqa: E402

WORK = DATA / "failures"
CONTEXT, BATCH, EVAL_SEQUENCES = 128, 16, 8
CORPUS_CHARS, MIN_CHAR_COUNT = 3_000_000, 50
LOSS_MARGIN, LOSS_WINDOW = 0.5, 10  # the loss curve shows a failure: its 10-step mean 0.5 nats above a reference


@dataclass(frozen=True)
class Run:
    name: str
    model: str  # gpt2, llama, bert (a causal Post-LN decoder), nano (nanoGPT-style, the code bugs)
    expected: Optional[str]  # the known cause; None: a healthy run
    lr: float = 1e-3
    warmup: int = 50
    clip: Optional[float] = 1.0
    steps: int = 400
    options: dict = field(default_factory=dict)


RUNS = [
    Run("gpt2-healthy", "gpt2", None),
    Run("llama-healthy", "llama", None),
    Run("bert-postln-healthy", "bert", None, lr=5e-4, warmup=100, options={"layers": 12}),
    Run("nano-healthy", "nano", None),
    Run("mixtral-healthy", "mixtral", None),  # with Mixtral's load-balance loss (router_aux_loss_coef 0.01)
    Run("gpt2-lr-high", "gpt2", "learning_rate", lr=1e-1, warmup=0, clip=None),
    Run("llama-lr-high", "llama", "learning_rate", lr=1e-1, warmup=0, clip=None),
    Run("gpt2-bad-init", "gpt2", "initialisation", options={"init_std": 1.0}),
    Run("bert-postln-no-warmup", "bert", "warmup", lr=5e-3, warmup=0, clip=None, options={"layers": 12}),
    Run("gpt2-fp16", "gpt2", "precision", lr=1e-2, warmup=0, clip=None, steps=100, options={"dtype": "float16"}),
    Run("nano-no-causal-mask", "nano", "mask", options={"causal": False}),
    Run("nano-residual-normed", "nano", "residual", options={"residual_normed": True}),
    Run("gpt2-dead-relu", "gpt2", "architecture", options={"activation": "relu", "fc_bias": -1.5}),
    # no load-balance loss, and the router at 100× the learning rate: it collapses onto a few experts
    Run("mixtral-router-lr-high", "mixtral", "routing", options={"balance": False, "router_lr_scale": 100.0}),
]
CHECKPOINT_STEPS = (0, 10, 25, 50, 75, 100, 150, 200, 250, 300, 350, 400)
WATCH_EVERY = 10
# docs/track.md's `track` example: the gpt2-lr-high recipe at a size small enough to commit (about 130 KB a checkpoint).
SAMPLE_RUN = Run("gpt2-lr-high", "gpt2", "learning_rate", lr=1e-1, warmup=0, clip=None, steps=100,
                 options={"d_model": 32, "layers": 2, "heads": 2})
SAMPLE_STEPS = (0, 10, 25, 50, 100)
# README's mixture-of-experts example: the router-collapse recipe, small (4 experts of 32, 2 layers, d_model 32).
MOE_SAMPLE_RUN = Run("mixtral-router-lr-high", "mixtral", "routing", steps=60,
                     options={"balance": False, "router_lr_scale": 100.0, "d_model": 32, "layers": 2, "heads": 2,
                              "d_ff": 32, "experts": 4})
MOE_SAMPLE_STEPS = (0, 20, 60)


# --- corpus -------------------------------------------------------------------------------------

def corpus() -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Train and validation ids of a character-level corpus: the standard library's .py files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    text, size = [], 0
    for path in sorted(root.glob("*.py")):
        chunk = path.read_text(encoding="utf-8", errors="replace")
        text.append(chunk)
        size += len(chunk)
        if size >= CORPUS_CHARS:
            break
    joined = "".join(text)[:CORPUS_CHARS]
    counts: dict[str, int] = {}
    for char in joined:
        counts[char] = counts.get(char, 0) + 1
    vocab = ["<unk>", *sorted(c for c, n in counts.items() if n >= MIN_CHAR_COUNT)]
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index.get(c, 0) for c in joined])
    split = int(0.95 * len(ids))
    return ids[:split], ids[split:], vocab


def write_tokenizer(path: Path, vocab: list[str]) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({c: i for i, c in enumerate(vocab)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(str(path))


def batch(ids: torch.Tensor, generator: torch.Generator, size: int = BATCH) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - CONTEXT, (size,), generator=generator)
    return torch.stack([ids[s : s + CONTEXT] for s in starts.tolist()])


# --- models -------------------------------------------------------------------------------------

def build(run: Run, vocab: int):
    import transformers
    from bench_models import D_MODEL, N_HEAD, N_LAYER, NanoGPT

    torch.manual_seed(0)
    options = run.options
    if run.model == "nano":
        return NanoGPT(vocab, causal=options.get("causal", True), residual_normed=options.get("residual_normed", False))
    common = dict(vocab_size=vocab, attn_implementation="sdpa")  # HF's default: what a Watch sees in most models
    if run.model == "gpt2":
        config = transformers.GPT2Config(n_embd=options.get("d_model", D_MODEL), n_head=options.get("heads", N_HEAD),
                                         n_layer=options.get("layers", N_LAYER), n_positions=CONTEXT,
                                         activation_function=options.get("activation", "gelu_new"), bos_token_id=0,
                                         eos_token_id=0, **common)
        model = transformers.GPT2LMHeadModel(config)
    elif run.model == "mixtral":
        # 8 experts of about half Llama's width (88: HF's grouped_mm wants 16-byte strides), top-2, and the
        # load-balance loss unless told not
        config = transformers.MixtralConfig(hidden_size=options.get("d_model", D_MODEL),
                                            num_attention_heads=options.get("heads", N_HEAD), num_key_value_heads=2,
                                            num_hidden_layers=options.get("layers", N_LAYER),
                                            intermediate_size=options.get("d_ff", 88),
                                            num_local_experts=options.get("experts", 8),
                                            num_experts_per_tok=2, max_position_embeddings=CONTEXT,
                                            output_router_logits=options.get("balance", True),
                                            router_aux_loss_coef=0.01, bos_token_id=0, eos_token_id=0, **common)
        model = transformers.MixtralForCausalLM(config)
    elif run.model == "llama":
        config = transformers.LlamaConfig(hidden_size=D_MODEL, num_attention_heads=N_HEAD, num_key_value_heads=2,
                                          num_hidden_layers=N_LAYER, intermediate_size=172,
                                          max_position_embeddings=CONTEXT, bos_token_id=0, eos_token_id=0, **common)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.BertConfig(hidden_size=D_MODEL, num_attention_heads=N_HEAD,
                                         num_hidden_layers=options.get("layers", N_LAYER), intermediate_size=4 * D_MODEL,
                                         max_position_embeddings=CONTEXT, is_decoder=True, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0, **common)
        model = transformers.BertLMHeadModel(config)
    _initialise(model, options)
    return model


def _initialise(model, options: dict) -> None:
    with torch.no_grad():
        if "init_std" in options:
            for name, parameter in model.named_parameters():
                if parameter.dim() == 2:
                    parameter.normal_(0.0, options["init_std"])
        if "fc_bias" in options:
            for name, parameter in model.named_parameters():
                if name.endswith("mlp.c_fc.bias"):
                    parameter.fill_(options["fc_bias"])


def save(model, directory: Path, vocab: list[str]) -> None:
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(directory)
    else:
        model.save(directory)
    write_tokenizer(directory / "tokenizer.json", vocab)


# --- training -----------------------------------------------------------------------------------

def learning_rate(run: Run, step: int) -> float:
    if step < run.warmup:
        return run.lr * (step + 1) / run.warmup
    progress = (step - run.warmup) / max(1, run.steps - run.warmup)
    return run.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def parameter_groups(model, run: Run) -> list[dict]:
    """Weight decay on matrices only; a mixture of experts' routers at router_lr_scale × the learning rate."""
    scale = run.options.get("router_lr_scale", 1.0)
    named = list(model.named_parameters())
    router = [p for n, p in named if ".block_sparse_moe.gate." in n or ".mlp.gate.weight" in n]
    ids = {id(p) for p in router}
    decay = [p for n, p in named if p.dim() >= 2 and id(p) not in ids]
    rest = [p for n, p in named if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1, "scale": 1.0}, {"params": rest, "weight_decay": 0.0, "scale": 1.0}]
    return groups + ([{"params": router, "weight_decay": 0.1, "scale": scale}] if router else [])


def watch_in(directory: Path):
    """A Watch every WATCH_EVERY steps, writing directory/watch.jsonl (a fresh file for each training)."""
    from blocktrace import Watch

    def make(model, optimizer):
        directory.mkdir(parents=True, exist_ok=True)
        return Watch(model, directory / "watch.jsonl", every=WATCH_EVERY, optimizer=optimizer, overwrite=True)
    return make


def train(run: Run, train_ids, vocab: list[str], directory: Path, watch_factory=None,
          checkpoint_steps=CHECKPOINT_STEPS) -> list[dict]:
    """Train `run`, saving a checkpoint at every checkpoint step; returns the log (one dict per step)."""
    model = build(run, len(vocab))
    if run.options.get("dtype") == "float16":
        model = model.half()
    model.train()
    optimizer = torch.optim.AdamW(parameter_groups(model, run), lr=run.lr, betas=(0.9, 0.95))
    watch = watch_factory(model, optimizer) if watch_factory else None
    generator = torch.Generator().manual_seed(1)
    log = []
    for step in range(run.steps + 1):
        if step in checkpoint_steps:
            save(model, directory / f"step_{step:04d}", vocab)
        if step == run.steps:
            break
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(run, step) * group["scale"]
        ids = batch(train_ids, generator)
        loss = model(ids, labels=ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), run.clip if run.clip else float("inf"))
        if watch is not None:
            watch.step(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.append({"step": step, "loss": loss.item(), "lr": optimizer.param_groups[0]["lr"], "grad_norm": norm.item()})
    if watch is not None:
        watch.close()
    with open(directory / "log.jsonl", "w") as handle:
        handle.writelines(json.dumps(entry) + "\n" for entry in log)
    return log


def _means(log: list[dict]) -> list[float]:
    losses = [entry["loss"] for entry in log]
    return [sum(losses[max(0, i + 1 - LOSS_WINDOW) : i + 1]) / min(i + 1, LOSS_WINDOW) for i in range(len(losses))]


def loss_failure_step(log: list[dict], healthy: Optional[list[dict]] = None) -> Optional[int]:
    """The first step at which the training loss shows the failure: NaN, or its 10-step mean 0.5 nats above
    the lowest 10-step mean so far, or 0.5 nats above the healthy run's of the same model at the same step."""
    means = _means(log)
    baseline = _means(healthy) if healthy else []
    lowest = math.inf
    for step, mean in enumerate(means):
        if not math.isfinite(mean):
            return step
        if step + 1 < LOSS_WINDOW:
            continue
        if mean > lowest + LOSS_MARGIN or (step < len(baseline) and mean > baseline[step] + LOSS_MARGIN):
            return step
        lowest = min(lowest, mean)
    return None


# --- checking -----------------------------------------------------------------------------------

def eval_arguments(val_ids: torch.Tensor) -> list[str]:
    sequences = batch(val_ids, torch.Generator().manual_seed(2), EVAL_SEQUENCES)
    words = []
    for index, row in enumerate(sequences.tolist()):
        words += (["/"] if index else []) + [str(i) for i in row]
    return ["--token-ids", *words]


def check(run: Run, checkpoint: Path, eval_args: list[str]) -> dict:
    from click.testing import CliRunner

    from blocktrace.cli import cli

    if run.model == "nano":
        os.environ["BLOCKTRACE_BENCH_CHECKPOINT"] = str(checkpoint)
        args = ["check", "--module", "bench_models:block", "--seq-len", "64", "--json"]
    else:
        args = ["check", "--weights", str(checkpoint), *eval_args, "--grad", "--json"]
    started = time.perf_counter()
    result = CliRunner().invoke(cli, args, catch_exceptions=False)
    report = json.loads(result.stdout)
    return {"exit": result.exit_code, "seconds": time.perf_counter() - started, "loss": report.get("loss"),
            "flags": [(f["name"], f["level"], f["layer"]) for f in report.get("flags") or []],
            "diagnosis": [d["cause"] for d in report.get("diagnosis") or []]}


def watch_findings(path: Path) -> list[tuple[int, str, Optional[int], str]]:
    """(step, finding, layer, level) of every ERROR and WARNING the watch recorded."""
    from blocktrace.training.timeline import read_timeline

    return [(entry["step"], f["name"], f["layer"], f["level"]) for entry in read_timeline(path)
            for f in entry["flags"] if f["level"] in ("error", "warning")]


@dataclass
class Outcome:
    run: Run
    loss_failure: Optional[int]
    checks: dict  # step -> check result
    train_seconds: float
    watch: list = field(default_factory=list)  # (step, finding, layer, level) of every ERROR and WARNING

    @property
    def watch_errors(self) -> list:
        return [finding for finding in self.watch if finding[3] == "error"]

    @property
    def watch_first_error(self) -> Optional[int]:
        return self.watch_errors[0][0] if self.watch_errors else None

    @property
    def warned_in_time(self) -> bool:
        """The watch erred no later than the loss showed the failure (and at all, if the loss never did)."""
        first = self.watch_first_error
        return first is not None and (self.loss_failure is None or first <= self.loss_failure)

    @property
    def first_error(self) -> Optional[int]:
        return next((step for step, c in sorted(self.checks.items()) if any(f[1] == "error" for f in c["flags"])),
                    None)

    @property
    def top_cause(self) -> Optional[str]:
        first = self.first_error
        return None if first is None else (self.checks[first]["diagnosis"] or [None])[0]

    @property
    def false_alarms(self) -> list[str]:
        if self.run.expected is not None:
            return []
        return [f"step {step}: {name} ({level}, layer {layer})" for step, c in sorted(self.checks.items())
                for name, level, layer in c["flags"] if level in ("error", "warning")]

    @property
    def exit_codes_right(self) -> bool:
        codes = [c["exit"] for step, c in sorted(self.checks.items())]
        if self.run.expected is None:
            return all(code == 0 for code in codes)
        first = self.first_error
        return first is not None and all(c["exit"] == 1 for s, c in self.checks.items() if s >= first)


def benchmark(runs: list[Run]) -> list[Outcome]:
    os.chdir(HERE)  # --module bench_models:block resolves from here
    train_ids, val_ids, vocab = corpus()
    eval_args = eval_arguments(val_ids)
    outcomes, healthy_logs = [], {}
    for run in runs:
        directory = WORK / run.name
        started = time.perf_counter()
        log = train(run, train_ids, vocab, directory, watch_in(directory))
        seconds = time.perf_counter() - started
        if run.expected is None:
            healthy_logs[run.model] = log
        checks = {step: check(run, directory / f"step_{step:04d}", eval_args)
                  for step in CHECKPOINT_STEPS if step <= run.steps}
        outcomes.append(Outcome(run, loss_failure_step(log, healthy_logs.get(run.model)), checks, seconds,
                                watch_findings(directory / "watch.jsonl")))
        print(f"{run.name}: trained in {seconds:.0f} s; first error at {outcomes[-1].first_error}, "
              f"watch at {outcomes[-1].watch_first_error}, loss shows it at {outcomes[-1].loss_failure}, "
              f"top cause {outcomes[-1].top_cause}", file=sys.stderr)
    return outcomes


# --- report -------------------------------------------------------------------------------------

def _step(value: Optional[int]) -> str:
    return "never" if value is None else str(value)


def report(outcomes: list[Outcome]) -> str:
    failing = [o for o in outcomes if o.run.expected is not None]
    healthy = [o for o in outcomes if o.run.expected is None]
    caught = [o for o in failing if o.first_error is not None]
    right = [o for o in failing if o.top_cause == o.run.expected]
    alarms = [alarm for o in healthy for alarm in o.false_alarms]
    facts = machine_facts()
    lines = [
        "# Failure benchmark", "",
        f"Written by `python benchmarks/failures.py` on {facts['date']}: {facts['cpu']}, {facts['threads']} torch "
        f"threads, Python {facts['python']}, torch {facts['torch']}. Character-level models (d_model 64, 4 heads; "
        f"4 layers, 12 for the BERT decoders) on {CORPUS_CHARS:,} characters of Python's standard library, batches "
        f"of {BATCH}×{CONTEXT} tokens, AdamW (β 0.9/0.95, weight decay 0.1), warm-up then cosine decay. "
        f"Checkpoints at steps {', '.join(map(str, CHECKPOINT_STEPS))}; each checked with `blocktrace check "
        f"--weights CHECKPOINT --token-ids <{EVAL_SEQUENCES} validation sequences of {CONTEXT}> --grad` (the model's "
        "own loss), or, for the bugs that live in code, `blocktrace check --module bench_models:block` on the "
        "run's first block. The loss curve shows a failure at the first step where the 10-step mean training loss "
        f"is {LOSS_MARGIN} nats above its lowest 10-step mean so far, or {LOSS_MARGIN} nats above the healthy run's "
        "of the same model at the same step, or is NaN.", "",
        f"- failing runs caught: {len(caught)} of {len(failing)} (target: all)",
        f"- top cause right at the first error: {len(right)} of {len(failing)} (target: ≥ 90%)",
        f"- false ERROR/WARNING on healthy runs: {len(alarms)} over {sum(len(o.checks) for o in healthy)} checks "
        "(target: 0)",
        f"- `check` exit codes as they should be (0 on every healthy checkpoint, 1 from the first error on): "
        f"{sum(o.exit_codes_right for o in outcomes)} of {len(outcomes)} runs", "",
        "| run | known cause | `check` first errs at step | loss curve shows it at step | top cause at the first "
        "error | right | train s |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        expected = o.run.expected or "healthy"
        verdict = ("yes" if o.top_cause == o.run.expected else "no") if o.run.expected else \
            ("no alarm" if not o.false_alarms else f"{len(o.false_alarms)} false alarms")
        lines.append(f"| {o.run.name} | {expected} | {_step(o.first_error)} | {_step(o.loss_failure)} | "
                     f"{o.top_cause or '-'} | {verdict} | {o.train_seconds:.0f} |")
    lines += ["", "## Early warning: the Watch inside the training loop", "",
              f"Every run above trained with `Watch(model, 'watch.jsonl', every={WATCH_EVERY})` in its loop (records "
              f"at steps 0, {WATCH_EVERY}, {2 * WATCH_EVERY}, …, each on that step's own training batch). Target: "
              "the watch raises an ERROR no later than the loss curve shows the failure, and never on a healthy run.",
              "", f"- failing runs warned in time: {sum(o.warned_in_time for o in failing)} of {len(failing)}",
              f"- ERRORs and WARNINGs on healthy runs: {sum(len(o.watch) for o in healthy)} over "
              f"{sum(-(-o.run.steps // WATCH_EVERY) for o in healthy)} records", "",
              "| run | watch first ERROR at step | finding (layer) | loss curve shows it at step | in time |",
              "|---|---|---|---|---|"]
    for o in outcomes:
        first = o.watch_errors[0] if o.watch_errors else None
        finding = f"{first[1]} ({first[2]})" if first else "-"
        verdict = ("yes" if o.warned_in_time else "no") if o.run.expected else \
            ("no alarm" if not o.watch else f"{len(o.watch)} false ERRORs/WARNINGs")
        lines.append(f"| {o.run.name} | {_step(o.watch_first_error)} | {finding} | {_step(o.loss_failure)} | {verdict} |")
    lines += ["", "## Findings per checkpoint", ""]
    for o in outcomes:
        lines += [f"### {o.run.name}", "", "| step | loss | exit | errors and warnings | diagnosis |",
                  "|---|---|---|---|---|"]
        for step, c in sorted(o.checks.items()):
            shown = sorted({f"{name} ({level})" for name, level, _ in c["flags"] if level != "info"})
            loss = "-" if c["loss"] is None else f"{c['loss']:.3f}"
            lines.append(f"| {step} | {loss} | {c['exit']} | {', '.join(shown) or '-'} | "
                         f"{', '.join(c['diagnosis'][:2]) or '-'} |")
        lines.append("")
    if alarms:
        lines += ["## False alarms", "", *[f"- {alarm}" for alarm in alarms], ""]
    return "\n".join(lines)


def write_sample(directory: Path) -> None:
    """SAMPLE_RUN's and MOE_SAMPLE_RUN's checkpoints, training logs and watch timelines, and a few validation lines
    to track them on."""
    train_ids, val_ids, vocab = corpus()
    target = directory / SAMPLE_RUN.name
    train(SAMPLE_RUN, train_ids, vocab, target, watch_in(target), checkpoint_steps=SAMPLE_STEPS)
    moe = directory / MOE_SAMPLE_RUN.name
    train(MOE_SAMPLE_RUN, train_ids, vocab, moe, watch_in(moe), checkpoint_steps=MOE_SAMPLE_STEPS)
    lines = "".join(vocab[i] if i else "?" for i in val_ids[:4000].tolist()).splitlines()
    (directory / "eval.txt").write_text("\n".join([line for line in lines if len(line) > 40][:8]) + "\n")
    print(f"wrote {target}, {moe} and {directory / 'eval.txt'}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only these runs (by name)")
    parser.add_argument("--sample", type=Path,
                        help="only train the small failing runs docs/track.md and README track into this directory")
    arguments = parser.parse_args()
    if arguments.sample is not None:
        write_sample(arguments.sample)
        return 0
    runs = [r for r in RUNS if not arguments.only or r.name in arguments.only]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    outcomes = benchmark(runs)
    text = report(outcomes)
    target = HERE / ("FAILURES.md" if not arguments.only else "FAILURES.partial.md")
    target.write_text(text + "\n", encoding="utf-8")
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
