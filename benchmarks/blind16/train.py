"""Train every run of the sixteenth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind15/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF DeepSeek-V2 with its
Multi-head Latent Attention, dense, built from a config; a hand-written GPT in the style of
rasbt/LLMs-from-scratch), new recipes (AMSGrad; Sophia-G written out; a sequence-length warm-up; Vaswani et al.'s
sinusoidal / sqrt(d)-scaled / tied input side with the Noam schedule; Primer's squared ReLU and depthwise
convolutions) and new bugs. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and
<work>/<name>/log.jsonl (step, loss = mean training cross-entropy of the last 10 steps on the targets the loop
trains, loss_step, val_loss = held-out cross-entropy of the training model, lr of the first parameter group).
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
FLOOR = 0.1  # cosine schedules end at 10% of the peak
LR = 2e-3
# H2: Sophia-G (Liu et al. 2023; Liuhong99/Sophia): betas (0.965, 0.99), rho 0.04, Hessian every k = 10 steps
SOPHIA_LR, SOPHIA_RHO, SOPHIA_K = 1e-3, 0.04, 10
# H3: sequence-length warm-up (Li et al. 2022): from 16 bytes to T over the first 60 steps
SEQ_START, SEQ_STEPS = 16, 60
# H4: Noam schedule (Vaswani et al. 2017, eq. 3), with the Annotated Transformer's factor
NOAM_FACTOR, NOAM_WARMUP = 0.1, 16
# F04: the byte that plays the end-of-document token (the newline); F10: the pad byte (a space, the char-level habit)
EOS_ID = 10
PAD_ID = 32


# ----------------------------------------------------------------------------- data

def training_files():
    root = Path(json.__file__).parent.parent
    return sorted(root.glob("*.py"))


def corpus_bytes():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in training_files())
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val


def corpus_bytes_repr():
    """F02's bug: the files read in binary mode and joined as strings with str(): every file's repr, b'...'."""
    # BUG (F02): str(bytes) is the bytes' repr (b'...' with \n, \t, \\ and \' escapes), not its text;
    # bytes.decode() was meant
    text = "".join(str(p.read_bytes()) for p in training_files())
    return text.encode("utf-8")


def to_ids(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


def write_token_file(text, path):
    """The training bytes as a token file, the way nanoGPT's prepare.py writes one (uint16)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    arr = np.memmap(path, dtype=np.uint16, mode="w+", shape=(len(text),))
    arr[:] = np.frombuffer(text, dtype=np.uint8)
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


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- HF DeepSeek-V2 (MLA, dense)

def hf_dsv2():
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
    cfg = DeepseekV2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=64,
                           qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32,
                           first_k_dense_replace=3,  # every layer dense: no experts
                           n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                           max_position_embeddings=T, tie_word_embeddings=False, initializer_range=0.02,
                           attention_dropout=0.0, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    cfg._attn_implementation = "sdpa"
    return DeepseekV2ForCausalLM(cfg)


# ----------------------------------------------------------------------------- the hand-written GPT
# In the style of rasbt/LLMs-from-scratch, ch. 4 (GPTModel, TransformerBlock, MultiHeadAttention, LayerNorm,
# FeedForward): its own attention computing softmax(QK^T / sqrt(d_head)) with a triu mask buffer.

class LayerNorm(nn.Module):
    def __init__(self, emb_dim, gain_zero=False):
        super().__init__()
        self.eps = 1e-5
        # BUG (F05) when gain_zero: Gemma's RMSNorm stores its gain as w with output * (1 + w), so w starts at 0;
        # here the gain is initialised to 0 the Gemma way but used the Llama way, scale * norm_x
        self.scale = nn.Parameter(torch.zeros(emb_dim) if gain_zero else torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class CausalDepthwiseConv(nn.Module):
    """Primer's depthwise convolution over the sequence, per channel, width 3, causal (left padding)."""

    def __init__(self, dim, width=3):
        super().__init__()
        self.width = width
        self.conv = nn.Conv1d(dim, dim, width, groups=dim, bias=True)
        with torch.no_grad():  # start as the identity (the current position's value)
            self.conv.weight.zero_()
            self.conv.weight[:, 0, -1] = 1.0
            self.conv.bias.zero_()

    def forward(self, x):  # (b, t, dim)
        y = F.pad(x.transpose(1, 2), (self.width - 1, 0))
        return self.conv(y).transpose(1, 2)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, num_heads, dconv=False):
        super().__init__()
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=False)
        self.W_key = nn.Linear(d_in, d_out, bias=False)
        self.W_value = nn.Linear(d_in, d_out, bias=False)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dconv = nn.ModuleList([CausalDepthwiseConv(d_out) for _ in range(3)]) if dconv else None
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, _ = x.shape
        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)
        if self.dconv is not None:
            q, k, v = self.dconv[0](q), self.dconv[1](k), self.dconv[2](v)
        q = q.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
        attn_scores = q @ k.transpose(2, 3)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)
        attn_weights = torch.softmax(attn_scores / self.head_dim ** 0.5, dim=-1)
        ctx = (attn_weights @ v).transpose(1, 2).contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(ctx)


class FeedForward(nn.Module):
    def __init__(self, emb_dim, act="gelu"):
        super().__init__()
        self.fc1 = nn.Linear(emb_dim, 4 * emb_dim)
        self.fc2 = nn.Linear(4 * emb_dim, emb_dim)
        self.act = act

    def forward(self, x):
        h = self.fc1(x)
        h = F.gelu(h, approximate="tanh") if self.act == "gelu" else torch.relu(h).square()  # Primer: ReLU^2
        return self.fc2(h)


class TransformerBlock(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.att = MultiHeadAttention(cfg["emb_dim"], cfg["emb_dim"], cfg["context_length"], cfg["n_heads"],
                                      dconv=cfg["dconv"])
        self.ff = FeedForward(cfg["emb_dim"], cfg["act"])
        self.norm1 = LayerNorm(cfg["emb_dim"], cfg["gain_zero"])
        self.norm2 = LayerNorm(cfg["emb_dim"], cfg["gain_zero"])

    def forward(self, x):
        shortcut = x
        x = self.norm1(x)
        x = self.att(x)
        x = x + shortcut
        shortcut = x
        x = self.norm2(x)
        x = self.ff(x)
        x = x + shortcut
        return x


def sinusoidal_table(n, d):
    pos = torch.arange(n, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class GPTModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg["emb_dim"]
        self.tok_emb = nn.Embedding(cfg["vocab_size"], d)
        if cfg["pos"] == "learned":
            self.pos_emb = nn.Embedding(cfg["context_length"], d)
        else:
            self.register_buffer("pos_table", sinusoidal_table(cfg["context_length"], d))
        self.trf_blocks = nn.Sequential(*[TransformerBlock(cfg) for _ in range(cfg["n_layers"])])
        self.final_norm = LayerNorm(d, cfg["gain_zero"])
        self.out_head = nn.Linear(d, cfg["vocab_size"], bias=False)
        self.nograd_lower = cfg.get("nograd_lower", False)
        for m in self.modules():  # GPT-2's init: N(0, 0.02) for every Linear, zero biases
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        if cfg["pos"] == "learned":
            nn.init.normal_(self.pos_emb.weight, 0.0, 0.02)
        if cfg["emb_init"] == "fairseq":
            nn.init.normal_(self.tok_emb.weight, 0.0, d ** -0.5)  # fairseq's Embedding(): N(0, d^-1/2)
        elif cfg["emb_init"] == "gpt2":
            nn.init.normal_(self.tok_emb.weight, 0.0, 0.02)
        # emb_init == "default": nn.Embedding's own N(0, 1) (F07's bug, see build())
        if cfg["tied"]:
            self.out_head.weight = self.tok_emb.weight

    def embed(self, idx):
        n = idx.shape[1]
        x = self.tok_emb(idx)
        if self.cfg["emb_scale"]:
            x = x * math.sqrt(self.cfg["emb_dim"])
        if self.cfg["pos"] == "learned":
            x = x + self.pos_emb(torch.arange(n, device=idx.device))
        else:
            x = x + self.pos_table[:n]
        return x

    def forward(self, idx):
        if self.nograd_lower:
            # BUG (F09): the embedding and every block but the last run without autograd "to save memory" (a
            # misreading of activation checkpointing): nothing below the last block gets a gradient
            with torch.no_grad():
                x = self.embed(idx)
                for blk in self.trf_blocks[:-1]:
                    x = blk(x)
            x = self.trf_blocks[-1](x)
        else:
            x = self.embed(idx)
            x = self.trf_blocks(x)
        x = self.final_norm(x)
        return self.out_head(x)


def scratch_gpt(**kw):
    cfg = dict(vocab_size=VOCAB, context_length=T, emb_dim=128, n_heads=4, n_layers=3, pos="learned",
               act="gelu", dconv=False, gain_zero=False, emb_init="gpt2", emb_scale=False, tied=False)
    cfg.update(kw)
    return GPTModel(cfg)


# ----------------------------------------------------------------------------- optimizers

class SophiaG(torch.optim.Optimizer):
    """Sophia-G as Liuhong99/Sophia's sophia.py writes it: m = beta1 m + (1 - beta1) g; decoupled decay;
    ratio = (|m| / (rho * bs * h + 1e-15)).clamp(None, 1); p -= lr * sign(m) * ratio. update_hessian() folds the
    squared gradient of a loss on labels sampled from the model's output into h (EMA beta2).
    clamp_min is F03's bug: the clip written ratio.clamp(1)."""

    def __init__(self, params, lr, betas=(0.965, 0.99), rho=0.04, weight_decay=0.1, clamp_min=False):
        super().__init__(params, dict(lr=lr, betas=betas, rho=rho, weight_decay=weight_decay))
        self.clamp_min = clamp_min

    def _state(self, p):
        st = self.state[p]
        if not st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p)
            st["hessian"] = torch.zeros_like(p)
        return st

    @torch.no_grad()
    def update_hessian(self):
        for group in self.param_groups:
            b2 = group["betas"][1]
            for p in group["params"]:
                if p.grad is None:
                    continue
                self._state(p)["hessian"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)

    @torch.no_grad()
    def step(self, closure=None, bs=B * T):
        for group in self.param_groups:
            lr, wd, rho = group["lr"], group["weight_decay"], group["rho"]
            b1 = group["betas"][0]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self._state(p)
                st["step"] += 1
                m, h = st["exp_avg"], st["hessian"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                p.mul_(1 - lr * wd)
                ratio = m.abs() / (rho * bs * h + 1e-15)
                if self.clamp_min:
                    ratio = ratio.clamp(1)  # BUG (F03): clamp's first positional argument is min
                else:
                    ratio = ratio.clamp(None, 1)
                p.addcmul_(m.sign(), ratio, value=-lr)
        return None


def matrix_groups(params, wd):
    params = list(params)
    decay = [p for p in params if p.requires_grad and p.dim() == 2]
    no_decay = [p for p in params if p.requires_grad and p.dim() != 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- schedules

def warmup_cosine_factor(step, total, warmup=WARMUP, floor=FLOOR):
    """min(1, (step + 1) / warmup) times a cosine from 1 to floor over `total` steps."""
    p = min(1.0, step / max(1, total))
    cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / warmup) * cos


def noam_rate(step, d=128, factor=NOAM_FACTOR, warmup=NOAM_WARMUP, exponent_sign_bug=False):
    """The Annotated Transformer's rate(): factor * d^-0.5 * min(s^-0.5, s * warmup^-1.5), s = step + 1."""
    s = step + 1
    if exponent_sign_bug:
        # BUG (F08): s ** 0.5 for s ** -0.5 in the decay branch: the warm-up branch s * warmup^-1.5 stays the
        # smaller one until s = warmup^3, so the warm-up never ends and the lr keeps rising linearly
        return factor * d ** -0.5 * min(s ** 0.5, s * warmup ** -1.5)
    return factor * d ** -0.5 * min(s ** -0.5, s * warmup ** -1.5)


def seq_len_at(step):
    """H3's sequence-length warm-up: 16 bytes at step 0, linearly to T by SEQ_STEPS, multiples of 8."""
    L = SEQ_START + (T - SEQ_START) * min(1.0, step / SEQ_STEPS)
    return int(max(SEQ_START, min(T, 8 * round(L / 8))))


# ----------------------------------------------------------------------------- losses

def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100)


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, optimizer (the object the loop steps), scheduler lambda and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(clip=1.0, hf=False, sophia=False, seqlen=False, bug=bug)
    lam = lambda s: warmup_cosine_factor(s, steps)  # noqa: E731
    if twin.startswith("H1") or twin.startswith("H2"):
        model = hf_dsv2()
        o["hf"] = True
        if twin.startswith("H1"):
            optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95),
                                          amsgrad=True)
            if bug == "lambdalr_absolute_lr":
                # BUG (F01): the lambda returns the learning rate itself; LambdaLR multiplies it by the lr
                # the optimizer was built with (2e-3), so the run trains at 2e-3 x 2e-3 x factor
                lam = lambda s: LR * warmup_cosine_factor(s, steps)  # noqa: E731
        else:
            optimizer = SophiaG(matrix_groups(model.parameters(), 0.1), lr=SOPHIA_LR, rho=SOPHIA_RHO,
                                clamp_min=bug == "sophia_clamp_min")
            o["sophia"] = True
    elif twin.startswith("H3"):
        model = scratch_gpt(gain_zero=bug == "norm_gain_zero")
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95))
        o["seqlen"] = True
    elif twin.startswith("H4"):
        # F07's bug: emb_init "default" keeps nn.Embedding's N(0, 1) while the sqrt(d) scale stays
        model = scratch_gpt(pos="sinusoidal", emb_scale=True, tied=True,
                            emb_init="default" if bug == "embedding_std1_scaled" else "fairseq")
        optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        lam = lambda s: noam_rate(s, exponent_sign_bug=bug == "noam_exponent_sign")  # noqa: E731
    elif twin.startswith("H5"):
        model = scratch_gpt(act="relu2", dconv=True, nograd_lower=bug == "nograd_lower_blocks")
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95))
    else:
        raise ValueError(twin)
    return model, optimizer, lam, o


def newline_document_mask(x):
    """F04's bug: the packing collate's document mask (query i sees key j only when j <= i and both lie in the
    same document), with the document boundary at every end-of-document token, which this byte tokenizer's
    eos_id makes the newline: every line is its own document. A 4D boolean mask (True = attend)."""
    eos = x == EOS_ID
    doc = torch.cumsum(eos.long(), dim=1) - eos.long()  # the newline closes its own line
    t = x.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    return (causal[None] & (doc[:, :, None] == doc[:, None, :]))[:, None]


def forward_logits(model, x, o, bug):
    if o["hf"]:
        if bug == "newline_document_mask":
            # BUG (F04): the document mask's boundary token is eos_id, and eos_id is the newline
            return model(input_ids=x, attention_mask=newline_document_mask(x)).logits
        return model(input_ids=x).logits
    return model(x)


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, optimizer, lam, o = build(name, spec, steps)
    bug = o["bug"]
    model.train()
    vb = val_batches(to_ids(val_text))
    if bug == "bytes_repr_corpus":
        text, shared = corpus_bytes_repr(), work / "_data" / "train_repr.bin"
    else:
        text, shared = train_text, work / "_data" / "train.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(text):
        write_token_file(text, shared)
    stream = read_token_file(shared)
    loader = ByteWindows(stream, B, seed=SEED)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
    clip_params = [p for p in model.parameters() if p.requires_grad]
    sample_g = torch.Generator().manual_seed(SEED + 3)

    def evaluate():
        model.eval()
        with torch.no_grad():
            vls = [ce(forward_logits(model, xv, o, bug), yv).item() for xv, yv in vb]
        model.train()
        return sum(vls) / len(vls)

    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        chunk = next(it)
        if o["seqlen"]:
            chunk = chunk[:, :seq_len_at(step) + 1]
        x, y = chunk[:, :-1], chunk[:, 1:]
        if bug == "space_pad_labels_masked":
            # BUG (F10): the collate pads short windows with spaces (pad_id = ord(" ")) and masks the labels by
            # value, every label equal to pad_id, instead of by position: no space is ever a target
            y = y.masked_fill(y == PAD_ID, -100)
        logits = forward_logits(model, x, o, bug)
        loss = ce(logits, y)
        loss.backward()
        if use_watch:
            watch.step(loss)
        lval = loss.item()
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None:
            torch.nn.utils.clip_grad_norm_(clip_params, o["clip"])
        if step % 10 == 0:
            vl = evaluate()
            rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lval, val_loss=vl,
                       lr=optimizer.param_groups[0]["lr"])
            if o["seqlen"]:
                rec["seq_len"] = x.shape[1]
            log.write(json.dumps(rec) + "\n")
            log.flush()
            print(f"  {name} step {step:4d} loss {rec['loss']:.3f} val {rec['val_loss']:.3f} "
                  f"lr {rec['lr']:.2e} ({time.time() - t0:.0f}s)", flush=True)
        if step == steps:
            break
        if step % 10 == 0 and not (math.isfinite(lval) and math.isfinite(rec["val_loss"])):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        if bug == "zero_grad_before_step":
            # BUG (F06): zero_grad moved up, between the backward (and clipping) and the step: AdamW steps on
            # zero gradients (weight decay only)
            optimizer.zero_grad(set_to_none=False)
            optimizer.step()
        else:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if o["sophia"] and step % SOPHIA_K == SOPHIA_K - 1:
            # Sophia-G's Gauss-Newton-Bartlett estimate (Liuhong99/Sophia train loop): labels sampled from the
            # model's own output distribution, the gradient of their loss squared into the Hessian EMA
            logits_s = forward_logits(model, x, o, bug)
            probs = torch.softmax(logits_s.float().reshape(-1, VOCAB), -1).detach()
            probs = torch.nan_to_num(probs, nan=1.0 / VOCAB).clamp_min(0.0) + 1e-12  # F03's exploded weights
            y_s = torch.multinomial(probs, 1, generator=sample_g).view(-1)
            F.cross_entropy(logits_s.float().reshape(-1, VOCAB), y_s).backward()
            optimizer.update_hessian()
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind16"))
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
