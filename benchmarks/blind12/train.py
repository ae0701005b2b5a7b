"""Train every run of the twelfth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind11/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF Helium, GLM-4, Nemotron,
ERNIE 4.5 and Arcee, built from configs), new optimizers and loops (a warmup-stable-decay schedule; NAdam under
bf16 autocast fed by a shuffle-and-take pool of chunks; ADOPT with an attention function registered through transformers'
AttentionInterface; Nesterov SGD with adaptive gradient clipping; z-loss with a diffusers-style EMA) and new
bugs. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and <work>/<name>/log.jsonl
(step, loss = mean training cross-entropy of the last 10 steps, loss_step, loss_opt = the optimised loss of the
last 10 steps where it is not the plain cross-entropy, val_loss = held-out cross-entropy of the training model,
val_loss_ema (H5's family) = held-out cross-entropy of the EMA weights, lr of the first parameter group).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
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
FLOOR = 0.1  # cosine schedules end at 10% of the peak
WSD_WARMUP = 5  # H1: a 5-step warm-up
WSD_DECAY_FROM = 0.8  # H1: the cool-down is the last 20% of the run
SGD_LR = 0.1  # H4
AGC_CLIP, AGC_EPS = 0.01, 1e-3  # H4: timm's adaptive_clip_grad defaults
Z_LOSS = 1e-4  # H5: PaLM's z-loss coefficient
EMA_DECAY = 0.99  # H5: a fixed decay (diffusers EMAModel(decay=0.99, min_decay=0.99))


# ----------------------------------------------------------------------------- data

def training_files():
    root = Path(json.__file__).parent.parent
    return sorted(root.glob("*.py"))


def corpus_bytes():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in training_files())
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
    return np.array(np.memmap(path, dtype=np.uint16, mode="r"), dtype=np.int64)


class ByteWindows:
    """Random windows of T + 1 bytes, like a DataLoader: each iter() starts again from its seed. Yields the stacked
    (B, T + 1) chunk; the loop cuts it into inputs and targets."""

    def __init__(self, data, batch, seed):
        self.data, self.batch, self.seed = torch.from_numpy(data), batch, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.data) - T - 1, (self.batch,), generator=g)
            yield torch.stack([self.data[i:i + T + 1] for i in ix.tolist()])


class ShufflePool:
    """H2's loader: the stream cut into non-overlapping chunks of T + 1 bytes (HF's group_texts), kept as one 2-D
    numpy array (the pool); each batch shuffles the pool in place and takes its first B rows (B distinct chunks per
    batch, drawn afresh at every step). stdlib_shuffle is F03's bug: the pool is shuffled with Python's
    random.shuffle, whose swap x[i], x[j] = x[j], x[i] on a 2-D numpy array copies row j over row i through a view
    and leaves row j as it was (python/cpython#91546, mnielsen/neural-networks-and-deep-learning#51)."""

    def __init__(self, data, batch, seed, stdlib_shuffle=False):
        n = len(data) // (T + 1)
        self.chunks = data[:n * (T + 1)].reshape(n, T + 1).astype(np.uint8)
        self.batch, self.seed, self.stdlib_shuffle = batch, seed, stdlib_shuffle

    def __iter__(self):
        pool = self.chunks.copy()
        rng, prng = np.random.default_rng(self.seed), random.Random(self.seed)
        while True:
            if self.stdlib_shuffle:
                prng.shuffle(pool)  # BUG (F03): the swap through row views duplicates rows
            else:
                rng.shuffle(pool)
            yield torch.from_numpy(pool[:self.batch].astype(np.int64))


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- HF models

def _cfg_common():
    return dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=T, initializer_range=0.02,
                attention_dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=None)


def _build(config_cls, model_cls, attn="sdpa", **kw):
    cfg = config_cls(**_cfg_common(), **kw)
    cfg._attn_implementation = attn
    return model_cls(cfg)


def hf_helium():
    from transformers import HeliumConfig, HeliumForCausalLM
    return _build(HeliumConfig, HeliumForCausalLM, tie_word_embeddings=False)


def hf_glm4():
    from transformers import Glm4Config, Glm4ForCausalLM
    return _build(Glm4Config, Glm4ForCausalLM, tie_word_embeddings=False)


def hf_nemotron(attn):
    from transformers import NemotronConfig, NemotronForCausalLM
    return _build(NemotronConfig, NemotronForCausalLM, attn=attn, tie_word_embeddings=False)


def hf_ernie45():
    from transformers import Ernie4_5Config, Ernie4_5ForCausalLM
    return _build(Ernie4_5Config, Ernie4_5ForCausalLM, tie_word_embeddings=True)


def hf_arcee():
    from transformers import ArceeConfig, ArceeForCausalLM
    return _build(ArceeConfig, ArceeForCausalLM, tie_word_embeddings=False)


def _repeat_kv(x, n):
    return x if n == 1 else x.repeat_interleave(n, dim=1)


def registered_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """H3's attention, registered with transformers' AttentionInterface: q, k, v arrive as (B, H, T, D) (k, v with
    the KV heads); the KV heads repeated, causal sdpa, the output returned as (B, T, H, D) as transformers expects."""
    n_rep = query.shape[1] // key.shape[1]
    k, v = _repeat_kv(key, n_rep), _repeat_kv(value, n_rep)
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=None, is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_attentions():
    from transformers import AttentionInterface
    AttentionInterface.register("blind12_sdpa", registered_attention)


# ----------------------------------------------------------------------------- optimizers

class ADOPT(torch.optim.Optimizer):
    """ADOPT (Taniguchi et al. 2024, "ADOPT: Modified Adam Can Converge with Any beta2 with the Optimal Rate"), after
    iShohei220/adopt: the first step only initialises v = g^2; then the gradient is normalised by the previous v,
    clipped to +-t^0.25, averaged into m (m = normalised g at the first update), p -= lr m, and v = b2 v +
    (1 - b2) g^2; decoupled weight decay. F05's bug is in the constructor call (betas=(0.9999, 0.9)).
    clamp_min_only is F06's bug: the clip is written clamp_(t ** 0.25), whose single argument is the lower bound
    (torch.clamp(input, min=None, max=None)), instead of clamp_(-t ** 0.25, t ** 0.25)."""

    def __init__(self, params, lr, betas=(0.9, 0.9999), eps=1e-6, weight_decay=0.0, clamp_min_only=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.clamp_min_only = clamp_min_only

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = g.mul(g)
                    continue  # ADOPT: the first step only initialises v
                st["step"] += 1
                t = st["step"]
                if wd:
                    p.mul_(1 - lr * wd)
                denom = st["exp_avg_sq"].sqrt().clamp_(min=eps)
                if self.clamp_min_only:
                    normed = (g / denom).clamp_(t ** 0.25)  # BUG (F06): one argument is the lower bound only
                else:
                    normed = (g / denom).clamp_(-t ** 0.25, t ** 0.25)
                if t == 1:
                    st["exp_avg"].copy_(normed)
                else:
                    st["exp_avg"].lerp_(normed, 1 - b1)
                p.add_(st["exp_avg"], alpha=-lr)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        return None


class SGDNesterov(torch.optim.Optimizer):
    """SGD with Nesterov momentum written by hand with torch.optim.SGD's rule (dampening 0): buf = g at the first
    step, then buf = mu buf + g; p -= lr (g + mu buf). sign_bug is F08's: p = p - lr g + lr mu buf (the momentum
    term's sign of PaddlePaddle's momentum op before PaddlePaddle/Paddle#12231)."""

    def __init__(self, params, lr, momentum=0.9, sign_bug=False):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.sign_bug = sign_bug

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu, lr = group["momentum"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = st["momentum_buffer"] = g.clone()
                else:
                    buf.mul_(mu).add_(g)
                if self.sign_bug:
                    p.add_(g, alpha=-lr).add_(buf, alpha=lr * mu)  # BUG (F08): + lr mu buf
                else:
                    p.add_(g.add(buf, alpha=mu), alpha=-lr)
        return None


def _unitwise_norm(x):
    if x.ndim <= 1:
        return x.norm(2.0)
    return x.norm(2.0, dim=tuple(range(1, x.ndim)), keepdim=True)


@torch.no_grad()
def adaptive_clip_grad(parameters, clip_factor=AGC_CLIP, eps=AGC_EPS, where_swapped=False):
    """NFNets' adaptive gradient clipping (Brock et al. 2021), as timm.utils.agc.adaptive_clip_grad: each unit's
    (row's) gradient norm clipped to clip_factor x its weight norm (at least eps). where_swapped is F07's bug: the
    two branches of the final torch.where are exchanged."""
    for p in parameters:
        if p.grad is None:
            continue
        g = p.grad.detach()
        max_norm = _unitwise_norm(p.detach()).clamp_(min=eps).mul_(clip_factor)
        grad_norm = _unitwise_norm(g)
        clipped = g * (max_norm / grad_norm.clamp(min=1e-6))
        if where_swapped:
            new = torch.where(grad_norm < max_norm, clipped, g)  # BUG (F07): branches swapped
        else:
            new = torch.where(grad_norm < max_norm, g, clipped)
        p.grad.detach().copy_(new)


def matrix_groups(model, wd):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


class EMAModel:
    """An EMA of the parameters in the manner of diffusers.training_utils.EMAModel(decay=0.99, min_decay=0.99): step()
    after every optimizer step with the fixed decay 0.99; store() / copy_to() / restore() to evaluate the averaged
    weights on the training model."""

    def __init__(self, params, decay=EMA_DECAY):
        self.shadow = [p.detach().clone() for p in params]
        self.decay, self.t, self.backup = decay, 0, None

    @torch.no_grad()
    def step(self, params):
        self.t += 1
        d = self.decay
        for s, p in zip(self.shadow, params):
            s.mul_(d).add_(p.detach(), alpha=1 - d)

    @torch.no_grad()
    def store(self, params):
        self.backup = [p.detach().clone() for p in params]

    @torch.no_grad()
    def copy_to(self, params):
        for s, p in zip(self.shadow, params):
            p.copy_(s)

    @torch.no_grad()
    def restore(self, params):
        for b, p in zip(self.backup, params):
            p.copy_(b)
        self.backup = None


# ----------------------------------------------------------------------------- schedules

def warmup_cosine_factor(step, total, warmup=WARMUP, floor=FLOOR):
    """min(1, (step + 1) / warmup) times a cosine from 1 to floor over `total` steps."""
    p = min(1.0, step / max(1, total))
    cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / warmup) * cos


def wsd_factor(step, total, warmup=WARMUP, decay_from=WSD_DECAY_FROM, warmup_max=False):
    """Warmup-stable-decay (MiniCPM, Hu et al. 2024; Hägele et al. 2024): linear warm-up, constant peak, linear
    cool-down to 0 over the last (1 - decay_from) of the run, written as the product of a warm-up factor
    min(1, (step + 1) / warmup) and a cool-down factor min(1, (total - step) / (total - start)). warmup_max is F02's
    bug: the warm-up factor is written max(1, (step + 1) / warmup), so it keeps growing after the warm-up."""
    start = int(decay_from * total)
    if warmup_max:
        warm = max(1.0, (step + 1) / warmup)  # BUG (F02): max where min was meant
    else:
        warm = min(1.0, (step + 1) / warmup)
    cool = min(1.0, max(0.0, (total - step) / max(1, total - start)))
    return warm * cool


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, optimizer (the object the loop steps) and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(clip=1.0, agc=False, schedule="warmup_cosine", chunks=False, bf16=False, nll=False, zloss=False,
             ema=False, bug=bug)
    if twin.startswith("H1"):
        model = hf_helium()
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
        o["schedule"] = "wsd"
    elif twin.startswith("H2"):
        model = hf_glm4()
        optimizer = torch.optim.NAdam(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95),
                                      decoupled_weight_decay=True)
        o.update(chunks=True, bf16=True, nll=True)
    elif twin.startswith("H3"):
        register_attentions()
        model = hf_nemotron("blind12_sdpa")
        # ADOPT(params, lr, betas=(beta1, beta2)): F05 passes them in the other order
        betas = (0.9999, 0.9) if bug == "adopt_betas_swapped" else (0.9, 0.9999)  # BUG (F05) when swapped
        optimizer = ADOPT(matrix_groups(model, 0.1), lr=3e-3, betas=betas,
                          clamp_min_only=bug == "adopt_clamp_min_only")
    elif twin.startswith("H4"):
        model = hf_ernie45()
        optimizer = SGDNesterov(model.parameters(), lr=SGD_LR, momentum=0.9, sign_bug=bug == "nesterov_sign")
        o.update(clip=None, agc=True)
    elif twin.startswith("H5"):
        model = hf_arcee()
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
        o.update(zloss=True, ema=True)
    else:
        raise ValueError(twin)
    return model, optimizer, o


def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, optimizer, o = build(name, spec, steps)
    bug = o["bug"]
    model.train()
    vb = val_batches(to_ids(val_text))
    shared = work / "_data" / "train.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(train_text):
        write_token_file(train_text, shared)
    stream = read_token_file(shared)
    if o["chunks"]:
        loader = ShufflePool(stream, B, seed=SEED, stdlib_shuffle=bug == "stdlib_random_shuffle")
    else:
        loader = ByteWindows(stream, B, seed=SEED)
    if o["schedule"] == "wsd":
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: wsd_factor(s, steps, warmup=WSD_WARMUP, warmup_max=bug == "wsd_warmup_max"))
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine_factor(s, steps))
    params = list(model.parameters())
    ema = EMAModel(params) if o["ema"] else None
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=o["bf16"])

    def fwd(x):
        with autocast:
            return model(input_ids=x).logits

    def evaluate():
        model.eval()
        with torch.no_grad():
            vls = [ce(fwd(xv), yv).item() for xv, yv in vb]
        model.train()
        return sum(vls) / len(vls)

    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent, recent_opt = [], []
    log_opt = bug in ("ce_view_class_dim", "nll_sign_dropped") or o["zloss"]
    t0 = time.time()
    for step in range(steps + 1):
        chunk = next(it)
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = fwd(x)
        loss_ce = ce(logits, y)
        if bug == "ce_view_class_dim":
            bsz, tl, v = logits.shape
            loss = F.cross_entropy(logits.float().view(bsz, v, tl), y)  # BUG (F01): view, not transpose(1, 2)
        elif o["nll"]:
            logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, y.unsqueeze(-1))
            if bug == "nll_sign_dropped":
                loss = logp.mean()  # BUG (F04): the log-likelihood, not its negative
            else:
                loss = -logp.mean()
        elif o["zloss"]:
            zl = logits.float()
            z = Z_LOSS * torch.logsumexp(zl, dim=-1).pow(2).mean()
            if bug == "ce_on_detached_logits":
                loss = ce(logits.detach(), y) + z  # BUG (F09): the cross-entropy of the detached metrics tensor
            else:
                loss = loss_ce + z
        else:
            loss = loss_ce
        loss.backward()
        if use_watch:
            watch.step(loss)
        lval, lce = loss.item(), loss_ce.item()
        recent = (recent + [lce])[-10:]
        recent_opt = (recent_opt + [lval])[-10:]
        if o["agc"]:
            adaptive_clip_grad(params, where_swapped=bug == "agc_where_swapped")
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(params, o["clip"])
        if step % 10 == 0:
            vl = evaluate()
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lce, val_loss=vl,
                       lr=optimizer.param_groups[0]["lr"])
            if log_opt:
                rec["loss_opt"] = sum(recent_opt) / len(recent_opt)
            if ema is not None:
                ema.store(params)
                ema.copy_to(params)
                rec["val_loss_ema"] = evaluate()
                if bug != "ema_not_restored":
                    ema.restore(params)  # BUG (F10) when skipped: training goes on from the EMA weights
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e} ({time.time() - t0:.0f}s)", flush=True)
        if step == steps:
            break
        if step % 10 == 0 and not (math.isfinite(lval) and math.isfinite(rec["val_loss"])):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            ema.step(params)
        scheduler.step()
    if use_watch:
        watch.close()
    log.close()
    (folder / "run.json").write_text(json.dumps(dict(name=name, steps=steps, seconds=time.time() - t0, **spec)))
    return time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run names, or prefixes (F03, F, H)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run [{STEPS}]")
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind12"))
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
