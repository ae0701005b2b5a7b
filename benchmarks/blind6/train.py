"""Train every run of the sixth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind5/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new bugs and new healthy
variants. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and
<work>/<name>/log.jsonl (step, loss = mean training loss of the last 10 steps, loss_step = this
step's training loss, val_loss = held-out cross-entropy, lr).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import shutil
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
B = 16  # batch size (sequences)
STEPS = 160
SEED = 1337
JOB = 20  # F06: the run is a chain of jobs of 20 steps, each resumed from the newest checkpoint
VOCAB_RESUME_AT = 81  # F02: the job that resumes at step 81 rebuilds the vocabulary
DROPOUT = 0.1  # H5, F09
QBITS = 8  # H4, F01: fake-quantised weights, symmetric per-tensor int8
KD_TEMPERATURE = 2.0  # F08: a distillation config's temperature, applied to the hard-label loss


# ----------------------------------------------------------------------------- data

def corpus_bytes():
    root = Path(json.__file__).parent.parent
    files = [p.read_bytes() for p in sorted(root.glob("*.py"))]
    train = b"".join(files)
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val, files


def to_ids(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


def write_token_file(train_text, path):
    """The training bytes as a token file, the way nanoGPT's prepare.py writes one: np.memmap(mode="w+",
    shape=(n,)), uint16."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(len(train_text),))
    arr[:] = np.frombuffer(train_text, dtype=np.uint8)
    arr.flush()
    del arr


def read_token_file(path, n, writer_mode=False):
    """The training loader's read of the token file: np.memmap(path, dtype=np.uint16, mode="r") as in
    nanoGPT's train.py. writer_mode=True is F10's bug: the reader copied from prepare.py's writer line,
    np.memmap(path, dtype=np.uint16, mode="w+", shape=(n,)): "w+" creates or overwrites the file, so the
    data read back are n zeros (and the file on disk is zeroed)."""
    if writer_mode:
        arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(n,))  # BUG (F10): should be mode="r"
    else:
        arr = np.memmap(path, dtype=np.uint16, mode="r")
    return torch.from_numpy(np.array(arr, dtype=np.int64))


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


def rebuilt_vocabulary(train_text):
    """F02: the vocabulary a job builds when it does not find the saved one (nanoGPT's shakespeare_char
    prepare.py: chars = sorted(list(set(data))); stoi = {ch: i for i, ch in enumerate(chars)}): the bytes
    present in the corpus, numbered in order, so byte b gets the id of its rank (162 distinct bytes here), not b.
    Returned as a 256-entry lookup table (byte -> id)."""
    chars = sorted(set(train_text))
    table = torch.zeros(256, dtype=torch.long)
    for i, c in enumerate(chars):
        table[c] = i
    return table


# ----------------------------------------------------------------------------- nanoGPT-style model

def fake_quant(w, bits=QBITS):
    """Symmetric per-tensor fake quantisation: round(w / s) * s with s = max|w| / (2^(bits-1) - 1)."""
    qmax = 2 ** (bits - 1) - 1
    s = w.abs().max().clamp(min=1e-8) / qmax
    return torch.clamp(torch.round(w / s), -qmax, qmax) * s


class QLinear(nn.Linear):
    """nn.Linear whose forward uses fake-quantised weights (quantisation-aware training, H4/F01).
    ste=True (H4): w + (q(w) - w).detach(), the straight-through estimator, so the latent float weights get the
    gradient of the quantised ones. ste=False is F01's bug: q(w) used as it is; torch.round has zero gradient
    almost everywhere, so the weights get no gradient (except through the scale s, i.e. the largest entry)."""

    def __init__(self, *a, quant=None, **k):
        super().__init__(*a, **k)
        self.quant = quant  # None | "ste" | "no_ste"

    def forward(self, x):
        w = self.weight
        if self.quant == "ste":
            w = w + (fake_quant(w) - w).detach()
        elif self.quant == "no_ste":
            w = fake_quant(w)  # BUG (F01): should be w + (fake_quant(w) - w).detach()
        return F.linear(x, w, self.bias)


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head, quant=None):
        super().__init__()
        self.c_attn = QLinear(d, 3 * d, quant=quant)
        self.c_proj = QLinear(d, d, quant=quant)
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
    def __init__(self, d, quant=None):
        super().__init__()
        self.c_fc = QLinear(d, 4 * d, quant=quant)
        self.gelu = nn.GELU()
        self.c_proj = QLinear(4 * d, d, quant=quant)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, n_head, dropout=0.0, quant=None, drop_stream=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, quant)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, quant)
        self.drop = nn.Dropout(dropout)
        self.drop_stream = drop_stream

    def forward(self, x):
        if self.drop_stream:
            # BUG (F09): dropout applied to the residual sum (the whole stream), not to the sub-layer's output
            # before it is added: should be x = x + self.drop(self.attn(self.ln_1(x))), and the same for the MLP
            x = self.drop(x + self.attn(self.ln_1(x)))
            x = self.drop(x + self.mlp(self.ln_2(x)))
            return x
        x = x + self.drop(self.attn(self.ln_1(x)))
        x = x + self.drop(self.mlp(self.ln_2(x)))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, dropout=0.0, quant=None, drop_stream=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            drop=nn.Dropout(dropout),
            h=nn.ModuleList([Block(d, n_head, dropout, quant, drop_stream) for _ in range(n_layer)]),
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
        x = self.transformer.drop(x)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# ----------------------------------------------------------------------------- HF models

def hf_gpt2(n_inner=None):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=T, n_embd=128, n_layer=3, n_head=4, n_inner=n_inner,
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


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- a hand-written SGD (F07)

class HandSGD(torch.optim.Optimizer):
    """SGD with (Nesterov) momentum written by hand, the rule of torch.optim.SGD: the first buf = g, then
    buf = momentum * buf + (1 - dampening) * g; the Nesterov step is g + momentum * buf. With dampening 0 it is
    torch.optim.SGD(momentum=0.9, nesterov=True) exactly. F07's bug is dampening = momentum = 0.9 (Torch7's
    optim.sgd default, PyTorch's default before pytorch/pytorch#6, MLX's fixed 1 - momentum before ml-explore/mlx
    PR #87): the buffer becomes an average of the gradients instead of their sum, the steps ~5x smaller."""

    def __init__(self, params, lr=0.1, momentum=0.9, dampening=0.0, nesterov=True):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, nesterov=nesterov))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            mu, damp = group["momentum"], group["dampening"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if "momentum_buffer" not in st:
                    buf = st["momentum_buffer"] = torch.clone(g).detach()
                else:
                    buf = st["momentum_buffer"]
                    buf.mul_(mu).add_(g, alpha=1 - damp)
                d = g.add(buf, alpha=mu) if group["nesterov"] else buf
                p.add_(d, alpha=-group["lr"])


# ----------------------------------------------------------------------------- one run

def cosine(warmup, total, floor=0.1):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
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
    opts = dict(loss="ce", clip=None, vocab_rebuilt=bug == "vocab_rebuilt_at_resume",
                lexicographic_resume=bug == "resume_lexicographic_checkpoint",
                memmap_writer_mode=bug == "memmap_w_plus")
    if spec["model"] == "nano":
        kw = {}
        if twin.startswith("H4"):
            kw["quant"] = "no_ste" if bug == "qat_no_ste" else "ste"
        if twin.startswith("H5"):
            kw["dropout"] = DROPOUT
            kw["drop_stream"] = bug == "dropout_on_stream"
        if bug == "temperature_in_hard_loss":
            opts["loss"] = "ce_temperature"
        model = GPT(**kw)
        fwd = model
        optimizer = torch.optim.AdamW(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
        opts["clip"] = 1.0
    elif spec["model"] == "gpt2":
        # BUG (F03): n_inner=4 (the "4x" MLP ratio) where GPT2Config takes the inner dimension (None -> 4 * n_embd)
        model = hf_gpt2(n_inner=4 if bug == "n_inner_ratio" else None)
        fwd = HFWrap(model)
        if bug == "sgd_dampening":
            # BUG (F07): dampening=0.9 (= momentum); torch.optim.SGD refuses dampening with nesterov, a
            # hand-written SGD does not
            optimizer = HandSGD(model.parameters(), lr=0.3, momentum=0.9, dampening=0.9, nesterov=True)
        else:
            optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, nesterov=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
        opts["clip"] = 1.0
    elif spec["model"] == "llama":
        model = hf_llama()
        fwd = HFWrap(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        decay = lambda s: max(0.0, 1 - s / steps)  # noqa: E731
        if bug == "multiplicative_lr":
            # BUG (F05): MultiplicativeLR (lr <- lr * f(step), every step) given the lambda written for LambdaLR
            # (lr = initial lr * f(step)): the factors compound
            scheduler = torch.optim.lr_scheduler.MultiplicativeLR(optimizer, decay)
        else:
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, decay)
        if bug == "bce_onehot":
            opts["loss"] = "bce"
    else:
        raise ValueError(spec["model"])
    return model, fwd, optimizer, scheduler, opts


def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


def ce_temperature(logits, y, temperature=KD_TEMPERATURE):
    """F08: the hard-label cross-entropy computed on logits / T with the distillation temperature T = 2 (the
    student's loss code shared with the soft-target term, or a `temperature` left in the config); Hinton, Vinyals &
    Dean 2015 compute the loss on the correct labels at temperature 1. Evaluation and generation use the logits as
    they are."""
    return ce(logits / temperature, y)  # BUG (F08): should be ce(logits, y)


def bce_onehot(logits, y):
    """F04: the multi-label loss on one-hot targets, F.binary_cross_entropy_with_logits(logits,
    one_hot(y)): 256 independent sigmoids per position instead of one softmax over the 256 bytes."""
    z = logits.float().reshape(-1, VOCAB)
    return F.binary_cross_entropy_with_logits(z, F.one_hot(y.reshape(-1), VOCAB).float())


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text, files = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, scheduler, o = build(name, spec, steps)
    model.train()
    vb = val_batches(to_ids(val_text))
    shared = work / "_data" / "train.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(train_text):
        write_token_file(train_text, shared)
    if o["memmap_writer_mode"]:
        local = folder / "train.bin"  # this job's copy of the token file (the bug overwrites it)
        shutil.copyfile(shared, local)
        train_ids = read_token_file(local, len(train_text), writer_mode=True)
    else:
        train_ids = read_token_file(shared, len(train_text))
    it = iter(ByteWindows(train_ids, B, seed=SEED))
    table = rebuilt_vocabulary(train_text) if o["vocab_rebuilt"] else None
    ckpts = {}  # F06: name -> (model state, optimizer state), as a job writes them to disk
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        if o["lexicographic_resume"] and step > 1 and (step - 1) % JOB == 0:
            # the job ends after step - 1 and writes ckpt_<step - 1>.pt; the next job resumes from the newest one,
            # found as sorted(glob("ckpt_*.pt"))[-1]. BUG (F06): a string sort: "ckpt_100" < "ckpt_20" < "ckpt_80",
            # so from step 101 on every job resumes from ckpt_80 (should sort by the step number)
            ckpts[f"ckpt_{step - 1}.pt"] = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
            newest = sorted(ckpts)[-1]
            msd, osd = ckpts[newest]
            model.load_state_dict(msd)
            optimizer.load_state_dict(osd)
            print(f"  {name}: job resumes at step {step} from {newest}", flush=True)
        x, y = next(it)
        if table is not None and step >= VOCAB_RESUME_AT:
            # BUG (F02): the job resumed at step 81 did not find the saved vocabulary (meta.pkl) and rebuilt it from
            # the text: from here on every byte (inputs, targets and the held-out text) gets another id
            x, y = table[x], table[y]
        logits = fwd(x)
        if o["loss"] == "bce":
            loss = bce_onehot(logits, y)
        elif o["loss"] == "ce_temperature":
            loss = ce_temperature(logits, y)
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
            if table is not None and step >= VOCAB_RESUME_AT:
                vl = evaluate(model, fwd, [(table[a], table[b]) for a, b in vb])
            else:
                vl = evaluate(model, fwd, vb)
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lval,
                       val_loss=vl, lr=optimizer.param_groups[0]["lr"])
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e} ({time.time() - t0:.0f}s)", flush=True)
        if step == steps:
            break
        if step % 10 == 0 and not math.isfinite(lval):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind6"))
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
