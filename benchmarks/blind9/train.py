"""Train every run of the ninth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind8/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF Gemma, OLMo-2 and Cohere,
built from configs), new optimizers and loops (RAdam inside Lookahead, i.e. Ranger, with fastai's flat-then-cosine
schedule; Adam with fairseq's inverse-square-root schedule; a hand-written Prodigy; torch's SequentialLR; FGM
adversarial training on the embedding; a pad_sequence collate function) and new bugs. Each run writes
<work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and <work>/<name>/log.jsonl (step, loss = mean
training cross-entropy of the last 10 steps, loss_step, loss_opt = the optimised loss of the last 10 steps where
it is not the plain cross-entropy (F02 only), val_loss = held-out cross-entropy, lr; prodigy_d for Prodigy).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

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
FGM_EPS = 1.0  # H5: FGM perturbation norm on the embedding matrix
LOOKAHEAD_K, LOOKAHEAD_ALPHA = 6, 0.5  # H2: Ranger's Lookahead settings


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


def collate(windows, seq_first=False):
    """The loader's collate function, written for documents of any length: pad_sequence stacks the windows (all
    129 bytes here, so nothing is padded). seq_first is F01's bug: batch_first left at its default (False), so the
    batch comes out (T + 1, B) and the loop, which expects (B, T + 1), cuts it along the wrong axis."""
    if seq_first:
        return pad_sequence(windows)  # BUG (F01): batch_first defaults to False -> (T + 1, B)
    return pad_sequence(windows, batch_first=True)


class ByteWindows:
    """An iterable over random windows of T + 1 bytes, like a DataLoader with a collate function: each iter()
    starts again from its seed. Yields the collated (B, T + 1) chunk; the loop cuts it into inputs and targets."""

    def __init__(self, data, batch, seed, seq_first=False):
        self.data, self.batch, self.seed, self.seq_first = data, batch, seed, seq_first

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.data) - T - 1, (self.batch,), generator=g)
            yield collate([self.data[i:i + T + 1] for i in ix.tolist()], seq_first=self.seq_first)


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


def byte_class_weights(data):
    """F02: sklearn's compute_class_weight("balanced") over the training bytes, n_samples / (n_classes * count),
    a byte that never occurs counted once (its weight is never used: it is never a target)."""
    counts = torch.bincount(data, minlength=VOCAB).double().clamp(min=1)
    return (len(data) / (VOCAB * counts)).float()


# ----------------------------------------------------------------------------- HF models

def _cfg_common():
    return dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                max_position_embeddings=T, initializer_range=0.02, attention_dropout=0.0,
                bos_token_id=0, eos_token_id=0, pad_token_id=None)


def hf_gemma():
    from transformers import GemmaConfig, GemmaForCausalLM
    cfg = GemmaConfig(**_cfg_common(), num_key_value_heads=1, head_dim=32, hidden_act="gelu_pytorch_tanh",
                      rms_norm_eps=1e-6, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return GemmaForCausalLM(cfg)


def hf_olmo2():
    from transformers import Olmo2Config, Olmo2ForCausalLM
    cfg = Olmo2Config(**_cfg_common(), num_key_value_heads=4, rms_norm_eps=1e-6, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return Olmo2ForCausalLM(cfg)


def hf_cohere(default_logit_scale=False):
    """Cohere multiplies its logits by config.logit_scale. H3 sets it to 1.0; F04 leaves CohereConfig's default,
    0.0625 (Command R's value)."""
    from transformers import CohereConfig, CohereForCausalLM
    extra = {} if default_logit_scale else dict(logit_scale=1.0)  # BUG (F04) when default: logits x 1/16
    cfg = CohereConfig(**_cfg_common(), num_key_value_heads=2, layer_norm_eps=1e-5, use_qk_norm=False,
                       tie_word_embeddings=True, **extra)
    cfg._attn_implementation = "sdpa"
    return CohereForCausalLM(cfg)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- optimizers

class Lookahead(torch.optim.Optimizer):
    """Lookahead (Zhang, Lucas, Hinton & Ba 2019) around a base optimizer, written the way timm and lonePatient's
    lookahead_pytorch write it (param_groups shared with the base optimizer, so schedulers act on both). Every k
    steps the slow weights move alpha of the way to the fast ones and the fast weights are reset to them. The slow
    weights start as a copy of the initial weights (the paper's phi_0 = theta_0); zero_slow is F03's bug: they start
    at zero (a zeros slot never assigned the initial values), so the first synchronisation halves every weight."""

    def __init__(self, base, k=LOOKAHEAD_K, alpha=LOOKAHEAD_ALPHA, zero_slow=False):
        self.base, self.k, self.alpha = base, k, alpha
        self.param_groups = base.param_groups
        self.defaults = base.defaults
        self.state = collections.defaultdict(dict)
        self._la_step = 0
        for group in self.param_groups:
            for p in group["params"]:
                # BUG (F03) when zero_slow: the slow buffer is created as zeros and never given the initial weights
                self.state[p]["slow"] = torch.zeros_like(p) if zero_slow else p.detach().clone()

    def zero_grad(self, set_to_none=True):
        self.base.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.base.step(closure)
        self._la_step += 1
        if self._la_step % self.k == 0:
            for group in self.param_groups:
                for p in group["params"]:
                    slow = self.state[p]["slow"]
                    slow.add_(p - slow, alpha=self.alpha)
                    p.copy_(slow)
        return loss


class Prodigy(torch.optim.Optimizer):
    """Prodigy (Mishchenko & Defazio 2024, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner"): Adam whose
    step size d is estimated online (D-Adaptation); the group's lr multiplies d and should be 1.0 (the authors'
    README: "We recommend using lr=1. (default) for all networks"). Follows konstmish/prodigy's prodigy.py (one
    device, slice_p = 1, decoupled weight decay): numerator and denominator of the d estimate accumulated with
    beta3 = sqrt(beta2), safeguard_warmup removing the lr from the denominator, optional Adam bias correction."""

    def __init__(self, params, lr=1.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, use_bias_correction=False,
                 safeguard_warmup=False, d0=1e-6, d_coef=1.0):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.use_bias_correction, self.safeguard_warmup = use_bias_correction, safeguard_warmup
        self.d0, self.d_coef = d0, d_coef
        self.d, self.d_max, self.d_numerator, self.k = d0, d0, 0.0, 0

    @torch.no_grad()
    def step(self, closure=None):
        beta1, beta2 = self.param_groups[0]["betas"]
        beta3 = math.sqrt(beta2)
        lr = max(g["lr"] for g in self.param_groups)
        d, d0 = self.d, self.d0
        bc = ((1 - beta2 ** (self.k + 1)) ** 0.5) / (1 - beta1 ** (self.k + 1)) if self.use_bias_correction else 1.0
        dlr = d * lr * bc
        self.d_numerator *= beta3
        delta_num, d_denom = 0.0, 0.0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["s"] = torch.zeros_like(p)
                    st["p0"] = p.detach().clone()
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                delta_num += (d / d0) * dlr * torch.dot(g.flatten(), (st["p0"] - p).flatten()).item()
                st["exp_avg"].mul_(beta1).add_(g, alpha=d * (1 - beta1))
                st["exp_avg_sq"].mul_(beta2).addcmul_(g, g, value=d * d * (1 - beta2))
                st["s"].mul_(beta3).add_(g, alpha=(d / d0) * (d if self.safeguard_warmup else dlr))
                d_denom += st["s"].abs().sum().item()
        if d_denom == 0:
            return None
        num = self.d_numerator + delta_num
        d_hat = self.d_coef * num / d_denom
        if d == d0:
            d = max(d, d_hat)
        self.d_max = max(self.d_max, d_hat)
        d = self.d_max  # min(d_max, d * growth_rate) with the default growth_rate = inf
        self.d, self.d_numerator = d, num
        for group in self.param_groups:
            group["d"] = d
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                denom = st["exp_avg_sq"].sqrt().add_(d * group["eps"])
                if group["weight_decay"]:
                    p.add_(p, alpha=-group["weight_decay"] * dlr)
                p.addcdiv_(st["exp_avg"], denom, value=-dlr)
        self.k += 1
        return None


class FGM:
    """Fast Gradient Method adversarial training on the embedding (Miyato, Dai & Goodfellow 2017), as the widely
    copied PyTorch snippet writes it: attack() backs the embedding up and adds epsilon * g / ||g||, restore() puts
    the backup back. backup_by_reference is F07's bug: the backup is `param.data` (the same storage) instead of
    `param.data.clone()`, so restore() puts the perturbed values back and every perturbation stays. sign is F10's
    bug: FGSM's perturbation epsilon * sign(g) (an L-infinity step) with FGM's epsilon 1.0 (an L2 radius), so every
    entry of the embedding moves by 1.0."""

    def __init__(self, model, emb_name="embed_tokens", epsilon=FGM_EPS, backup_by_reference=False, sign=False):
        self.model, self.emb_name, self.epsilon, self.by_ref = model, emb_name, epsilon, backup_by_reference
        self.sign = sign
        self.backup = {}

    def attack(self):
        for name, param in self.model.named_parameters():
            if param.requires_grad and self.emb_name in name and param.grad is not None:
                # BUG (F07) when by_ref: no .clone(), the backup aliases the parameter being perturbed
                self.backup[name] = param.data if self.by_ref else param.data.clone()
                norm = torch.norm(param.grad)
                if self.sign:
                    param.data.add_(self.epsilon * param.grad.sign())  # BUG (F10): FGSM's sign step at FGM's epsilon
                elif norm != 0 and not torch.isnan(norm):
                    param.data.add_(self.epsilon * param.grad / norm)

    def restore(self):
        for name, param in self.model.named_parameters():
            if name in self.backup:
                param.data = self.backup[name]
        self.backup = {}


# ----------------------------------------------------------------------------- schedules

def flat_cos(total, pct_flat=0.72):
    """fastai's fit_flat_cos (the Ranger recipe): the lr flat for 72% of the run, then cosine annealing to 0."""
    start = int(total * pct_flat)

    def f(step):
        if step < start:
            return 1.0
        p = min(1.0, (step - start) / max(1, total - start))
        return 0.5 * (1 + math.cos(math.pi * p))
    return f


def inverse_sqrt(optimizer, warmup_updates, lr, warmup_init_lr):
    """fairseq's inverse_square_root schedule as a LambdaLR: the lr rises linearly from warmup_init_lr to lr over
    warmup_updates steps, then decays as lr * sqrt(warmup_updates / step). lr and warmup_init_lr are absolute
    learning rates, turned into factors of the optimizer's lr."""
    base = optimizer.param_groups[0]["lr"]

    def f(step):
        s = step + 1
        if s <= warmup_updates:
            return (warmup_init_lr + (lr - warmup_init_lr) * s / warmup_updates) / base
        return lr * math.sqrt(warmup_updates / s) / base
    return torch.optim.lr_scheduler.LambdaLR(optimizer, f)


def warmup_cosine(warmup, total, floor=0.0):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def matrix_groups(model, wd):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, forward function, optimizer (the object the loop steps), lr control and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(kind=spec["model"], clip=None, scheduler=None, seq_first=bug == "seq_first_collate",
             class_weights=bug == "balanced_class_weights", fgm_zero_between=bug == "fgm_zero_grad_before_adv",
             fgm=twin.startswith("H5"), fgm_by_ref=bug == "fgm_backup_by_reference",
             restore_after_step=bug == "fgm_restore_after_step")
    if spec["model"] == "gemma":
        model = hf_gemma()
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=2e-3, betas=(0.9, 0.95))
        warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, end_factor=1.0, total_iters=WARMUP)
        cos = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps - WARMUP, eta_min=2e-4)
        o["scheduler"] = torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cos], milestones=[WARMUP])
        o["clip"] = 1.0
    elif spec["model"] == "olmo2" and twin.startswith("H2"):
        model = hf_olmo2()
        base = torch.optim.RAdam(matrix_groups(model, 0.01), lr=8e-3, betas=(0.95, 0.999), eps=1e-5,
                                 decoupled_weight_decay=True)
        optimizer = Lookahead(base, zero_slow=bug == "lookahead_zero_slow")
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(base, flat_cos(steps))
    elif spec["model"] == "olmo2":  # H4: Prodigy
        model = hf_olmo2()
        lr = 1e-3 if bug == "prodigy_adam_lr" else 1.0  # BUG (F06): the AdamW recipe's lr carried over
        optimizer = Prodigy(matrix_groups(model, 0.01), lr=lr, betas=(0.9, 0.99), weight_decay=0.01,
                            use_bias_correction=True, safeguard_warmup=True)
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(WARMUP, steps))
        o["clip"] = 1.0
    elif spec["model"] == "cohere":
        model = hf_cohere(default_logit_scale=bug == "cohere_default_logit_scale")
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98), eps=1e-9)
        if bug == "invsqrt_lr_swapped":
            # BUG (F05): the two learning rates given in each other's place (peak as the warm-up start, start as lr)
            o["scheduler"] = inverse_sqrt(optimizer, WARMUP, 2e-5, 2e-3)
        else:
            o["scheduler"] = inverse_sqrt(optimizer, WARMUP, lr=2e-3, warmup_init_lr=2e-5)
        o["clip"] = 1.0
    else:
        raise ValueError(spec["model"])
    return model, HFWrap(model), optimizer, o


def ce(logits, y, weight=None):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), weight=weight)


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
    weight = byte_class_weights(stream) if o["class_weights"] else None
    loader = ByteWindows(stream, B, seed=SEED, seq_first=o["seq_first"])
    it = iter(loader)
    fgm = FGM(model, backup_by_reference=o["fgm_by_ref"], sign=spec["bug"] == "fgsm_sign_eps") if o["fgm"] else None
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent, recent_opt = [], []
    t0 = time.time()
    for step in range(steps + 1):
        chunk = next(it)
        x, y = chunk[:, :-1], chunk[:, 1:]
        logits = fwd(x)
        loss_ce = ce(logits, y)
        if o["class_weights"]:
            loss = ce(logits, y, weight=weight)  # BUG (F02): class-balanced weights on the next-byte loss
        else:
            loss = loss_ce
        loss.backward()
        if use_watch:
            watch.step(loss)
        if fgm is not None:
            fgm.attack()  # the embedding moved by epsilon * g / ||g||
            if o["fgm_zero_between"]:
                optimizer.zero_grad(set_to_none=True)  # BUG (F09): the clean gradient dropped (PGD's inner-loop zero_grad)
            ce(fwd(x), y).backward()  # the adversarial gradient, added to the clean one
            if not o["restore_after_step"]:
                fgm.restore()
        lval, lce = float(loss), float(loss_ce)
        recent = (recent + [lce])[-10:]
        recent_opt = (recent_opt + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if step % 10 == 0:
            vl = evaluate(model, fwd, vb)
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lce, val_loss=vl,
                       lr=optimizer.param_groups[0]["lr"])
            if o["class_weights"]:
                rec["loss_opt"] = sum(recent_opt) / len(recent_opt)
            if isinstance(optimizer, Prodigy):
                rec["prodigy_d"] = optimizer.d
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e}{' d %.2e' % optimizer.d if isinstance(optimizer, Prodigy) else ''} "
                  f"({time.time() - t0:.0f}s)", flush=True)
        if step == steps:
            if fgm is not None and o["restore_after_step"]:
                fgm.restore()
            break
        if step % 10 == 0 and not (math.isfinite(lval) and math.isfinite(rec["val_loss"])):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        optimizer.step()
        if fgm is not None and o["restore_after_step"]:
            fgm.restore()  # BUG (F08): after the step, so the step's update to the embedding is overwritten
        optimizer.zero_grad(set_to_none=True)
        if o["scheduler"] is not None:
            o["scheduler"].step()
    if use_watch:
        watch.close()
    log.close()
    (folder / "run.json").write_text(json.dumps(dict(name=name, steps=steps, seconds=time.time() - t0, **spec)))
    return time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run names, or prefixes (F03, F, H)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run [{STEPS}]")
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind9"))
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
