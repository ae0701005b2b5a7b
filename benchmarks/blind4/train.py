"""Train every run of the fourth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind3/ (byte-level language models on Python's own standard library: the
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
RESUME_AT = 80  # F06: the step after which the run is resumed from its converted checkpoint


# ----------------------------------------------------------------------------- data

def corpus_bytes():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in sorted(root.glob("*.py")))
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val


def to_ids(b):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).long()


def tokenize_to_file_bytes(ids):
    """What a nanoGPT-style prepare.py writes: the token ids as uint16 (np.uint16 .tofile), little-endian."""
    return ids.to(torch.int16).numpy().astype("<u2").tobytes()


def read_token_file(buf):
    """What the training script reads back (np.memmap(path, dtype=np.uint16))."""
    return torch.frombuffer(bytearray(buf), dtype=torch.int16).long()


def prepare_train(text, normalise_whitespace=False):
    """The training side of the preprocessing: clean the text (F01: whitespace normalised, the
    `" ".join(text.split())` of NLP cleaning scripts), write the token file, read it back."""
    if normalise_whitespace:
        # BUG (F01): every run of whitespace (newlines and indentation included) becomes one space in the
        # training text; the held-out text goes to the evaluation as it is
        text = b" ".join(text.split())
    return read_token_file(tokenize_to_file_bytes(to_ids(text)))


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
    def __init__(self, d, n_head, mask_times_inf=False):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        self.mask_times_inf = mask_times_inf
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

    def forward(self, x):
        Bn, Tn, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        k = k.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        v = v.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        if self.mask_times_inf:
            # BUG (F10): the additive causal mask written as "ones above the diagonal times -inf": above the
            # diagonal 1 * -inf = -inf as meant, but on and below it 0 * -inf = nan, so every score is nan
            mask = torch.triu(torch.ones(Tn, Tn, device=x.device), diagonal=1) * float("-inf")
            att = (q @ k.transpose(-2, -1)) * hs ** -0.5 + mask
            y = F.softmax(att, dim=-1) @ v
        else:
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
    def __init__(self, d, n_head, mask_times_inf=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, n_head, mask_times_inf)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, mask_times_inf=False, init_linear_only=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            h=nn.ModuleList([Block(d, n_head, mask_times_inf) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(d),
        ))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        if init_linear_only:
            # BUG (F03): an _init_weights with an nn.Linear branch only ("the token embedding is tied to the
            # head, so it is covered"): the position embedding keeps nn.Embedding's default init, N(0, 1)
            self.apply(self._init_weights_linear_only)
        else:
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

    @staticmethod
    def _init_weights_linear_only(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def convert_checkpoint(sd):
    """F06: the checkpoint converted for the resumed run (between the training framework's parameter names and
    the model's): a target state dict allocated with zeros, filled key by key through a name mapping. BUG (the
    one of NVIDIA-NeMo#11951, where the exporter maps the pre-feed-forward norm onto the post-attention norm's
    name, so "pre-feedforward layer norm is not transferred (and is set to 0)"): the mapping sends every
    block's MLP pre-norm `ln_2` onto `ln_1`'s name: ln_1 receives ln_2's trained values (written last), ln_2
    keeps the zeros of the freshly allocated target. Every key is present, so strict loading passes."""
    def target_name(k):
        return k.replace(".ln_2.", ".ln_1.")  # BUG (F06): ln_2 should map to ln_2
    out = {k: torch.zeros_like(v) for k, v in sd.items()}
    for k, v in sd.items():
        out[target_name(k)] = v.clone()
    return out


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


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


class RMSNormTimesRsqrt(nn.Module):
    """F09: a hand-written RMSNorm (llm-foundry's, before its fix): x is *divided* by rsqrt(mean(x^2) + eps),
    i.e. multiplied by the rms instead of divided by it."""

    def __init__(self, weight, eps):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        out = x / torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # BUG (F09): should be x * rsqrt(...)
        return self.weight * out.to(dtype)


def replace_llama_norms(model):
    inner = model.model
    eps = model.config.rms_norm_eps
    for layer in inner.layers:
        layer.input_layernorm = RMSNormTimesRsqrt(layer.input_layernorm.weight, eps)
        layer.post_attention_layernorm = RMSNormTimesRsqrt(layer.post_attention_layernorm.weight, eps)
    inner.norm = RMSNormTimesRsqrt(inner.norm.weight, eps)


# ----------------------------------------------------------------------------- optimizers written by hand

class HandAdam(torch.optim.Optimizer):
    """Adam as in Kingma & Ba (Algorithm 1), written by hand. multiply_bias_correction=True is F04's bug
    (karpathy/convnetjs PR #70): the bias corrections multiply by (1 - beta^t) instead of dividing."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, multiply_bias_correction=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.multiply_bias_correction = multiply_bias_correction

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
                if self.multiply_bias_correction:
                    m_hat = m * (1 - b1 ** t)  # BUG (F04): should be m / (1 - b1 ** t)
                    v_hat = v * (1 - b2 ** t)  # BUG (F04): should be v / (1 - b2 ** t)
                else:
                    m_hat = m / (1 - b1 ** t)
                    v_hat = v / (1 - b2 ** t)
                p.addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-group["lr"])


class Adafactor(torch.optim.Optimizer):
    """H4: Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory Cost";
    the update of HF transformers' `Adafactor` with relative_step=False, scale_parameter=False,
    warmup_init=False, beta1=None): factored second moments (row and column means of g^2 + eps1) for
    matrices, full ones for vectors, decay beta2_t = 1 - t^-0.8, the update clipped to RMS <= d, no momentum."""

    def __init__(self, params, lr=1e-3, eps1=1e-30, clip_threshold=1.0, decay_rate=-0.8, weight_decay=0.0):
        super().__init__(params, dict(lr=lr, eps1=eps1, clip_threshold=clip_threshold, decay_rate=decay_rate,
                                      weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad.float()
                st = self.state[p]
                factored = p.dim() >= 2
                if not st:
                    st["step"] = 0
                    if factored:
                        st["row"] = torch.zeros(p.shape[:-1])
                        st["col"] = torch.zeros(p.shape[:-2] + p.shape[-1:])
                    else:
                        st["sq"] = torch.zeros_like(g)
                st["step"] += 1
                beta2t = 1.0 - st["step"] ** group["decay_rate"]
                upd = g * g + group["eps1"]
                if factored:
                    st["row"].mul_(beta2t).add_(upd.mean(dim=-1), alpha=1 - beta2t)
                    st["col"].mul_(beta2t).add_(upd.mean(dim=-2), alpha=1 - beta2t)
                    r = (st["row"] / st["row"].mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
                    c = st["col"].unsqueeze(-2).rsqrt()
                    u = r * c * g
                else:
                    st["sq"].mul_(beta2t).add_(upd, alpha=1 - beta2t)
                    u = st["sq"].rsqrt() * g
                u.div_((u.pow(2).mean().sqrt() / group["clip_threshold"]).clamp_(min=1.0))
                if group["weight_decay"]:
                    p.mul_(1 - group["weight_decay"] * group["lr"])
                p.add_(u, alpha=-group["lr"])


class ScheduleFreeAdamW(torch.optim.Optimizer):
    """H5: Schedule-Free AdamW (Defazio et al. 2024, "The Road Less Scheduled", arXiv:2405.15682;
    facebookresearch/schedule_free's AdamWScheduleFree), written with x, z explicit. The model's parameters
    hold y = (1 - beta1) z + beta1 x during training (the gradient is taken there) and x after
    optimizer.eval() (the point to evaluate); optimizer.train() puts y back.
        z <- z - lr_t (g / (sqrt(v_hat) + eps) + wd y)
        x <- (1 - c) x + c z,  c = lr_max^2 / sum of lr_max^2 so far   (weight_lr_power 2)
    lr_t = lr * warm-up * sqrt(1 - beta2^t) (Adam's bias correction folded into the step, as the reference)."""

    def __init__(self, params, lr=2e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, warmup_steps=10):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      warmup_steps=warmup_steps, k=0, lr_max=0.0, weight_sum=0.0))
        self.training = True

    @torch.no_grad()
    def eval(self):
        if self.training:
            for group in self.param_groups:
                for p in group["params"]:
                    if "x" in self.state[p]:
                        p.copy_(self.state[p]["x"])
            self.training = False

    @torch.no_grad()
    def train(self):
        if not self.training:
            for group in self.param_groups:
                b1 = group["betas"][0]
                for p in group["params"]:
                    st = self.state[p]
                    if "x" in st:
                        p.copy_(st["z"] * (1 - b1) + st["x"] * b1)
            self.training = True

    @torch.no_grad()
    def step(self, closure=None):
        assert self.training, "Schedule-Free: call optimizer.train() before step()"
        for group in self.param_groups:
            b1, b2 = group["betas"]
            k = group["k"]
            sched = min(1.0, (k + 1) / group["warmup_steps"])
            lr = group["lr"] * sched * math.sqrt(1 - b2 ** (k + 1))
            group["lr_max"] = lr_max = max(lr, group["lr_max"])
            weight = lr_max ** 2
            group["weight_sum"] += weight
            ckp1 = weight / group["weight_sum"] if group["weight_sum"] else 0.0
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["z"] = p.detach().clone()
                    st["x"] = p.detach().clone()
                    st["v"] = torch.zeros_like(p)
                v = st["v"]
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                g = p.grad / (v.sqrt() + group["eps"])
                if group["weight_decay"]:
                    g = g + group["weight_decay"] * p
                st["z"].sub_(g, alpha=lr)
                st["x"].lerp_(st["z"], ckp1)
                p.copy_(st["z"] * (1 - b1) + st["x"] * b1)
            group["k"] = k + 1


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


ADAFACTOR_LR = 3e-3


def build(name, spec, steps):
    """Model, forward function, optimizer, scheduler and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    opts = dict(clip=None, loss="ce", clip_after_step=False, loss_rewrapped=False, resume_converted=False,
                normalise_whitespace=bug == "whitespace_normalised_train", schedulefree=False)
    if spec["model"] == "nano":
        model = GPT(mask_times_inf=bug == "mask_ones_times_inf", init_linear_only=bug == "wpe_default_init")
        fwd = model
        if twin.startswith("H5"):
            optimizer = ScheduleFreeAdamW(nano_param_groups(model), lr=2e-3, betas=(0.9, 0.95), warmup_steps=10)
            scheduler = None
            opts["schedulefree"] = True
        else:
            optimizer = torch.optim.AdamW(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
        opts["clip"] = 1.0
        if bug == "log_softmax_batch_dim":
            opts["loss"] = "log_softmax_dim0"
        if bug == "ln2_mapped_to_ln1":
            opts["resume_converted"] = True
    elif spec["model"] == "gpt2":
        model = hf_gpt2()
        fwd = HFWrap(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9, nesterov=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
        opts["clip"] = 1.0
        if bug == "clip_after_step":
            opts["clip_after_step"] = True
        if bug == "loss_rewrapped":
            opts["loss_rewrapped"] = True
    elif spec["model"] == "llama":
        model = hf_llama()
        if bug == "rmsnorm_divides_by_rsqrt":
            replace_llama_norms(model)
        fwd = HFWrap(model)
        if twin.startswith("H4"):
            optimizer = Adafactor(model.parameters(), lr=ADAFACTOR_LR)
            if bug == "lambdalr_returns_lr":
                # BUG (F08): the lambda returns the learning rate itself; LambdaLR multiplies it by the
                # optimizer's lr (the lambda is meant to return a factor): lr = 3e-3 * 3e-3 * decay
                scheduler = torch.optim.lr_scheduler.LambdaLR(
                    optimizer, lambda s: ADAFACTOR_LR * max(0.0, 1 - s / steps))
            else:
                scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
        else:
            if bug == "adam_bias_correction_multiplied":
                optimizer = HandAdam(model.parameters(), lr=2e-3, multiply_bias_correction=True)
            else:
                optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
    else:
        raise ValueError(spec["model"])
    return model, fwd, optimizer, scheduler, opts


def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def resume_through_conversion(model):
    """F06: the run is resumed from its converted checkpoint (see convert_checkpoint). The optimizer's state
    is kept."""
    return model.load_state_dict(convert_checkpoint(model.state_dict()), strict=True)


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, scheduler, o = build(name, spec, steps)
    model.train()
    vb = val_batches(to_ids(val_text))
    stream = prepare_train(train_text, normalise_whitespace=o["normalise_whitespace"])
    it = iter(ByteWindows(stream, B, seed=SEED))
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        if o["resume_converted"] and step == RESUME_AT + 1:
            resume_through_conversion(model)
            print(f"  {name}: resumed at step {step} from the converted checkpoint", flush=True)
        x, y = next(it)
        logits = fwd(x)
        if o["loss"] == "log_softmax_dim0":
            # BUG (F02): log_softmax over dim 0 of the (B, T, V) logits (the batch), not over the vocabulary
            loss = F.nll_loss(F.log_softmax(logits.float(), dim=0).reshape(-1, VOCAB), y.reshape(-1))
        else:
            loss = ce(logits, y)
        if o["loss_rewrapped"]:
            # BUG (F05): the loss rebuilt from its value (e.g. after a .item() for logging or a numpy metric),
            # with requires_grad=True to silence "element 0 of tensors does not require grad": a new leaf,
            # no graph behind it
            loss = torch.tensor(loss.item(), requires_grad=True)
        loss.backward()
        total = loss.detach()
        if use_watch:
            watch.step(total)
        lval = float(total)
        recent = (recent + [lval])[-10:]
        if o["clip"] is not None and not o["clip_after_step"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
        if step % 10 == 0:
            if o["schedulefree"]:
                optimizer.eval()  # evaluate at x, the averaged iterate
            vl = evaluate(model, fwd, vb)
            if o["schedulefree"]:
                optimizer.train()
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
        if o["clip_after_step"]:
            # BUG (F07): clipping moved after optimizer.step(): it clips gradients the step has already used,
            # and zero_grad drops them
            torch.nn.utils.clip_grad_norm_(model.parameters(), o["clip"])
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind4"))
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
