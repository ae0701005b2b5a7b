"""Train every run of the second blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind/ (byte-level language models on Python's own standard library: the
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
import re
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
EOS = 0  # byte 0 never occurs in the corpus: the packing separator of H5


# ----------------------------------------------------------------------------- data

def corpus_bytes():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val


def to_ids(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


def load_corpus():
    train, val = corpus_bytes()
    return to_ids(train), to_ids(val)


def tokenize_to_file_bytes(ids):
    """What a nanoGPT-style prepare.py writes: the token ids as uint16 (np.uint16 .tofile), little-endian."""
    return ids.to(torch.int16).numpy().astype("<u2").tobytes()


def read_token_file(buf, dtype):
    """What the training script reads back (np.memmap(path, dtype=...))."""
    return torch.frombuffer(bytearray(buf), dtype=dtype).long()


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


class PackedDocs:
    """Sequence packing (H5): the training modules split into documents (top-level def/class/decorator
    chunks), shuffled once, joined with an EOS byte and cut into rows of T+1; each row drawn at
    random. Yields (x, y, doc) where doc numbers the documents inside the row (for a block-diagonal
    causal mask and positions that restart per document; an EOS opens its document); as with
    transformers' DataCollatorWithFlattening, the first prediction of every packed document (the one
    made at its EOS) carries no label (-100)."""

    def __init__(self, raw, batch, seed):
        docs = re.split(rb"\n(?=(?:def |class |@))", raw)
        g = torch.Generator().manual_seed(seed)
        order = torch.randperm(len(docs), generator=g).tolist()
        stream = bytes([EOS]).join(docs[i] for i in order)
        ids = to_ids(stream)
        n = len(ids) // (T + 1)
        self.rows = ids[:n * (T + 1)].view(n, T + 1)
        self.batch, self.seed = batch, seed

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed)
        while True:
            ix = torch.randint(len(self.rows), (self.batch,), generator=g)
            chunk = self.rows[ix]
            x, y = chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()
            doc = torch.cumsum((x == EOS).long(), dim=1)  # an EOS opens the next document
            y = y.masked_fill(x == EOS, -100)  # no label on a document's first prediction
            yield x, y, doc


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- nanoGPT-style model

class RMSNorm(nn.Module):
    """x-transformers-style RMSNorm: F.normalize (unit L2 norm) times sqrt(d) times a gain."""

    def __init__(self, d, sqrt_d=True):
        super().__init__()
        self.scale = d ** 0.5 if sqrt_d else 1.0  # F08: the sqrt(d) forgotten
        self.g = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.normalize(x, dim=-1) * self.scale * self.g


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head, scale_bug=False, nograd_scores=False):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        hs = d // n_head
        self.scale = hs ** -0.5
        self.scale_bug = scale_bug
        self.nograd_scores = nograd_scores
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

    def _scores(self, q, k, mask):
        if self.scale_bug:
            att = (q @ k.transpose(-2, -1)) / self.scale  # BUG (F06): divides by hs**-0.5, i.e. multiplies by sqrt(hs)
        else:
            att = (q @ k.transpose(-2, -1)) * self.scale
        return att.masked_fill(~mask, float("-inf"))

    @torch.no_grad()
    def _scores_nograd(self, q, k, mask):  # BUG (F07): a no_grad decorator on a helper of the forward
        return self._scores(q, k, mask)

    def forward(self, x, doc=None):
        Bn, Tn, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        k = k.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        v = v.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        mask = self.bias[:, :, :Tn, :Tn] != 0
        if doc is not None:  # H5: block-diagonal causal mask over the packed documents
            mask = mask & (doc[:, None, :, None] == doc[:, None, None, :])
        att = self._scores_nograd(q, k, mask) if self.nograd_scores else self._scores(q, k, mask)
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(Bn, Tn, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, d, nograd_hidden=False):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)
        self.nograd_hidden = nograd_hidden

    def _hidden(self, x):
        return self.gelu(self.c_fc(x))

    @torch.no_grad()
    def _hidden_nograd(self, x):  # BUG (F07): a no_grad decorator on a helper of the forward
        return self._hidden(x)

    def forward(self, x):
        h = self._hidden_nograd(x) if self.nograd_hidden else self._hidden(x)
        return self.c_proj(h)


class Block(nn.Module):
    def __init__(self, d, n_head, norm, scale_bug, nograd_scores, nograd_hidden=False):
        super().__init__()
        self.ln_1 = norm(d)
        self.attn = CausalSelfAttention(d, n_head, scale_bug, nograd_scores)
        self.ln_2 = norm(d)
        self.mlp = MLP(d, nograd_hidden)

    def forward(self, x, doc=None):
        x = x + self.attn(self.ln_1(x), doc)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, norm=nn.LayerNorm, scale_bug=False, nograd_scores=False,
                 nograd_hidden=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            h=nn.ModuleList([Block(d, n_head, norm, scale_bug, nograd_scores, nograd_hidden) for _ in range(n_layer)]),
            ln_f=norm(d),
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

    def forward(self, idx, doc=None):
        t = idx.shape[1]
        if doc is None:
            pos = torch.arange(t, device=idx.device)
        else:  # positions restart at every packed document
            ar = torch.arange(t, device=idx.device).expand_as(doc)
            start = torch.zeros_like(doc)
            start[:, 1:] = (doc[:, 1:] != doc[:, :-1]).long()
            first = torch.where(start.bool() | (ar == 0), ar, torch.zeros_like(ar))
            pos = ar - torch.cummax(first, dim=1).values
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x, doc)
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

    def __call__(self, x, doc=None):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- optimizers written by hand

class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms", Algorithm 2):
    update = sign(b1*m + (1-b1)*g); m = b2*m + (1-b2)*g; decoupled weight decay."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                update = (m * b1 + p.grad * (1 - b1)).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


class EMA:
    """An exponential moving average of the weights, diffusers-EMAModel style: store / copy_to / restore
    swap the averaged weights into the live model for evaluation only."""

    def __init__(self, model, decay):
        self.decay = decay
        self.shadow = [p.detach().clone() for p in model.parameters()]
        self.backup = None

    @torch.no_grad()
    def update(self, model):
        for s, p in zip(self.shadow, model.parameters()):
            s.lerp_(p.detach(), 1 - self.decay)

    @torch.no_grad()
    def copy_to(self, model):
        self.backup = [p.detach().clone() for p in model.parameters()]
        for s, p in zip(self.shadow, model.parameters()):
            p.copy_(s)

    @torch.no_grad()
    def restore(self, model):
        for b, p in zip(self.backup, model.parameters()):
            p.copy_(b)
        self.backup = None


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
    torch.manual_seed(SEED)
    opts = dict(batch=B, clip=None, clip_value=None, loss="ce", zloss=0.0, packed=False, uint8_read=False,
                step_every=None, ema=None, chunked=None)
    if spec["model"] == "nano":
        kw = {}
        if name.startswith("H4") or bug == "rmsnorm_no_sqrt_d":
            kw["norm"] = lambda d: RMSNorm(d, sqrt_d=bug != "rmsnorm_no_sqrt_d")
        if bug == "attn_scale_multiplied":
            kw["scale_bug"] = True
        if bug == "nograd_scores":
            kw["nograd_scores"] = True
        if bug == "nograd_mlp_hidden":
            kw["nograd_hidden"] = True
        model = GPT(**kw)
        fwd = model
        if bug == "adam_l2_decay":  # BUG (F03): torch.optim.Adam's weight_decay is an L2 term added to the gradient
            optimizer = torch.optim.Adam(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
        else:
            optimizer = torch.optim.AdamW(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
        opts["clip"] = 1.0
        if name.startswith("H4") or bug == "rmsnorm_no_sqrt_d":
            opts["zloss"] = 1e-4  # PaLM's auxiliary z-loss
        if name.startswith("H5"):
            opts["packed"] = True
    elif spec["model"] == "gpt2":
        model = hf_gpt2()
        fwd = HFWrap(model)
        if name.startswith("H7"):
            # muP-style per-layer learning rates (Yang et al. 2022, Table 3 for Adam): hidden matrices get
            # lr * base_width / width, embeddings and vectors the base lr
            base_lr, width, base_width = 2e-3, 128, 32
            hidden = [p for n, p in model.named_parameters() if p.dim() == 2 and ".h." in n]
            rest = [p for n, p in model.named_parameters() if not (p.dim() == 2 and ".h." in n)]
            optimizer = torch.optim.Adam([{"params": hidden, "lr": base_lr * base_width / width},
                                          {"params": rest, "lr": base_lr}])
            opts["clip_value"] = 0.05
            opts["chunked"] = 32
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        scheduler = None
        if bug == "uint16_read_as_uint8":
            opts["uint8_read"] = True
    elif spec["model"] == "llama":
        model = hf_llama()
        if bug == "init_norm_weights":
            # a BERT-style custom init (huggingface/transformers#143): the norm branch draws the gains
            # from N(0, initializer_range) instead of setting them to 1
            from transformers.models.llama.modeling_llama import LlamaRMSNorm
            for m in model.modules():
                if isinstance(m, LlamaRMSNorm):
                    m.weight.data.normal_(mean=0.0, std=model.config.initializer_range)  # BUG (F05)
        fwd = HFWrap(model)
        if name.startswith("H6"):
            optimizer = Lion(model.parameters(), lr=5e-4, betas=(0.9, 0.99), weight_decay=0.3)
            opts["ema"] = 0.95
        else:
            optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
        if bug == "nll_on_logits":
            opts["loss"] = "nll_on_logits"
        if bug == "step_outside_batch_loop":
            opts["step_every"] = 16
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


def chunked_step(model, x, y, chunk):
    """H7: the LM head and the cross-entropy in chunks of `chunk` positions, each chunk's logits freed
    after its own backward; the gradient collected on a detached copy of the final hidden state and sent
    through the trunk once (the memory-saving "chunked loss" of e.g. Liger's fused linear cross-entropy)."""
    h = model.transformer(input_ids=x).last_hidden_state
    hd = h.detach().requires_grad_(True)
    n = y.numel()
    total = 0.0
    for s in range(0, x.shape[1], chunk):
        logits = model.lm_head(hd[:, s:s + chunk])
        part = F.cross_entropy(logits.float().reshape(-1, VOCAB), y[:, s:s + chunk].reshape(-1), reduction="sum") / n
        part.backward()
        total = total + part.detach()
    h.backward(hd.grad)
    return total


def train_one(name, spec, steps, work, data, use_watch=True):
    train, val = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, scheduler, o = build(name, spec, steps)
    model.train()
    vb = val_batches(val)
    if o["packed"]:
        loader = PackedDocs(corpus_bytes()[0], o["batch"], seed=SEED)
    elif o["uint8_read"]:
        # BUG (F01): the tokens were written as uint16, the training script memory-maps them as uint8:
        # every id becomes (low byte, high byte = 0), the stream twice as long, a 0 after every byte
        loader = ByteWindows(read_token_file(tokenize_to_file_bytes(train), torch.uint8), o["batch"], seed=SEED)
    else:
        loader = ByteWindows(read_token_file(tokenize_to_file_bytes(train), torch.int16), o["batch"], seed=SEED)
    it = iter(loader)
    ema = EMA(model, o["ema"]) if o["ema"] else None
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        batch = next(it)
        x, y = batch[0], batch[1]
        doc = batch[2] if len(batch) > 2 else None
        if o["chunked"]:
            total = chunked_step(model, x, y, o["chunked"])
        else:
            logits = fwd(x, doc) if doc is not None else fwd(x)
            if o["loss"] == "nll_on_logits":  # BUG (F02): nll_loss expects log-probabilities
                loss = F.nll_loss(logits.float().reshape(-1, VOCAB), y.reshape(-1))
            else:
                loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))
            if o["zloss"]:  # PaLM: z_loss = 1e-4 * log(Z)^2, keeps the softmax normaliser near 1
                lz = torch.logsumexp(logits.float(), dim=-1)
                if doc is not None:
                    lz = lz[y != -100]
                loss = loss + o["zloss"] * (lz ** 2).mean()
            loss.backward()
            total = loss.detach()
        if use_watch:
            watch.step(total)
        lval = float(total)
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if o["clip_value"] is not None:
            torch.nn.utils.clip_grad_value_(model.parameters(), o["clip_value"])
        if step % 10 == 0:
            if ema is not None:  # held-out loss of the averaged weights
                ema.copy_to(model)
                vl = evaluate(model, fwd, vb)
                ema.restore(model)
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
        if o["step_every"] is None or (step + 1) % o["step_every"] == 0:
            # BUG (F04, step_every=16): `optimizer.step()` dedented out of the batch loop of an epoch of 16
            # batches: one update per epoch, from the last batch's gradient (zero_grad stays per batch)
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if ema is not None:
            ema.update(model)
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind2"))
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
