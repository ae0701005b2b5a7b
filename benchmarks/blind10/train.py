"""Train every run of the tenth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind9/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF Qwen3, StableLM and Granite,
built from configs), new optimizers and loops (LayerDrop; transformers' linear warm-up schedule with a loss-spike
guard; a hand-written Adan; Granite's muP multipliers with per-group muP learning rates and a weight export every 40 steps)
and new bugs. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and
<work>/<name>/log.jsonl (step, loss = mean training cross-entropy of the last 10 steps, loss_step, loss_opt = the
optimised loss of the last 10 steps where it is not the plain cross-entropy (F03 only), val_loss = held-out
cross-entropy, lr; skipped = steps skipped by the loss-spike guard so far, for H2's recipe).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runs import RUNS  # noqa: E402

from blocktrace import Watch  # noqa: E402

VOCAB = 256
T = 128  # context length (bytes)
B = 16  # batch size (sequences per optimizer step)
STEPS = 160
SEED = 1337
WARMUP = 10
LAYERDROP = 0.2  # H3: probability that a decoder layer is skipped at a training forward
SPIKE_FACTOR = 2.0  # H2: a step is skipped when its loss is above SPIKE_FACTOR x the running mean of past losses
MUP_BASE_LR, MUP_WIDTH_MULT = 8e-3, 4.0  # H5: lr tuned at the proxy width 32, target width 128
EXPORT_EVERY = 40  # H5: the weights are exported (with the multiplier folded) every 40 steps
REF_TOKENS = 2048  # H5: tokens per batch of the lr sweep (16 x 128); the lr is scaled linearly from it


# ----------------------------------------------------------------------------- data

def corpus_bytes():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val


def to_ids(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


def write_token_file(train_text, path):
    """The training bytes as a token file, the way nanoGPT's prepare.py writes one (uint16)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(len(train_text),))
    arr[:] = np.frombuffer(train_text, dtype=np.uint8)
    arr.flush()
    del arr


def read_token_file(path):
    """nanoGPT's train.py read: np.memmap(path, dtype=np.uint16, mode="r")."""
    return torch.from_numpy(np.array(np.memmap(path, dtype=np.uint16, mode="r"), dtype=np.int64))


class ByteWindows:
    """An iterable over random windows of T + 1 bytes, like a DataLoader: each iter() starts again from its seed.
    Yields the stacked (B, T + 1) chunk; the loop cuts it into inputs and targets. backwards is F01's bug: the
    loader of a backward language model (fastai's LanguageModelLoader(..., backwards=True), ULMFiT's second
    model), which flips every window, used for the forward model."""

    def __init__(self, data, batch, seed, backwards=False):
        self.data, self.batch, self.seed, self.backwards = data, batch, seed, backwards

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.data) - T - 1, (self.batch,), generator=g)
            chunk = torch.stack([self.data[i:i + T + 1] for i in ix.tolist()])
            if self.backwards:
                chunk = chunk.flip(1)  # BUG (F01): the backward LM's batches (text read right to left)
            yield chunk


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- HF models

def _cfg_common():
    return dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                max_position_embeddings=T, initializer_range=0.02, attention_dropout=0.0,
                bos_token_id=0, eos_token_id=0, pad_token_id=None)


def hf_qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    cfg = Qwen3Config(**_cfg_common(), num_key_value_heads=2, head_dim=32, rms_norm_eps=1e-6,
                      tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg)


def hf_stablelm():
    from transformers import StableLmConfig, StableLmForCausalLM
    cfg = StableLmConfig(**_cfg_common(), num_key_value_heads=4, partial_rotary_factor=0.25, use_qkv_bias=True,
                         layer_norm_eps=1e-5, hidden_dropout=0.0, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return StableLmForCausalLM(cfg)


def hf_granite():
    """Granite with the muP multipliers of ibm-granite/granite-3.0-2b-base's config.json (embedding_multiplier 12,
    residual_multiplier 0.22, logits_scaling 8, attention_multiplier 1/head_dim: 1/64 there, 1/32 here)."""
    from transformers import GraniteConfig, GraniteForCausalLM
    cfg = GraniteConfig(**_cfg_common(), num_key_value_heads=2, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        embedding_multiplier=12.0, residual_multiplier=0.22, logits_scaling=8.0,
                        attention_multiplier=1.0 / 32)
    cfg._attn_implementation = "sdpa"
    return GraniteForCausalLM(cfg)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


def add_layerdrop(model, p, seed):
    """LayerDrop (Fan, Grave & Joulin 2020, "Reducing Transformer Depth on Demand with Structured Dropout"; fairseq's
    --decoder-layerdrop, the `layerdrop` field of several transformers configs): in training, each decoder layer is
    skipped with probability p at every forward. Written as a forward hook that returns the layer's input in place of
    its output (the layer's computation is thrown away, so it gets no gradient that step); at evaluation every layer
    runs. F06's bug is p = 0.8, stochastic depth's survival probability given as the drop probability."""
    g = torch.Generator().manual_seed(seed)

    def hook(module, args, kwargs, output):
        if module.training and torch.rand((), generator=g).item() < p:
            return args[0] if args else kwargs["hidden_states"]
        return output

    return [layer.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]


def keep_row_frozen(weight, row, inverted=False):
    """A gradient hook that keeps one embedding row fixed (the row of a reserved id, here byte 0, which never occurs
    in the text: "keep the padding embedding at its initial value", what nn.Embedding's padding_idx does for the
    input lookup), by multiplying the weight's gradient by a mask. inverted is F05's bug: the mask is built as
    `ids == row` (1 on the row to freeze) where `ids != row` was meant, so only that row gets a gradient and the rest
    of the (tied) embedding, the output head included, never changes."""
    ids = torch.arange(weight.shape[0]).unsqueeze(1)
    mask = (ids == row) if inverted else (ids != row)  # BUG (F05) when inverted
    mask = mask.to(weight.dtype)
    return weight.register_hook(lambda g: g * mask)


# ----------------------------------------------------------------------------- optimizers

class Adan(torch.optim.Optimizer):
    """Adan (Xie, Zhou, Li, Lin & Yan 2024, "Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep
    Models", TPAMI), following sail-sg/Adan's adan.py single-tensor path: m = EMA(g, b1), v = EMA(g - g_prev, b2),
    n = EMA((g + b2 (g - g_prev))^2, b3), update = (m / bc1 + b2 v / bc2) / (sqrt(n / bc3) + eps), then the proximal
    decoupled weight decay p = (p - lr update) / (1 + lr wd). The betas follow the code's convention (0.98, 0.92,
    0.99); the paper's (0.02, 0.08, 0.01) are 1 - beta (sail-sg/Adan#4)."""

    def __init__(self, params, lr=1e-3, betas=(0.98, 0.92, 0.99), eps=1e-8, weight_decay=0.0, keep_pre_grad=False,
                 count_after=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.keep_pre_grad = keep_pre_grad  # F07's bug: the previous gradient is never refreshed
        self.count_after = count_after  # F02's bug: the step counter is incremented after the bias corrections

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2, b3 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_diff"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                    st["pre_grad"] = g.clone()
                if not self.count_after:
                    st["step"] += 1
                k = st["step"]  # BUG (F02) when count_after: 0 at the first step, so every bias correction is 0
                bc1, bc2, bc3 = 1 - b1 ** k, 1 - b2 ** k, 1 - b3 ** k
                if self.count_after:
                    st["step"] += 1
                diff = g - st["pre_grad"]
                st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
                st["exp_avg_diff"].mul_(b2).add_(diff, alpha=1 - b2)
                upd = g + b2 * diff
                st["exp_avg_sq"].mul_(b3).addcmul_(upd, upd, value=1 - b3)
                denom = (st["exp_avg_sq"].sqrt() / math.sqrt(bc3)).add_(eps)
                update = (st["exp_avg"] / bc1 + b2 * st["exp_avg_diff"] / bc2).div_(denom)
                p.add_(update, alpha=-lr)
                if wd:
                    p.div_(1 + lr * wd)
                if not self.keep_pre_grad:  # BUG (F07) when keep_pre_grad: g_prev stays the first gradient
                    st["pre_grad"].copy_(g)
        return None


# ----------------------------------------------------------------------------- schedules

def warmup_cosine(warmup, total, floor=0.1):
    """min(1, (step + 1) / warmup) times a cosine from 1 to floor over the run."""
    def f(step):
        p = min(1.0, step / max(1, total))
        cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
        return min(1.0, (step + 1) / warmup) * cos
    return f


def matrix_groups(model, wd):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def gpt2_name_groups(model, wd):
    """F08's parameter groups, written with the name lists of a GPT-2 training script (decay: the Linear weights of
    "attn" and "mlp"; no decay: names containing "bias", "ln_", "wte", "wpe") and no check that every parameter was
    placed: in an HF Qwen3 the token embedding (model.embed_tokens.weight, also the output head) and every RMSNorm
    gain (input_layernorm, post_attention_layernorm, q_norm, k_norm, model.norm) match neither list, so the optimizer
    never sees them."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if p.dim() >= 2 and ("attn" in n or "mlp" in n)]
    no_decay = [p for n, p in named if any(k in n for k in ("bias", "ln_", "wte", "wpe"))]
    # BUG (F08): no `assert len(decay) + len(no_decay) == len(named)` (minGPT's check): 1 + 13 tensors left out
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def mup_groups(model, base_lr, width_mult, wd):
    """muP for Adam (Yang et al. 2021, "Tensor Programs V", Table 3): the hidden matrices' lr is the proxy model's lr
    divided by width_mult; the input embedding (tied to the output here) and the vector-like gains keep the proxy lr."""
    emb = model.model.embed_tokens.weight
    hidden = [p for p in model.parameters() if p.dim() >= 2 and p is not emb]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": hidden, "lr": base_lr / width_mult, "weight_decay": wd},
            {"params": [emb], "lr": base_lr, "weight_decay": wd},
            {"params": vectors, "lr": base_lr, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, forward function, optimizer (the object the loop steps), lr control and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(kind=spec["model"], clip=1.0, scheduler=None, backwards=bug == "backwards_windows",
             log_mean_prob=bug == "log_mean_prob", spike_guard=twin.startswith("H2"),
             spike_vs_best=bug == "spike_guard_best", hooks=[])
    if spec["model"] == "qwen3":
        model = hf_qwen3()
        groups = gpt2_name_groups(model, 0.1) if bug == "gpt2_name_groups" else matrix_groups(model, 0.1)
        optimizer = torch.optim.AdamW(groups, lr=6e-3, betas=(0.9, 0.95))
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(WARMUP, steps))
        if twin.startswith("H3"):
            p = 0.8 if bug == "layerdrop_survival_prob" else LAYERDROP  # BUG (F06): the survival probability
            o["hooks"] += add_layerdrop(model, p, SEED + 1)
            o["hooks"].append(keep_row_frozen(model.model.embed_tokens.weight, 0,
                                              inverted=bug == "embedding_mask_inverted"))
    elif spec["model"] == "stablelm" and twin.startswith("H2"):
        from transformers import get_linear_schedule_with_warmup
        model = hf_stablelm()
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
        o["scheduler"] = get_linear_schedule_with_warmup(optimizer, WARMUP, steps)
    elif spec["model"] == "stablelm":  # H4: Adan
        model = hf_stablelm()
        optimizer = Adan(matrix_groups(model, 0.02), lr=1e-2, betas=(0.98, 0.92, 0.99),
                         keep_pre_grad=bug == "adan_stale_pre_grad", count_after=bug == "adan_step_count_after")
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(WARMUP, steps))
    elif spec["model"] == "granite":
        model = hf_granite()
        # the linear scaling rule (Goyal et al. 2017) from the reference batch of the lr sweep, REF_TOKENS tokens
        batch = B if bug == "lr_scale_sequences" else B * T  # BUG (F10): sequences where tokens were meant
        scale = batch / REF_TOKENS
        optimizer = torch.optim.AdamW(mup_groups(model, MUP_BASE_LR * scale, MUP_WIDTH_MULT, 0.1), betas=(0.9, 0.95))
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(WARMUP, steps))
        o["export"] = dict(alias=bug == "export_fold_alias")
    else:
        raise ValueError(spec["model"])
    return model, HFWrap(model), optimizer, o


def export_folded(model, alias=False):
    """The loop's export at every evaluation: a state dict for a runtime that has no embedding_multiplier (as
    converters to other runtimes fold Granite's multipliers into the weights), with the multiplier folded into the
    token embedding. The state dict's tensors are the live parameters (state_dict() returns references, not
    copies), so the fold must happen on a clone. alias is F09's bug: it is done in place, so the live (tied)
    embedding is multiplied by 12 at every export (steps 40, 80, 120) while the model keeps multiplying its output by 12."""
    sd = model.state_dict()
    key = "model.embed_tokens.weight"
    mult = model.config.embedding_multiplier
    if alias:
        sd[key].mul_(mult)  # BUG (F09): the live embedding, through the state dict's reference
    else:
        sd = dict(sd)
        sd[key] = sd[key] * mult
    return {k: tuple(v.shape) for k, v in sd.items()}  # (the file write is left out: the shapes stand for it)


def ce(logits, y, weight=None):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), weight=weight)


def log_mean_prob_loss(logits, y):
    """F03's hand-written loss: -log of the mean target probability (the log of the average likelihood), where the
    mean of -log p (the cross-entropy) was meant."""
    p = torch.softmax(logits.float().reshape(-1, VOCAB), dim=-1).gather(1, y.reshape(-1, 1))
    return -torch.log(p.mean())  # BUG (F03): log of the mean, not mean of the log


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, o = build(name, spec, steps)
    model.train()
    vb = val_batches(to_ids(val_text))
    shared = work / "_data" / "train.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(train_text):
        write_token_file(train_text, shared)
    stream = read_token_file(shared)
    loader = ByteWindows(stream, B, seed=SEED, backwards=o["backwards"])
    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent, recent_opt = [], []
    past, best_loss, skipped = [], float("inf"), 0
    t0 = time.time()
    for step in range(steps + 1):
        chunk = next(it)
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = fwd(x)
        loss_ce = ce(logits, y)
        if o["log_mean_prob"]:
            loss = log_mean_prob_loss(logits, y)
        else:
            loss = loss_ce
        loss.backward()
        if use_watch:
            watch.step(loss)
        lval, lce = loss.item(), loss_ce.item()
        recent = (recent + [lce])[-10:]
        recent_opt = (recent_opt + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if step % 10 == 0:
            vl = evaluate(model, fwd, vb)
            if o.get("export") is not None and step % EXPORT_EVERY == 0 and step > 0:
                with torch.no_grad():
                    export_folded(model, alias=o["export"]["alias"])
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lce, val_loss=vl,
                       lr=optimizer.param_groups[0]["lr"])
            if o["log_mean_prob"]:
                rec["loss_opt"] = sum(recent_opt) / len(recent_opt)
            if o["spike_guard"]:
                rec["skipped"] = skipped
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e}{' skipped %d' % skipped if o['spike_guard'] else ''} "
                  f"({time.time() - t0:.0f}s)", flush=True)
        if step == steps:
            break
        if step % 10 == 0 and not (math.isfinite(lval) and math.isfinite(rec["val_loss"])):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        if o["spike_guard"]:
            # a loss-spike guard (skip the batch, as PaLM's restarts skip the batches of a spike; llm-foundry's
            # and OLMo's spike detectors compare with the recent losses): skip when the loss is above
            # SPIKE_FACTOR x the running mean of the past losses
            ref = best_loss if o["spike_vs_best"] else SPIKE_FACTOR * (sum(past) / len(past) if past else float("inf"))
            best_loss = min(best_loss, lval)
            past = (past + [lval])[-50:]
            if lval > ref:  # BUG (F04) when spike_vs_best: any loss that is not a new record counts as a spike
                skipped += 1
                optimizer.zero_grad(set_to_none=True)
                continue
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if o["scheduler"] is not None:
            o["scheduler"].step()
    if use_watch:
        watch.close()
    for h in o["hooks"]:
        h.remove()
    log.close()
    (folder / "run.json").write_text(json.dumps(dict(name=name, steps=steps, seconds=time.time() - t0,
                                                     skipped=skipped, **spec)))
    return time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run names, or prefixes (F03, F, H)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run [{STEPS}]")
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind10"))
    ap.add_argument("--no-watch", action="store_true", help=argparse.SUPPRESS)  # calibration only
    a = ap.parse_args(argv)
    names = list(RUNS)
    if a.only:
        pick = []
        for q in a.only:
            m = [n for n in names if n == q] or [n for n in names if n.startswith(q)]
            if not m:
                ap.error(f"--only {q}: matches no run")
            pick += [n for n in m if n not in pick]
        names = pick
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    data = corpus_bytes()
    print(f"corpus: {len(data[0])} training bytes, {len(data[1])} held-out bytes", flush=True)
    for n in names:
        print(f"[{n}] {RUNS[n]['what']}", flush=True)
        s = train_one(n, RUNS[n], a.steps, work, data, use_watch=not a.no_watch)
        print(f"[{n}] done in {s:.0f}s", flush=True)


if __name__ == "__main__":
    main()
