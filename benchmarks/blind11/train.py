"""Train every run of the eleventh blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind10/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF Mistral, SmolLM3 and Exaone4,
built from configs), new optimizers and loops (an LR range test with its reset; SGD with Nesterov momentum and
AdamW written by hand with torch's rules; SGDR warm restarts; a hand-written Lion; temperature-based sampling
over data sources with a WeightedRandomSampler) and new bugs. Each run writes <work>/<name>/watch.jsonl (a
blocktrace Watch in the loop) and <work>/<name>/log.jsonl (step, loss = mean training cross-entropy of the last
10 steps, loss_step, loss_opt = the optimised loss of the last 10 steps where it is not the plain cross-entropy
(F02 only), val_loss = held-out cross-entropy, lr of the first parameter group).
"""

from __future__ import annotations

import argparse
import copy
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
FLOOR = 0.1  # cosine schedules end at 10% of the peak
SGDR_CYCLE = 50  # H3: cosine cycles of 50 steps after the warm-up (restarts at 60 and 110)
SGD_LR = 0.03  # H2: SGD with Nesterov momentum 0.9 (clip 1.0)
ALPHA = 0.3  # H5: temperature sampling exponent (mT5's alpha = 0.3)
RANGE_TEST = dict(start_lr=1e-6, end_lr=1.0, num_iter=40, smooth_f=0.05, diverge_th=5.0)  # H1: torch-lr-finder's


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
    return torch.from_numpy(np.array(np.memmap(path, dtype=np.uint16, mode="r"), dtype=np.int64))


class ByteWindows:
    """An iterable over random windows of T + 1 bytes, like a DataLoader: each iter() starts again from its seed.
    Yields the stacked (B, T + 1) chunk; the loop cuts it into inputs and targets."""

    def __init__(self, data, batch, seed):
        self.data, self.batch, self.seed = data, batch, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.data) - T - 1, (self.batch,), generator=g)
            yield torch.stack([self.data[i:i + T + 1] for i in ix.tolist()])


class SourceSampledWindows:
    """H5's loader: temperature-based sampling over data sources (Conneau & Lample 2019, XLM: q_i ∝ p_i ** alpha;
    Xue et al. 2021, mT5: alpha = 0.3). Each training module is a source; every byte offset of the stream at which a
    window of T + 1 bytes fits is a candidate window start, belonging to the source its first byte comes from, and
    torch's WeightedRandomSampler draws window starts with weight q(source) / n_starts(source). source_weights is
    F09's bug: the sampler is given the per-source weights (one per module) instead of the per-start weights, so it
    draws indices 0 .. n_sources - 1 only."""

    def __init__(self, data, sizes, batch, seed, steps, source_weights=False):
        self.data, self.batch, self.seed, self.steps = data, batch, seed, steps
        starts = np.cumsum([0] + list(sizes[:-1]))
        n_starts = len(data) - T - 1
        start_src = np.searchsorted(starts, np.arange(n_starts), side="right") - 1
        q = np.asarray(sizes, dtype=np.float64) ** ALPHA
        q = q / q.sum()
        per_src = np.bincount(start_src, minlength=len(sizes))
        w = q[start_src] / per_src[start_src]
        self.weights = torch.tensor(q if source_weights else w)  # BUG (F09) when source_weights
        self.n_sources = len(sizes)

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        sampler = torch.utils.data.WeightedRandomSampler(self.weights, num_samples=self.batch * (self.steps + 1),
                                                         replacement=True, generator=g)
        ix = list(sampler)
        for k in range(0, len(ix), self.batch):
            yield torch.stack([self.data[i:i + T + 1] for i in ix[k:k + self.batch]])


def bytes_to_unicode():
    """GPT-2's byte-level alphabet (openai/gpt-2 encoder.py, the ByteLevel pre-tokenizer of huggingface/tokenizers):
    every byte gets a visible character; the printable ones map to themselves, the others (space, newline, tab,
    bytes >= 127) are shifted to U+0100 and up (space -> 'Ġ', newline -> 'Ċ')."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def bytelevel_view(text):
    """F06's bug: the training corpus exported as the byte-level tokenizer's visible form, the token strings joined
    ("".join(tokenizer.convert_ids_to_tokens(ids)), 'defĠfoo(x):Ċ'), and written out as UTF-8 - every space,
    newline, tab and non-ASCII byte becomes a two-byte character - instead of decoding back to the text."""
    table = bytes_to_unicode()
    return "".join(table[b] for b in text).encode("utf-8")


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- HF models

def _cfg_common():
    return dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=T, initializer_range=0.02, attention_dropout=0.0,
                bos_token_id=0, eos_token_id=0, pad_token_id=None)


def hf_mistral():
    from transformers import MistralConfig, MistralForCausalLM
    cfg = MistralConfig(**_cfg_common(), head_dim=32, rms_norm_eps=1e-6, sliding_window=4096,
                        tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return MistralForCausalLM(cfg)


def hf_smollm3():
    from transformers import SmolLM3Config, SmolLM3ForCausalLM
    cfg = SmolLM3Config(**_cfg_common(), rms_norm_eps=1e-6, tie_word_embeddings=True)
    cfg._attn_implementation = "sdpa"
    return SmolLM3ForCausalLM(cfg)


def hf_exaone4():
    from transformers import Exaone4Config, Exaone4ForCausalLM
    cfg = Exaone4Config(**_cfg_common(), rms_norm_eps=1e-5, sliding_window=4096, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    return Exaone4ForCausalLM(cfg)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself. manual_head: H5's forward takes the final
    hidden states from the decoder (model.model) and applies the output matrix itself, F.linear(h, W) (the layout of
    a chunked / fused linear + cross-entropy loss), with W = the output embedding, tied to the input embedding in
    SmolLM3. detach_head is F10's bug: W is taken as the input embedding's weight, detached ("the tied matrix already
    gets its gradient through the input lookup"), so no gradient of the loss reaches the matrix through the head."""

    def __init__(self, model, manual_head=False, detach_head=False):
        self.model, self.manual_head, self.detach_head = model, manual_head, detach_head

    def __call__(self, x):
        if not self.manual_head:
            return self.model(input_ids=x).logits
        h = self.model.model(input_ids=x).last_hidden_state
        if self.detach_head:
            w = self.model.get_input_embeddings().weight.detach()  # BUG (F10): the head's gradient is dropped
        else:
            w = self.model.get_output_embeddings().weight
        return F.linear(h, w)


# ----------------------------------------------------------------------------- optimizers

class SGDNesterov(torch.optim.Optimizer):
    """SGD with Nesterov momentum written by hand with torch.optim.SGD's rule (dampening 0): buf = g at the first
    step, then buf = momentum * buf + g; p -= lr * (g + momentum * buf). rezero is F03's bug: the per-step group
    set-up creates the momentum buffer without checking whether it exists (kozistr/pytorch_optimizer PR #516's
    SignSGD), so it is zeros at every step and buf = g."""

    def __init__(self, params, lr, momentum=0.9, rezero=False):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.rezero = rezero

    def _init_group(self, group):
        for p in group["params"]:
            if p.grad is None:
                continue
            st = self.state[p]
            if self.rezero:
                st["momentum_buffer"] = torch.zeros_like(p)  # BUG (F03): every step, not only the first
            elif "momentum_buffer" not in st:
                st["momentum_buffer"] = None

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            self._init_group(group)
            mu, lr = group["momentum"], group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                buf = st["momentum_buffer"]
                if buf is None:
                    buf = st["momentum_buffer"] = g.clone()
                else:
                    buf.mul_(mu).add_(g)
                p.add_(g.add(buf, alpha=mu), alpha=-lr)
        return None


class AdamWHand(torch.optim.Optimizer):
    """AdamW written by hand with torch.optim.AdamW's rule: m = lerp(m, g, 1 - b1), v = b2 v + (1 - b2) g^2,
    p *= 1 - lr wd, p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps). v_ones is F05's bug: the second moment is
    created with torch.ones_like (the initial accumulator of TF's RMSProp) instead of torch.zeros_like."""

    def __init__(self, params, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, v_ones=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.v_ones = v_ones

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
                    st["exp_avg_sq"] = torch.ones_like(p) if self.v_ones else torch.zeros_like(p)  # BUG (F05)
                st["step"] += 1
                t = st["step"]
                st["exp_avg"].lerp_(g, 1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
                bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
                if wd:
                    p.mul_(1 - lr * wd)
                denom = (st["exp_avg_sq"].sqrt() / math.sqrt(bc2)).add_(eps)
                p.addcdiv_(st["exp_avg"], denom, value=-lr / bc1)
        return None


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), after google/automl's
    lion_pytorch.py: p *= 1 - lr wd; p -= lr * sign(b1 m + (1 - b1) g); m = b2 m + (1 - b2) g. inplace is F07's bug:
    the update is computed in place on the state (update = exp_avg.mul_(b1).add_(g, 1 - b1); update.sign_()), so
    the momentum buffer is replaced by the sign of the update at every step (cf. yangluo7/CAME#2). no_sign is F08's
    bug: the interpolation is applied without its sign, p -= lr * (b1 m + (1 - b1) g) (the missing sign of
    kozistr/pytorch_optimizer PR #479): momentum SGD at Lion's lr, 3e-4."""

    def __init__(self, params, lr, betas=(0.9, 0.99), weight_decay=0.0, inplace=False, no_sign=False):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self.inplace = inplace
        self.no_sign = no_sign

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["exp_avg"] = torch.zeros_like(p)
                exp_avg = st["exp_avg"]
                p.mul_(1 - lr * wd)
                if self.inplace:
                    update = exp_avg.mul_(b1).add_(g, alpha=1 - b1)  # BUG (F07): in place on the state
                    p.add_(update.sign_(), alpha=-lr)
                elif self.no_sign:
                    update = exp_avg * b1 + g * (1 - b1)
                    p.add_(update, alpha=-lr)  # BUG (F08): the sign is not taken
                else:
                    update = exp_avg * b1 + g * (1 - b1)
                    p.add_(torch.sign(update), alpha=-lr)
                exp_avg.mul_(b2).add_(g, alpha=1 - b2)
        return None


def matrix_groups(model, wd):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- schedules

def warmup_cosine_factor(step, total, warmup=WARMUP, floor=FLOOR):
    """min(1, (step + 1) / warmup) times a cosine from 1 to floor over `total` steps."""
    p = min(1.0, step / max(1, total))
    cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / warmup) * cos


def sgdr_factor(step, warmup=WARMUP, cycle=SGDR_CYCLE, floor=FLOOR):
    """SGDR (Loshchilov & Hutter 2017) after a linear warm-up: cosine cycles of `cycle` steps from 1 to floor, each
    restarting at 1 (torch's CosineAnnealingWarmRestarts(T_0=cycle, eta_min=floor * lr), T_mult 1)."""
    if step < warmup:
        return (step + 1) / warmup
    pos = (step - warmup) % cycle
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * pos / cycle))


# ----------------------------------------------------------------------------- the LR range test (H1)

def lr_range_test(model, fwd, optimizer, loader, start_lr, end_lr, num_iter, smooth_f, diverge_th):
    """The LR range test of davidtvs/pytorch-lr-finder (Smith 2017): the lr of every group set to start_lr and
    raised exponentially to end_lr over num_iter batches (an LR scheduler on the optimizer, so the groups get an
    initial_lr), the loss smoothed exponentially, the test stopped when the smoothed loss passes diverge_th x its
    best. Returns the history and the lr of steepest descent. The weights and the optimizer's state are changed by
    the test; LRFinder.reset() restores them from the copies taken before it."""
    for g in optimizer.param_groups:
        g["lr"] = start_lr
    sched = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: (end_lr / start_lr) ** (i / max(1, num_iter - 1)))
    hist = dict(lr=[], loss=[])
    best, smoothed = None, None
    it = iter(loader)
    for i in range(num_iter):
        chunk = next(it)
        x, y = chunk[:, :-1], chunk[:, 1:]
        loss = ce(fwd(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        hist["lr"].append(optimizer.param_groups[0]["lr"])
        sched.step()
        lv = loss.item()
        smoothed = lv if smoothed is None else smooth_f * lv + (1 - smooth_f) * smoothed
        hist["loss"].append(smoothed)
        if best is None or smoothed < best:
            best = smoothed
        if not math.isfinite(smoothed) or smoothed > diverge_th * best:
            break
    optimizer.zero_grad(set_to_none=True)
    ls = np.array(hist["loss"])
    k = int(np.argmin(np.gradient(ls))) if len(ls) > 2 else 0
    return dict(iters=len(ls), suggested_lr=hist["lr"][k], last_lr=hist["lr"][-1], last_loss=float(ls[-1]),
                best_loss=float(best))


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, forward function, optimizer (the object the loop steps) and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(clip=1.0, schedule="warmup_cosine", range_test=twin.startswith("H1"), reset=bug != "lrfinder_no_reset",
             pairwise=bug == "target_column_broadcast", late_binding=bug == "schedule_late_binding",
             sampler=twin.startswith("H5"), source_weights=bug == "sampler_source_weights",
             bytelevel=bug == "bytelevel_corpus")
    manual_head = False
    if twin.startswith("H1"):
        model = hf_mistral()
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
    elif twin.startswith("H2"):
        model = hf_smollm3()
        optimizer = SGDNesterov(model.parameters(), lr=SGD_LR, momentum=0.9, rezero=bug == "sgd_momentum_rezeroed")
    elif twin.startswith("H3"):
        model = hf_mistral()
        optimizer = AdamWHand(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95),
                              v_ones=bug == "adamw_second_moment_ones")
        o["schedule"] = "sgdr"
    elif twin.startswith("H4"):
        model = hf_exaone4()
        # the Lion paper's conversion from an AdamW recipe (lr 3e-3, wd 0.1): lr / 10, wd x 10
        optimizer = Lion(matrix_groups(model, 0.1 * 10), lr=3e-3 / 10, betas=(0.9, 0.99),
                         inplace=bug == "lion_inplace_update", no_sign=bug == "lion_no_sign")
    elif twin.startswith("H5"):
        model = hf_smollm3()
        manual_head = True
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
    else:
        raise ValueError(twin)
    fwd = HFWrap(model, manual_head=manual_head, detach_head=bug == "head_weight_detached")
    return model, fwd, optimizer, o


def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


def nll_by_index(logits, y, column=False):
    """H1's hand-written negative log-likelihood: the log-probability of each target picked by advanced indexing,
    logp[arange(N), y]. column is F02's bug: the targets are kept as a column, y.view(-1, 1) (the shape prepared for
    gather), and the two index tensors broadcast to (N, N): every position is scored against every target."""
    logp = torch.log_softmax(logits.float().reshape(-1, VOCAB), dim=-1)
    n = logp.shape[0]
    tgt = y.reshape(-1, 1) if column else y.reshape(-1)  # BUG (F02) when column
    return -logp[torch.arange(n), tgt].mean()


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, o = build(name, spec, steps)
    model.train()
    vb = val_batches(to_ids(val_text))
    shared = work / "_data" / "train.bin"
    if o["bytelevel"]:
        train_text = bytelevel_view(train_text)  # BUG (F06): the byte-level tokenizer's visible form, not the text
        shared = work / "_data" / "train_bytelevel.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(train_text):
        write_token_file(train_text, shared)
    stream = read_token_file(shared)
    if o["sampler"]:
        sizes = [p.stat().st_size for p in training_files()]
        loader = SourceSampledWindows(stream, sizes, B, seed=SEED, steps=steps, source_weights=o["source_weights"])
    else:
        loader = ByteWindows(stream, B, seed=SEED)
    extra = {}
    if o["range_test"]:
        # torch-lr-finder: LRFinder(model, optimizer, criterion).range_test(loader, end_lr, num_iter); lr_finder.reset()
        cached = dict(model=copy.deepcopy(model.state_dict()), optimizer=copy.deepcopy(optimizer.state_dict()))
        extra["range_test"] = lr_range_test(model, fwd, optimizer, loader, **RANGE_TEST)
        if o["reset"]:  # BUG (F01) when not reset: the range test's weights, optimizer state and initial_lr stay
            model.load_state_dict(cached["model"])
            optimizer.load_state_dict(cached["optimizer"])
        print(f"  {name} range test: {extra['range_test']} reset={o['reset']}", flush=True)
    num_steps = steps
    if o["schedule"] == "sgdr":
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, sgdr_factor)
    else:
        # the schedule reads the run length from this scope when it is called (Python closures bind late)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine_factor(s, num_steps))
    it = iter(loader)
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
        if twin_of(name).startswith("H1"):
            loss = nll_by_index(logits, y, column=o["pairwise"])
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
            model.eval()
            vls = []
            with torch.no_grad():
                if o["late_binding"]:
                    for num_steps, (xv, yv) in enumerate(vb):  # BUG (F04): rebinds the name the schedule reads
                        vls.append(ce(fwd(xv), yv).item())
                else:
                    for i, (xv, yv) in enumerate(vb):
                        vls.append(ce(fwd(xv), yv).item())
            model.train()
            vl = sum(vls) / len(vls)
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lce, val_loss=vl,
                       lr=optimizer.param_groups[0]["lr"])
            if o["pairwise"]:
                rec["loss_opt"] = sum(recent_opt) / len(recent_opt)
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
        scheduler.step()
    if use_watch:
        watch.close()
    log.close()
    (folder / "run.json").write_text(json.dumps(dict(name=name, steps=steps, seconds=time.time() - t0, **extra,
                                                     **spec)))
    return time.time() - t0


def twin_of(name):
    return RUNS[name]["twin"] or name


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run names, or prefixes (F03, F, H)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run [{STEPS}]")
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind11"))
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
