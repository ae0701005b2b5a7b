"""Train every run of the fifth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind4/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new bugs and new healthy
variants. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and
<work>/<name>/log.jsonl (step, loss = mean training loss of the last 10 steps, loss_step = this
step's training loss, val_loss = held-out cross-entropy, lr).
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
RESUME_EVERY = 20  # F03: the run is a chain of jobs of 20 steps, each resumed from the previous one's checkpoint
LABEL_SMOOTHING = 0.1  # H4, F09


# ----------------------------------------------------------------------------- data

def corpus_bytes():
    root = Path(json.__file__).parent.parent
    files = [p.read_bytes() for p in sorted(root.glob("*.py"))]
    train = b"".join(files)
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val, files


class TruncatedDocuments:
    """F07: the training set built by tokenizing each file on its own with truncation to the context length
    (`tokenizer(doc, truncation=True, max_length=T + 1)` over a dataset of whole documents) instead of
    concatenating and chunking (run_clm.py's `group_texts`): one window per file, its first T + 1 bytes; the rest
    of every file is dropped. Batches are drawn from these windows with the seeded generator."""

    def __init__(self, files, batch, seed):
        self.rows = torch.stack([to_ids(f[:T + 1]) for f in files if len(f) > T + 1])
        self.batch, self.seed = batch, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.rows), (self.batch,), generator=g)
            chunk = self.rows[ix]
            yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def to_ids(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


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
    def __init__(self, d, n_head):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

    def forward(self, x):
        Bn, Tn, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        k = k.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        v = v.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * hs ** -0.5
        att = att.masked_fill(self.bias[:, :, :Tn, :Tn] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(Bn, Tn, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, n_head, return_skip=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)
        self.drop = nn.Dropout(0.0)
        self.return_skip = return_skip

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        out = x + self.mlp(self.ln_2(x))
        if self.return_skip:
            # BUG (F01): the block returns its skip path, `self.drop(x)`, where it should return
            # `self.drop(out)`: the MLP branch's output never reaches the residual stream
            return self.drop(x)
        return self.drop(out)


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, return_skip=False, head_reads_embeddings=False):
        super().__init__()
        self.head_reads_embeddings = head_reads_embeddings
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            h=nn.ModuleList([Block(d, n_head, return_skip) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(d),
        ))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
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
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        if self.head_reads_embeddings:
            h = x
            for block in self.transformer.h:
                h = block(h)
            # BUG (F04): the head reads x (the embeddings), not h (the last block's output)
            return self.lm_head(self.transformer.ln_f(x))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# ----------------------------------------------------------------------------- HF models

def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=128, n_layer=3, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.02,
                     bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return GPT2LMHeadModel(cfg)


def hf_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                      tie_word_embeddings=False, initializer_range=0.02, rms_norm_eps=1e-5,
                      bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return LlamaForCausalLM(cfg)


def constant_init_linears(model, value):
    """F06: a custom init pass over the model's Linear layers written with nn.init.constant_ (the
    `constant_weight` initialisation of course notebooks) where a random draw was meant. Embeddings and norms
    keep HF's init."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.constant_(m.weight, value)  # BUG (F06): should be nn.init.normal_(m.weight, 0.0, value)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- a hand-written Adam (F08)

class HandAdam(torch.optim.Optimizer):
    """Adam (Kingma & Ba, Algorithm 1) written by hand. no_sqrt=True is F08's bug: the denominator is
    v_hat + eps where it should be sqrt(v_hat) + eps."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, no_sqrt=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.no_sqrt = no_sqrt

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
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = m / (1 - b1 ** t)
                v_hat = v / (1 - b2 ** t)
                if self.no_sqrt:
                    denom = v_hat + group["eps"]  # BUG (F08): should be v_hat.sqrt() + eps
                else:
                    denom = v_hat.sqrt() + group["eps"]
                p.addcdiv_(m_hat, denom, value=-group["lr"])


# ----------------------------------------------------------------------------- one run

def cosine(warmup, total, floor=0.1):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def cosine_warmup_inverted(warmup, total, floor=0.1):
    """F02: H1's schedule with the warm-up term written upside down, warmup / (step + 1) for (step + 1) /
    warmup: the factor is 10 at step 0 and falls to 1 at the end of the warm-up; the cosine after it is H1's."""
    base = cosine(warmup, total, floor)

    def f(step):
        if step < warmup:
            return warmup / (step + 1)  # BUG (F02): should be (step + 1) / warmup
        return base(step)
    return f


def nano_param_groups(model):
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]


def build(name, spec, steps):
    """Model, forward function, optimizer, scheduler and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    opts = dict(accum=1, zero_grad_in_accum=False, loss="ce", plateau=False,
                truncate_documents=bug == "truncated_documents",
                opt_state_fp16_at_resume=bug == "adam_state_fp16_resume")
    if spec["model"] == "nano":
        model = GPT(return_skip=bug == "block_returns_skip", head_reads_embeddings=bug == "head_reads_embeddings")
        fwd = model
        optimizer = torch.optim.AdamW(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
        sched = cosine_warmup_inverted(10, steps) if bug == "warmup_inverted" else cosine(10, steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, sched)
        opts["clip"] = 1.0
        if twin.startswith("H4"):
            opts["loss"] = "smoothed_convE" if bug == "label_smoothing_convE" else "smoothed"
    elif spec["model"] == "gpt2":
        model = hf_gpt2()
        fwd = HFWrap(model)
        opts["clip"] = 1.0
        if twin.startswith("H2"):
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            # ReduceLROnPlateau on the held-out loss, checked every 10 steps. BUG (F05): mode="max", left over
            # from a scheduler that tracked an accuracy: every fall of the loss counts as "no improvement"
            mode = "max" if bug == "plateau_mode_max" else "min"
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode=mode, factor=0.1, patience=2)
            opts["plateau"] = True
        else:  # H5: gradient accumulation, 8 micro-batches of 2, loss / 8
            optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
            opts["accum"] = 8
            opts["zero_grad_in_accum"] = bug == "zero_grad_in_accumulation"
    elif spec["model"] == "llama":
        model = hf_llama()
        if bug == "constant_init":
            constant_init_linears(model, model.config.initializer_range)
        fwd = HFWrap(model)
        if bug == "adam_no_sqrt":
            optimizer = HandAdam(model.parameters(), lr=2e-3, no_sqrt=True)
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
        opts["clip"] = None
    else:
        raise ValueError(spec["model"])
    return model, fwd, optimizer, scheduler, opts


def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


def smoothed_ce(logits, y, eps=LABEL_SMOOTHING, convE=False):
    """H4: cross-entropy against label-smoothed targets, q = (1 - eps) onehot + eps / V (Szegedy et al. 2016),
    written by hand. F09 (convE=True): the smoothing term written 1 / V instead of eps / V (TimDettmers/ConvE#55):
    every class gets 1 / V on top, so the target's mass is 2 - eps and about half of it is uniform."""
    logp = F.log_softmax(logits.float().reshape(-1, VOCAB), dim=-1)
    onehot = F.one_hot(y.reshape(-1), VOCAB).float()
    if convE:
        q = (1.0 - eps) * onehot + (1.0 / VOCAB)  # BUG (F09): should be eps / VOCAB
    else:
        q = (1.0 - eps) * onehot + (eps / VOCAB)
    return -(q * logp).sum(-1).mean()


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def resume_with_fp16_optimizer_state(optimizer):
    """F03: the run is resumed from its checkpoint; the checkpoint writer converts every floating-point tensor of
    the optimizer's state to float16 to halve the file (ultralytics' `convert_optimizer_state_dict_to_fp16`, before
    its fix in ultralytics PR #24085). `load_state_dict` casts the state back to the parameters' float32, but what
    float16 rounded is gone: every exp_avg_sq entry below float16's smallest subnormal (6e-8) is now 0, and the
    small ones keep only a few bits. The weights are saved and restored in float32."""
    sd = optimizer.state_dict()
    for st in sd["state"].values():
        for k, v in st.items():
            if k != "step" and torch.is_tensor(v) and v.is_floating_point():
                st[k] = v.half()
    optimizer.load_state_dict(sd)


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text, files = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, scheduler, o = build(name, spec, steps)
    model.train()
    vb = val_batches(to_ids(val_text))
    if o["truncate_documents"]:
        # BUG (F07): each file tokenized on its own with truncation: only its first T + 1 bytes are trained on
        it = iter(TruncatedDocuments(files, B, seed=SEED))
    else:
        it = iter(ByteWindows(to_ids(train_text), B, seed=SEED))
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        if o["opt_state_fp16_at_resume"] and step > 1 and (step - 1) % RESUME_EVERY == 0:
            resume_with_fp16_optimizer_state(optimizer)
            print(f"  {name}: resumed at step {step} (optimizer state through float16)", flush=True)
        x, y = next(it)
        if o["accum"] > 1:
            # gradient accumulation (H6): the batch of 16 as 8 micro-batches of 2, each loss / 8
            total = torch.zeros(())
            for xm, ym in zip(x.chunk(o["accum"]), y.chunk(o["accum"])):
                if o["zero_grad_in_accum"]:
                    # BUG (F10): zero_grad inside the micro-batch loop: each backward starts from zero, so only
                    # the last micro-batch's gradient reaches optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                loss = ce(fwd(xm), ym) / o["accum"]
                loss.backward()
                total += loss.detach()
        else:
            logits = fwd(x)
            if o["loss"] == "smoothed":
                loss = smoothed_ce(logits, y)
            elif o["loss"] == "smoothed_convE":
                loss = smoothed_ce(logits, y, convE=True)
            else:
                loss = ce(logits, y)
            loss.backward()
            total = loss.detach()
        if use_watch:
            watch.step(total)
        lval = float(total)
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if step % 10 == 0:
            vl = evaluate(model, fwd, vb)
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lval,
                       val_loss=vl, lr=optimizer.param_groups[0]["lr"])
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e} ({time.time() - t0:.0f}s)", flush=True)
            if o["plateau"]:
                scheduler.step(vl)
        if step == steps:
            break
        if step % 10 == 0 and not math.isfinite(lval):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not o["plateau"]:
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind5"))
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
