"""Train every run of the eighth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind7/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (a hand-written "LLMs from
scratch"-style GPT with ALiBi, HF Phi-3 and StarCoder2), new optimizers and loops (LAMB, OneCycleLR, transformers'
Adafactor, random-byte input noising, an epoch loop) and new bugs. Each run writes <work>/<name>/watch.jsonl (a
blocktrace Watch in the loop) and <work>/<name>/log.jsonl (step, loss = mean training loss of the last 10 steps,
loss_step = this step's training loss, val_loss = held-out cross-entropy, lr).
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
import torch.nn as nn
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
EPOCH = 40  # book runs: an "epoch" of the loader is 40 steps (the loop is written as an epoch loop)
NOISE = 0.2  # H5: fraction of input bytes replaced by uniformly random bytes
CLAMP = 0.1  # F08: the "clip_value"


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
    Yields the (B, T + 1) chunk; the loop cuts it into inputs and targets. chunk_index_as_offset is F09's bug:
    the sampler draws a batch number in [0, len(loader)) = [0, len // (B (T + 1))) and the loader uses it as a byte
    offset."""

    def __init__(self, data, batch, seed, chunk_index_as_offset=False):
        self.data, self.batch, self.seed, self.bug = data, batch, seed, chunk_index_as_offset

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            if self.bug:
                # BUG (F09): a batch number (len(loader) = len // (B (T + 1)) of them), used below as an offset into
                # the bytes; should be offsets drawn from [0, len - T - 1)
                ix = torch.randint(len(self.data) // (self.batch * (T + 1)), (self.batch,), generator=g)
            else:
                ix = torch.randint(len(self.data) - T - 1, (self.batch,), generator=g)
            yield torch.stack([self.data[i:i + T + 1] for i in ix.tolist()])


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- "LLMs from scratch"-style model

class LayerNorm(nn.Module):
    """The book's hand-written LayerNorm (scale and shift parameters, biased variance)."""

    def __init__(self, emb_dim):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * (x - mean) / torch.sqrt(var + self.eps) + self.shift


class GELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(d, 4 * d), GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        return self.layers(x)


def alibi_slopes(n_heads):
    """Press et al.'s slopes for a power-of-two head count: 2^(-8 (h + 1) / n)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)])


class MultiHeadAttention(nn.Module):
    """The book's MultiHeadAttention (W_query, W_key, W_value, out_proj, a triu mask buffer), with an ALiBi bias
    added to the scores (written as attention-gym's score_mod: slope * (kv_idx - q_idx)).
    qkv_rand (F05): the three projections are nn.Parameter(torch.rand(d_in, d_out)) used as x @ W (the book's
    SelfAttention_v1 form)."""

    def __init__(self, d_in, d_out, context_length, num_heads, qkv_rand=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.qkv_rand = qkv_rand
        if qkv_rand:
            # BUG (F05): uniform [0, 1) weights (torch.rand), where nn.Linear draws U(-1/sqrt(d_in), 1/sqrt(d_in))
            self.W_query = nn.Parameter(torch.rand(d_in, d_out))
            self.W_key = nn.Parameter(torch.rand(d_in, d_out))
            self.W_value = nn.Parameter(torch.rand(d_in, d_out))
        else:
            self.W_query = nn.Linear(d_in, d_out, bias=False)
            self.W_key = nn.Linear(d_in, d_out, bias=False)
            self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.out_proj = nn.Linear(d_out, d_out)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1),
                             persistent=False)
        pos = torch.arange(context_length)
        q_idx, kv_idx = pos[:, None], pos[None, :]
        rel = (kv_idx - q_idx).float()  # <= 0 on the causal side: a penalty growing with distance
        self.register_buffer("alibi", alibi_slopes(num_heads)[:, None, None] * rel, persistent=False)

    def _proj(self, w, x):
        return x @ w if self.qkv_rand else w(x)

    def forward(self, x):
        b, n, _ = x.shape
        keys = self._proj(self.W_key, x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        queries = self._proj(self.W_query, x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        values = self._proj(self.W_value, x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3) / self.head_dim ** 0.5 + self.alibi[:, :n, :n]
        mask_bool = self.mask.bool()[:n, :n]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        attn_weights = torch.softmax(attn_scores, dim=-1)
        context_vec = (attn_weights @ values).transpose(1, 2).contiguous().view(b, n, self.d_out)
        return self.out_proj(context_vec)


class TransformerBlock(nn.Module):
    """The book's TransformerBlock (att, ff, norm1, norm2), its sub-modules named the way GPT-2 names them (attn, mlp,
    ln_1, ln_2) so that the Watch can tell the steps apart (created in the book's order: the same init)."""

    def __init__(self, d, n_heads, **bug):
        super().__init__()
        self.attn = MultiHeadAttention(d, d, T, n_heads, **bug)
        self.mlp = FeedForward(d)
        self.ln_1 = LayerNorm(d)
        self.ln_2 = LayerNorm(d)

    def forward(self, x):
        shortcut = x
        x = self.attn(self.ln_1(x))
        x = x + shortcut
        shortcut = x
        x = self.mlp(self.ln_2(x))
        return x + shortcut


class GPTModel(nn.Module):
    """The book's GPTModel (tok_emb, trf_blocks, final_norm, out_head; no dropout here), ALiBi in place of pos_emb."""

    def __init__(self, d=128, n_layers=4, n_heads=4, **bug):
        super().__init__()
        self.tok_emb = nn.Embedding(VOCAB, d)
        self.trf_blocks = nn.Sequential(*[TransformerBlock(d, n_heads, **bug) for _ in range(n_layers)])
        self.final_norm = LayerNorm(d)
        self.out_head = nn.Linear(d, VOCAB, bias=False)

    def forward(self, in_idx):
        x = self.tok_emb(in_idx)
        x = self.trf_blocks(x)
        return self.out_head(self.final_norm(x))


def reset_weights(model):
    """The k-fold tutorials' reset: every submodule's own reset_parameters() (PyTorch's default init)."""
    for m in model.modules():
        if m is not model and hasattr(m, "reset_parameters"):
            m.reset_parameters()


def zero_init_branch_outputs(model):
    """H4/F01: every residual branch's last layer starts at 0 (Fixup / modded-nanogpt's zero-init projections)."""
    with torch.no_grad():
        for blk in model.trf_blocks:
            for lin in (blk.attn.out_proj, blk.mlp.layers[2]):
                lin.weight.zero_()
                lin.bias.zero_()


# ----------------------------------------------------------------------------- HF models

def hf_phi3():
    from transformers import Phi3Config, Phi3ForCausalLM
    cfg = Phi3Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                     original_max_position_embeddings=T, tie_word_embeddings=False, initializer_range=0.02,
                     rms_norm_eps=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, sliding_window=None,
                     bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return Phi3ForCausalLM(cfg)


def hf_starcoder2():
    from transformers import Starcoder2Config, Starcoder2ForCausalLM
    cfg = Starcoder2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T, sliding_window=None,
                           residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0, initializer_range=0.02,
                           tie_word_embeddings=True, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return Starcoder2ForCausalLM(cfg)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- optimizers and schedules

class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), as cybertronai/pytorch-lamb and timm
    write it: Adam's bias-corrected direction r = m / (sqrt(v) + eps) + wd * w, scaled per tensor by the trust ratio
    ||w|| / ||r||, which is 1 when either norm is 0. zero_guard=False is F01's bug (pytorch-lamb before its PR #6):
    the ratio is ||w|| / ||r|| whenever ||r|| > 0, so a tensor that is all zeros gets ratio 0 and never moves."""

    def __init__(self, params, lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01, zero_guard=True):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.zero_guard = zero_guard

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                st["exp_avg"].mul_(b1).add_(p.grad, alpha=1 - b1)
                st["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m = st["exp_avg"] / (1 - b1 ** st["step"])
                v = st["exp_avg_sq"] / (1 - b2 ** st["step"])
                r = m / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    r = r + group["weight_decay"] * p
                w_norm, r_norm = p.norm(), r.norm()
                if self.zero_guard:
                    trust = (w_norm / r_norm).item() if (w_norm > 0 and r_norm > 0) else 1.0
                else:
                    # BUG (F01): only the division by zero is guarded; a tensor that is all zeros gets ratio 0
                    trust = (w_norm / r_norm).item() if r_norm > 0 else 1.0
                p.add_(r, alpha=-group["lr"] * trust)


def warmup_cosine(warmup, total, floor=0.1):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def warmup_linear(warmup, total, floor=0.1):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return 1 - (1 - floor) * p
    return f


def book_param_groups(model, wd):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, forward function, optimizer, lr control and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(kind=spec["model"], clip=None, scheduler=None, step_with_loss=bug == "onecycle_step_loss",
             noise=twin.startswith("H5"), aliased=bug == "noise_labels_aliased",
             reset_every_epoch=bug == "reset_every_epoch", clamp=bug == "param_value_clamp",
             chunk_bug=bug == "chunk_index_as_offset", last_only=bug == "loss_last_position")
    if spec["model"] == "book":
        model = GPTModel(qkv_rand=bug == "qkv_torch_rand")
        reset_weights(model)  # before the epoch loop, as the k-fold tutorials do (F07 calls it again every epoch)
        fwd = model
        if twin.startswith("H4"):
            zero_init_branch_outputs(model)
            optimizer = Lamb(book_param_groups(model, 0.01), lr=1e-2, zero_guard=bug != "lamb_no_zero_guard")
        else:
            optimizer = torch.optim.AdamW(book_param_groups(model, 0.1), lr=1e-3, betas=(0.9, 0.95))
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(WARMUP, steps))
        o["clip"] = 1.0
    elif spec["model"] == "phi3":
        model = hf_phi3()
        fwd = HFWrap(model)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=2e-3, betas=(0.9, 0.95))
        o["scheduler"] = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=steps, pct_start=0.15,
                                                             anneal_strategy="cos", div_factor=25.0,
                                                             final_div_factor=100.0, cycle_momentum=True,
                                                             base_momentum=0.85, max_momentum=0.95)
        o["clip"] = 1.0
    elif spec["model"] == "starcoder2":
        from transformers.optimization import Adafactor
        model = hf_starcoder2()
        fwd = HFWrap(model)
        if bug == "frozen_tied_embedding":
            # BUG (F10): meant to freeze the input embedding only; lm_head.weight is the same Parameter (tied)
            model.model.embed_tokens.weight.requires_grad_(False)
        params = [p for p in model.parameters() if p.requires_grad]
        if bug == "adafactor_scale_parameter":
            # BUG (F04): scale_parameter left at its default (True) with an external lr
            optimizer = Adafactor(params, lr=3e-3, relative_step=False, warmup_init=False)
        else:
            optimizer = Adafactor(params, lr=3e-3, relative_step=False, scale_parameter=False, warmup_init=False)
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(WARMUP, steps))
    else:
        raise ValueError(spec["model"])
    return model, fwd, optimizer, o


def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def split_and_noise(chunk, o, g):
    """Inputs and targets of one (B, T + 1) chunk. H5 (and its twin): 20% of the input bytes replaced by uniformly
    random bytes (data noising / random-token corruption), the targets clean. F02: x and y are views of the same
    chunk (no .clone()), so the in-place noising of x rewrites y too."""
    if o["noise"] and not o["aliased"]:
        x, y = chunk[:, :-1].clone(), chunk[:, 1:]
    else:
        x, y = chunk[:, :-1], chunk[:, 1:]  # BUG (F02) when noising: views of one tensor
    if o["noise"]:
        where = torch.rand(x.shape, generator=g) < NOISE
        repl = torch.randint(VOCAB, (int(where.sum()),), generator=g)
        x[where] = repl  # in place
    return x, y


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
    loader = ByteWindows(stream, B, seed=SEED, chunk_index_as_offset=o["chunk_bug"])
    it = iter(loader)
    g_noise = torch.Generator().manual_seed(SEED + 1)
    if use_watch:
        if o["kind"] == "book":
            # the book's blocks live in an nn.Sequential named trf_blocks, which the Watch does not find by itself
            # (UsageError "cannot find the Transformer blocks of GPTModel: pass blocks="); given by path, as it asks
            watch = Watch(model, folder / "watch.jsonl", every=10, blocks="trf_blocks", optimizer=optimizer,
                          overwrite=True)
        else:
            watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        if o["kind"] == "book" and step % EPOCH == 0 and step > 0 and o["reset_every_epoch"]:
            # BUG (F07): the reset belongs before the epoch loop; here it runs at the start of every epoch
            reset_weights(model)
        chunk = next(it)
        x, y = split_and_noise(chunk, o, g_noise)
        if o["last_only"]:
            # BUG (F06): the classification loss of the book's chapter 6, logits of the last position only
            loss = F.cross_entropy(fwd(x)[:, -1, :], y[:, -1])
        else:
            loss = ce(fwd(x), y)
        loss.backward()
        if use_watch:
            watch.step(loss)
        lval = float(loss)
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if step % 10 == 0:
            vl = evaluate(model, fwd, vb)
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lval, val_loss=vl,
                       lr=optimizer.param_groups[0]["lr"])
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
        if o["clamp"]:
            with torch.no_grad():
                for p in model.parameters():
                    p.data.clamp_(-CLAMP, CLAMP)  # BUG (F08): parameter values clipped, as WGAN clips its critic
        if o["scheduler"] is not None:
            if o["step_with_loss"]:
                o["scheduler"].step(lval)  # BUG (F03): the loss handed to a scheduler whose argument is the step
            else:
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind8"))
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
