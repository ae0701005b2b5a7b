"""Train every run of the blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

Byte-level (vocabulary 256) language models on Python's own standard library: top-level modules for
training, the email/ package held out. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch
in the loop) and <work>/<name>/log.jsonl (step, loss = mean training loss of the last 10 steps,
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

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

torch.set_num_threads(1)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from runs import RUNS  # noqa: E402

from blocktrace import Watch  # noqa: E402

VOCAB = 256
T = 128  # context length (bytes)
B = 16  # batch size (sequences)
STEPS = 160
SEED = 1337


# ----------------------------------------------------------------------------- data

def load_corpus():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    to = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).long()  # noqa: E731
    return to(train), to(val)


class ByteWindows:
    """An iterable over random (x, y) windows, like a DataLoader: each iter() starts again from its seed."""

    def __init__(self, data, batch, seed):
        self.data, self.batch, self.seed = data, batch, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.data) - T - 1, (self.batch,), generator=g)
            chunk = torch.stack([self.data[i:i + T + 1] for i in ix.tolist()])
            yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- nanoGPT-style model

class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head, dropout, mask_bug=False):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.mask_bug = mask_bug
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

    def forward(self, x):
        Bn, Tn, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        k = k.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        v = v.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        if self.mask_bug:
            att.masked_fill(self.bias[:, :, :Tn, :Tn] == 0, float("-inf"))  # BUG: result discarded
        else:
            att = att.masked_fill(self.bias[:, :, :Tn, :Tn] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = (att @ v).transpose(1, 2).contiguous().view(Bn, Tn, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, d, dropout):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d, n_head, dropout, norm, mask_bug, residual):
        super().__init__()
        self.ln_1 = norm(d)
        self.attn = CausalSelfAttention(d, n_head, dropout, mask_bug)
        self.ln_2 = norm(d)
        self.mlp = MLP(d, dropout)
        self.residual = residual

    def forward(self, x):
        if self.residual:
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
        else:  # BUG (F09): the skip connections lost in a refactor
            x = self.attn(self.ln_1(x))
            x = self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, dropout=0.0, tie=True, norm=nn.LayerNorm,
                 mask_bug=False, residual=True, ckpt=None):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(d, n_head, dropout, norm, mask_bug, residual) for _ in range(n_layer)]),
            ln_f=norm(d),
        ))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        if tie:
            self.transformer.wte.weight = self.lm_head.weight
        self.ckpt = ckpt  # None, or the use_reentrant flag of activation checkpointing
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            if self.ckpt is not None and self.training:
                x = checkpoint(block, x, use_reentrant=self.ckpt)
            else:
                x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# ----------------------------------------------------------------------------- HF models

def hf_gpt2(init_range=0.02):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=128, n_layer=3, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=init_range,
                     bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg)


def hf_llama(init_range=0.02, hidden=128, layers=3, kv_heads=2, ffn=352, tie=False):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=T,
                      tie_word_embeddings=tie, initializer_range=init_range, rms_norm_eps=1e-5,
                      bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- one run

def cosine(warmup, total, floor=0.1):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def build(name, spec, steps):
    """Model, forward function, optimizer, scheduler and loop options of one run."""
    bug = spec["bug"]
    torch.manual_seed(SEED)
    opts = dict(batch=B, accum=1, smoothing=0.0, clip=None, autocast=None, zero_grad=True, same_batch=False,
                softmax_ce=False)
    if spec["model"] == "nano":
        kw = {}
        if name.startswith("H4"):
            kw["dropout"] = 0.1
        if bug == "layernorm_eps1":
            bias = True  # nanoGPT's LayerNorm(ndim, bias) swapped for torch's nn.LayerNorm(ndim, bias):
            kw["norm"] = lambda d: nn.LayerNorm(d, bias)  # BUG: the bias flag lands in eps (= 1.0)
        if bug == "mask_not_assigned":
            kw["mask_bug"] = True
        if bug == "no_residual":
            kw["residual"] = False
        if name.startswith("H5") or bug == "reentrant_ckpt":
            kw["tie"] = False
            kw["ckpt"] = bug == "reentrant_ckpt"  # H5: use_reentrant=False; F12: True
        model = GPT(**kw)
        if "ckpt" in kw:  # fixed random embeddings, frozen on purpose
            model.transformer.wte.weight.requires_grad_(False)
            model.transformer.wpe.weight.requires_grad_(False)
        fwd = model
        decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                       {"params": no_decay, "weight_decay": 0.0}],
                                      lr=1e-3, betas=(0.9, 0.95))
        tokens_per_step = B * T
        warmup_tokens = 10 * tokens_per_step  # a minGPT-style budget in tokens
        warmup_steps = warmup_tokens // tokens_per_step
        if bug == "warmup_tokens":
            warmup_steps = warmup_tokens  # BUG: tokens handed to a per-step schedule
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(warmup_steps, steps))
        opts["clip"] = 1.0
        if name.startswith("H4"):
            opts["accum"], opts["smoothing"] = 2, 0.1
        if bug == "softmax_into_ce":
            opts["softmax_ce"] = True
    elif spec["model"] == "gpt2":
        model = hf_gpt2()
        if bug == "pure_fp16":
            model = model.half()  # BUG: no fp32 master weights, no loss scaling
        fwd = HFWrap(model)
        lr = 3e-2 if bug == "lr_too_high" else 1e-3
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        scheduler = None
        if bug == "same_batch":
            opts["same_batch"] = True
    elif spec["model"] == "llama_small":  # H6
        model = hf_llama(hidden=64, layers=2, kv_heads=4, ffn=176, tie=True)
        fwd = HFWrap(model)
        optimizer = torch.optim.Adagrad(model.parameters(), lr=0.02)
        scheduler = None
        opts.update(autocast=torch.bfloat16, clip=1.0, batch=8)
    elif spec["model"] == "llama":
        model = hf_llama(init_range=1.0 if bug == "init_std1" else 0.02)
        fwd = HFWrap(model)
        eps = 1.0 if bug == "adam_eps1" else 1e-8
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, eps=eps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
        if bug == "no_zero_grad":
            opts["zero_grad"] = False
    else:
        raise ValueError(spec["model"])
    return model, fwd, optimizer, scheduler, opts


def ce(logits, y, smoothing=0.0):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), label_smoothing=smoothing)


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def train_one(name, spec, steps, work, data, use_watch=True):
    train, val = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, scheduler, o = build(name, spec, steps)
    model.train()
    vb = val_batches(val)
    loader = ByteWindows(train, o["batch"] // o["accum"], seed=SEED)
    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        total = 0.0
        for _ in range(o["accum"]):
            if o["same_batch"]:
                x, y = next(iter(loader))  # BUG (F04): a fresh iterator every step
            else:
                x, y = next(it)
            if o["autocast"] is not None:
                with torch.autocast("cpu", dtype=o["autocast"]):
                    logits = fwd(x)
            else:
                logits = fwd(x)
            if o["softmax_ce"]:  # BUG (F03): probabilities where the loss expects logits
                loss = F.cross_entropy(F.softmax(logits, dim=-1).reshape(-1, VOCAB), y.reshape(-1))
            else:
                loss = ce(logits, y, o["smoothing"])
            (loss / o["accum"]).backward()
            total = total + loss.detach() / o["accum"]
        if use_watch:
            watch.step(total)
        lval = float(total)
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if step % 10 == 0:
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lval,
                       val_loss=evaluate(model, fwd, vb), lr=optimizer.param_groups[0]["lr"])
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e} ({time.time() - t0:.0f}s)", flush=True)
        if step == steps:
            break
        if step % 10 == 0 and not math.isfinite(lval):
            # the loop's guard (like Lightning's terminate_on_nan): stop at a logged non-finite loss
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        optimizer.step()
        if o["zero_grad"]:
            optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind"))
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
    data = load_corpus()
    print(f"corpus: {len(data[0])} training bytes, {len(data[1])} held-out bytes", flush=True)
    for n in names:
        print(f"[{n}] {RUNS[n]['what']}", flush=True)
        s = train_one(n, RUNS[n], a.steps, work, data, use_watch=not a.no_watch)
        print(f"[{n}] done in {s:.0f}s", flush=True)


if __name__ == "__main__":
    main()
