"""Train every run of the seventh blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind6/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF Qwen2 and GPT-NeoX), new
optimizers and loops (Muon, a warm-up wrapper, gradient accumulation with a nanochat-style lr multiplier,
PyTorch's AMP loop with loss scaling, a fused cross-entropy autograd Function, gradual magnitude pruning) and
new bugs. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and <work>/<name>/log.jsonl
(step, loss = mean training loss of the last 10 steps, loss_step = this step's training loss, val_loss =
held-out cross-entropy, lr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import types
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
MICRO = 2  # nano runs: the batch is processed as MICRO micro-batches of B // MICRO, the loss of each divided by MICRO
STEPS = 160
SEED = 1337
WARMUP = 10
SOFTCAP = 30.0  # H5: Gemma 2's final_logit_softcapping
LOSS_SCALE = 2.0 ** 16  # H5: GradScaler's default init_scale
GMP_FINAL, GMP_START, GMP_EVERY, GMP_N = 0.8, 10, 10, 8  # H4: pruning at steps 10, 20, ..., 90 to 80%
MUON_LR, AUX_LR = 0.02, 1e-2  # H2: Muon's lr (hidden matrices) and the auxiliary Adam's (embedding, head, gains)


# ----------------------------------------------------------------------------- data

def corpus_bytes(as_str=False):
    root = Path(json.__file__).parent.parent
    if as_str:
        # BUG (F10): each file's bytes turned into text with str(), which gives their repr "b'...'" (escape sequences
        # for newlines, tabs, quotes, backslashes and non-ASCII bytes), instead of .decode()
        return b"".join(str(p.read_bytes()).encode() for p in sorted(root.glob("*.py")))
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
    def __init__(self, d, n_head, proj_in_forward=False):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        self.proj_in_forward = proj_in_forward
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
        if self.proj_in_forward:
            return nn.Linear(C, C)(y)  # BUG (F09): a new, randomly initialised layer at every call (self.c_proj unused)
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
    def __init__(self, d, n_head, **bug):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, **bug)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, softcap=None, **bug):
        super().__init__()
        self.softcap = softcap
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            h=nn.ModuleList([Block(d, n_head, **bug) for _ in range(n_layer)]),
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

    def hidden(self, idx):
        """The final hidden state (after ln_f), what the head reads."""
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)

    def forward(self, idx):
        logits = self.lm_head(self.hidden(idx))
        if self.softcap is not None:  # Gemma 2's final-logit soft-capping
            logits = self.softcap * torch.tanh(logits / self.softcap)
        return logits


class FusedLinearSoftcapCE(torch.autograd.Function):
    """H5's loss: head matmul + soft-cap + cross-entropy in one Function that computes its gradients in the
    forward and only scales them in the backward (the pattern of Liger-Kernel's fused linear cross-entropy and
    torchtitan's chunked loss). mode: "ok"; "ignore_grad_output" (F03: the backward returns the precomputed
    gradients without multiplying by grad_output); "times_logits" (F08: the soft-cap written z * tanh(z / cap))."""

    @staticmethod
    def forward(ctx, h, w, y, cap, mode):
        z = h @ w.t()
        u = z / cap
        th = torch.tanh(u)
        if mode == "times_logits":
            s = z * th  # BUG (F08): should be cap * tanh(z / cap)
            ds_dz = th + u * (1 - th * th)
        else:
            s = cap * th
            ds_dz = 1 - th * th
        logp = torch.log_softmax(s, dim=-1)
        n = y.shape[0]
        loss = -logp.gather(1, y[:, None]).mean()
        g = logp.exp()
        g[torch.arange(n), y] -= 1.0
        dz = g.div_(n).mul_(ds_dz)
        ctx.save_for_backward(dz @ w, dz.t() @ h)
        ctx.ignore_grad_output = mode == "ignore_grad_output"
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        dh, dw = ctx.saved_tensors
        if ctx.ignore_grad_output:
            return dh, dw, None, None, None  # BUG (F03): should be dh * grad_output, dw * grad_output
        return dh * grad_output, dw * grad_output, None, None, None


# ----------------------------------------------------------------------------- HF models

class FusedAddRMSNorm(torch.autograd.Function):
    """residual + x, then RMSNorm of the sum, in one Function (the fused add+RMSNorm of Liger-Kernel, vLLM,
    Unsloth, quack): returns (normed * weight, sum). buggy=True is F05's backward: the gradient arriving on the
    sum (the residual stream's, from above) is added to the normed output's gradient before the norm's
    Jacobian, (d_res + d_out) J, instead of after it, d_res + d_out J (Dao-AILab/quack PR #53)."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps, buggy):
        r = residual + x
        rstd = torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)
        n = r * rstd
        ctx.save_for_backward(n, rstd, weight)
        ctx.buggy = buggy
        return n * weight, r

    @staticmethod
    def backward(ctx, d_out, d_res):
        n, rstd, weight = ctx.saved_tensors
        if d_out is None:
            d_out = torch.zeros_like(n)
        if d_res is None:
            d_res = torch.zeros_like(n)
        dw = (d_out * n).reshape(-1, n.shape[-1]).sum(0)
        if ctx.buggy:
            g = (d_out + d_res) * weight  # BUG (F05): d_res should not go through the norm
            dr = rstd * (g - n * (g * n).mean(-1, keepdim=True))
        else:
            g = d_out * weight
            dr = d_res + rstd * (g - n * (g * n).mean(-1, keepdim=True))
        return dr, dr, dw, None, None


def _fused_decoder_forward(self, hidden_states, attention_mask=None, position_ids=None, cache=None,
                           use_cache=False, position_embeddings=None, **kwargs):
    """Qwen2DecoderLayer.forward with every residual add fused with the RMSNorm that follows it (the
    post-attention norm, and the next layer's input norm or the model's final norm), as vLLM's and Liger-Kernel's
    fused add+RMSNorm do; the same arithmetic as HF's. The normed input of the next norm is handed over in
    `_pre_normed` (the first layer's input norm is a plain one)."""
    residual = hidden_states
    h = self._pre_normed if self._pre_normed is not None else self.input_layernorm(hidden_states)
    self._pre_normed = None
    h, _ = self.self_attn(hidden_states=h, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                          use_cache=use_cache, position_embeddings=position_embeddings, **kwargs)
    norm = self.post_attention_layernorm
    h, residual = FusedAddRMSNorm.apply(h, residual, norm.weight, norm.variance_epsilon, self._fused_buggy)
    h = self.mlp(h)
    nxt = self._next_norm
    normed, residual = FusedAddRMSNorm.apply(h, residual, nxt.weight, nxt.variance_epsilon, self._fused_buggy)
    self._next_owner._pre_normed = normed
    return residual


def _prenormed_forward(self, hidden_states):
    """The final norm, already computed by the last layer's fused add+RMSNorm."""
    out = self._pre_normed
    self._pre_normed = None
    return out


def hf_qwen2(fused_buggy=False):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                      tie_word_embeddings=False, initializer_range=0.02, rms_norm_eps=1e-6, use_sliding_window=False,
                      bos_token_id=0, eos_token_id=0, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg)
    layers = list(model.model.layers)
    final = model.model.norm
    final._pre_normed = None
    final.forward = types.MethodType(_prenormed_forward, final)
    for i, layer in enumerate(layers):
        layer._fused_buggy = fused_buggy
        layer._pre_normed = None
        owner = layers[i + 1] if i + 1 < len(layers) else final
        layer._next_owner = owner
        layer._next_norm = owner.input_layernorm if i + 1 < len(layers) else final
        layer.forward = types.MethodType(_fused_decoder_forward, layer)
    return model


def hf_neox():
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    cfg = GPTNeoXConfig(vocab_size=VOCAB, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=512, rotary_pct=0.25, max_position_embeddings=T, use_parallel_residual=True,
                        hidden_dropout=0.0, attention_dropout=0.0, tie_word_embeddings=False, initializer_range=0.02,
                        bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    return GPTNeoXForCausalLM(cfg)


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


# ----------------------------------------------------------------------------- optimizers and schedules

def zeropower_via_newtonschulz5(G, steps=5):
    """KellerJordan/Muon's quintic Newton-Schulz orthogonalisation (float32 here: bf16 matmuls are slow on
    this CPU)."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    X = G.float()
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        Bm = b * A + c * A @ A
        X = a * X + Bm @ X
    if tall:
        X = X.mT
    return X


class MuonWithAuxAdam(torch.optim.Optimizer):
    """KellerJordan/Muon's single-optimizer form: groups with use_muon=True get Muon (Nesterov momentum,
    Newton-Schulz, scale sqrt(max(1, rows/cols))), the others Adam."""

    def __init__(self, param_groups):
        for g in param_groups:
            if g["use_muon"]:
                g.setdefault("momentum", 0.95)
                g.setdefault("weight_decay", 0.0)
            else:
                g.setdefault("betas", (0.9, 0.95))
                g.setdefault("eps", 1e-10)
                g.setdefault("weight_decay", 0.0)
        super().__init__(param_groups, dict())

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if group["use_muon"]:
                    if not st:
                        st["momentum_buffer"] = torch.zeros_like(p)
                    buf = st["momentum_buffer"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    u = p.grad.lerp(buf, group["momentum"])
                    u = zeropower_via_newtonschulz5(u) * max(1, p.size(-2) / p.size(-1)) ** 0.5
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(u.reshape(p.shape), alpha=-group["lr"])
                else:
                    if not st:
                        st["exp_avg"] = torch.zeros_like(p)
                        st["exp_avg_sq"] = torch.zeros_like(p)
                        st["step"] = 0
                    st["step"] += 1
                    b1, b2 = group["betas"]
                    st["exp_avg"].lerp_(p.grad, 1 - b1)
                    st["exp_avg_sq"].lerp_(p.grad.square(), 1 - b2)
                    m = st["exp_avg"] / (1 - b1 ** st["step"])
                    v = st["exp_avg_sq"] / (1 - b2 ** st["step"])
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                    p.add_(m / (v.sqrt() + group["eps"]), alpha=-group["lr"])


class LinearWarmup:
    """pytorch_warmup's LinearWarmup (Tony-Y/pytorch_warmup, BaseWarmup): the constructor dampens the
    optimizer's lr by the first warm-up factor; each step, inside `with warmup.dampening():` the undampened lrs
    are put back, the lr scheduler steps, and the result is dampened again by min(1, (t + 1) / period)."""

    def __init__(self, optimizer, warmup_period):
        self.optimizer, self.period, self.last_step = optimizer, warmup_period, -1
        self.lrs = [g["lr"] for g in optimizer.param_groups]
        self.dampen()

    def dampen(self):
        self.last_step += 1
        omega = min(1.0, (self.last_step + 1) / self.period)
        for g in self.optimizer.param_groups:
            g["lr"] *= omega

    @contextlib.contextmanager
    def dampening(self):
        for g, lr in zip(self.optimizer.param_groups, self.lrs):
            g["lr"] = lr
        yield
        self.lrs = [g["lr"] for g in self.optimizer.param_groups]
        self.dampen()


def cosine(warmup, total, floor=0.1):
    def f(step):
        if step < warmup:
            return (step + 1) / warmup
        p = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return f


def nanochat_lrm(it, total):
    """nanochat's chat_sft-style lr multiplier: a linear warm-up, then constant, then a linear warm-down over the
    second half (1 - (progress - 0.5) / 0.5), not clamped."""
    if it < WARMUP:
        return (it + 1) / WARMUP
    progress = it / total
    return 1.0 if progress < 0.5 else 1 - (progress - 0.5) / 0.5


def nano_param_groups(model, lr):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": 0.1, "lr": lr, "initial_lr": lr},
            {"params": no_decay, "weight_decay": 0.0, "lr": lr, "initial_lr": lr}]


# ----------------------------------------------------------------------------- gradual magnitude pruning (H4, F01)

class MagnitudePruner:
    """Zhu & Gupta 2017 ("To prune, or not to prune"): the sparsity of every pruned tensor rises as
    s_t = s_f (1 - (1 - (t - t0) / (n dt))^3) at t = t0, t0 + dt, ..., t0 + n dt; at each of these steps each tensor's
    smallest-|w| fraction s_t is masked; the masks are re-applied after every optimizer step. signed=True is F01's
    bug: the score is w, not |w|, so the most negative weights are pruned first."""

    def __init__(self, model, signed=False):
        self.params = [p for n, p in model.named_parameters()
                       if n.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight", "wte.weight"))]
        self.masks = [torch.ones_like(p, dtype=torch.bool) for p in self.params]
        self.signed = signed

    @staticmethod
    def sparsity(step):
        if step < GMP_START:
            return 0.0
        t = min(step - GMP_START, GMP_N * GMP_EVERY) / (GMP_N * GMP_EVERY)
        return GMP_FINAL * (1 - (1 - t) ** 3)

    @torch.no_grad()
    def after_step(self, step):
        if step >= GMP_START and (step - GMP_START) % GMP_EVERY == 0 and step <= GMP_START + GMP_N * GMP_EVERY:
            s = self.sparsity(step)
            for i, p in enumerate(self.params):
                k = int(s * p.numel())
                if k == 0:
                    continue
                score = p if self.signed else p.abs()  # BUG (F01) when signed: should be p.abs()
                thr = score.flatten().kthvalue(k).values
                self.masks[i] = score > thr
        for p, m in zip(self.params, self.masks):
            p.mul_(m)


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, forward function, optimizer, lr control and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(kind=spec["model"], clip=None, micro=1, scaler=None, pruner=None, loss="ce",
             lr_mode=None, warmup=None, scheduler=None, progress_in_micro=bug == "progress_in_microbatches",
             clip_before_unscale=bug == "clip_before_unscale")
    if spec["model"] == "nano":
        h5 = twin.startswith("H5")
        model = GPT(softcap=SOFTCAP if h5 else None, proj_in_forward=bug == "proj_created_in_forward")
        fwd = model
        # H5 (and its twins) uses Adam eps 1e-6, as fairseq's RoBERTa recipe does in fp16 with loss scaling
        optimizer = torch.optim.AdamW(nano_param_groups(model, 1e-3), lr=1e-3, betas=(0.9, 0.95),
                                      eps=1e-6 if h5 else 1e-8)
        o.update(clip=1.0, micro=MICRO, lr_mode="nanochat")
        if twin.startswith("H4"):
            o["pruner"] = MagnitudePruner(model, signed=bug == "gmp_signed_scores")
        if h5:
            o["scaler"] = torch.amp.GradScaler("cpu", init_scale=LOSS_SCALE)
            o["loss"] = {"ce_ignores_grad_output": "ignore_grad_output",
                         "softcap_times_logits": "times_logits"}.get(bug, "ok")
    elif spec["model"] == "qwen2":
        model = hf_qwen2(fused_buggy=bug == "fused_addnorm_backward")
        fwd = HFWrap(model)
        if bug == "muon_on_embed_head":
            # BUG (F04): every matrix of the model, embedding and head included (should be the decoder layers' only)
            muon = [p for p in model.parameters() if p.ndim >= 2]
        else:
            muon = [p for p in model.model.layers.parameters() if p.ndim >= 2]
        ids = {id(p) for p in muon}
        aux = [p for p in model.parameters() if id(p) not in ids]
        optimizer = MuonWithAuxAdam([dict(params=muon, use_muon=True, lr=MUON_LR),
                                     dict(params=aux, use_muon=False, lr=AUX_LR)])
        o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(WARMUP, steps))
    elif spec["model"] == "neox":
        model = hf_neox()
        fwd = HFWrap(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.01)
        if bug == "scheduler_after_warmup":
            # BUG (F06): the warm-up wrapper first (it dampens the lr to lr / 10), the scheduler after it (its base
            # lr is then the dampened one)
            o["warmup"] = LinearWarmup(optimizer, WARMUP)
            o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(0, steps))
        else:
            o["scheduler"] = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(0, steps))
            o["warmup"] = LinearWarmup(optimizer, WARMUP)
        o["clip"] = 1.0
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


def micro_loss(model, fwd, o, x, y):
    if o["kind"] == "nano" and o["scaler"] is not None:
        h = model.hidden(x)
        return FusedLinearSoftcapCE.apply(h.reshape(-1, h.shape[-1]), model.lm_head.weight, y.reshape(-1),
                                          SOFTCAP, o["loss"])
    return ce(fwd(x), y)


def set_nanochat_lr(optimizer, step, steps, o):
    # the counter the multiplier reads: the optimizer step, or (F07) the micro-batches consumed so far
    it = MICRO * (step + 1) - 1 if o["progress_in_micro"] else step  # BUG (F07) when progress_in_micro
    lrm = nanochat_lrm(it, steps)
    for g in optimizer.param_groups:
        g["lr"] = g["initial_lr"] * lrm


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, o = build(name, spec, steps)
    model.train()
    vb = val_batches(to_ids(val_text))
    shared = work / "_data" / "train.bin"
    if spec["bug"] == "str_bytes_corpus":  # F10: the corpus prepared with str(bytes); its own token file
        train_text = corpus_bytes(as_str=True)
        shared = folder / "train.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(train_text):
        write_token_file(train_text, shared)
    it = iter(ByteWindows(read_token_file(shared), B, seed=SEED))
    scaler = o["scaler"]
    if o["lr_mode"] == "nanochat":
        set_nanochat_lr(optimizer, 0, steps, o)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        x, y = next(it)
        if o["lr_mode"] == "nanochat":
            set_nanochat_lr(optimizer, step, steps, o)
        total = 0.0
        mb = B // o["micro"]
        for i in range(o["micro"]):
            xm, ym = x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]
            loss = micro_loss(model, fwd, o, xm, ym) / o["micro"]
            (scaler.scale(loss) if scaler is not None else loss).backward()
            total = total + loss.detach()
        if use_watch:
            watch.step(total)
        lval = float(total)
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None:
            if scaler is not None and not o["clip_before_unscale"]:
                scaler.unscale_(optimizer)
            # BUG (F02) when clip_before_unscale: the gradients are still multiplied by the loss scale here
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
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if o["pruner"] is not None:
            o["pruner"].after_step(step)
        if o["warmup"] is not None:
            with o["warmup"].dampening():
                o["scheduler"].step()
        elif o["scheduler"] is not None:
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind7"))
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
