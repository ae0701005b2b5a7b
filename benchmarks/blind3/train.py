"""Train every run of the third blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind2/ (byte-level language models on Python's own standard library: the
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
RESUME_AT = 80  # F06: the step after which the run is "restarted" from its checkpoint
PAD_ID = 32  # F02: the byte the collator treats as padding (a space)


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


def read_token_file(buf):
    """What the training script reads back (np.memmap(path, dtype=np.uint16))."""
    return torch.frombuffer(bytearray(buf), dtype=torch.int16).long()


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


class Unshuffled:
    """F01: the same windows cut in order, one after the other: a DataLoader(shuffle=False) over a
    dataset of consecutive T+1 windows of the token stream (the file order of the modules)."""

    def __init__(self, data, batch):
        self.data, self.batch = data, batch

    def __iter__(self):
        i = 0
        while True:
            chunk = torch.stack([self.data[j:j + T + 1] for j in range(i, i + self.batch * T, T)])
            i += self.batch * T
            yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- nanoGPT-style model

class LayerNormDetachedStats(nn.Module):
    """F07: a hand-written LayerNorm whose mean and variance are detached from the graph ("they are
    only statistics"): the forward is exactly nn.LayerNorm's, the backward lacks the statistics' terms."""

    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))
        self.eps = eps

    def forward(self, x):
        mu = x.mean(-1, keepdim=True).detach()  # BUG (F07)
        var = x.var(-1, unbiased=False, keepdim=True).detach()  # BUG (F07)
        return (x - mu) / torch.sqrt(var + self.eps) * self.weight + self.bias


class CausalSelfAttention(nn.Module):
    def __init__(self, d, n_head, sdpa_triu_mask=False):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head = n_head
        self.sdpa_triu_mask = sdpa_triu_mask
        self.register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T), persistent=False)

    def forward(self, x):
        Bn, Tn, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        k = k.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        v = v.view(Bn, Tn, self.n_head, hs).transpose(1, 2)
        if self.sdpa_triu_mask:
            # BUG (F05): the attention moved to F.scaled_dot_product_attention with the mask of
            # nn.MultiheadAttention's convention (True = may NOT attend); SDPA reads True as "may attend"
            mask = torch.triu(torch.ones(Tn, Tn, dtype=torch.bool, device=x.device), diagonal=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
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
    def __init__(self, d, n_head, norm, sdpa_triu_mask=False):
        super().__init__()
        self.ln_1 = norm(d)
        self.attn = CausalSelfAttention(d, n_head, sdpa_triu_mask)
        self.ln_2 = norm(d)
        self.mlp = MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):
    def __init__(self, n_layer=4, n_head=4, d=128, norm=nn.LayerNorm, sdpa_triu_mask=False, zero_init_linear=False):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, d),
            wpe=nn.Embedding(T, d),
            h=nn.ModuleList([Block(d, n_head, norm, sdpa_triu_mask) for _ in range(n_layer)]),
            ln_f=norm(d),
        ))
        self.lm_head = nn.Linear(d, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        if zero_init_linear:
            # BUG (F04): "zero-init the output projections" (modded-nanogpt's c_proj.weight.zero_()) written
            # as the nn.Linear branch of _init_weights: every Linear (c_attn, c_fc, c_proj, the tied head) is 0
            self.apply(self._init_weights_zero_linear)
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
    def _init_weights_zero_linear(m):
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.weight)  # BUG (F04): meant for the c_proj layers only
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t, device=idx.device))
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


class HFWrap:
    """Logits of an HF causal LM; the Watch is given the HF model itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(input_ids=x).logits


def add_llama_mtp(model):
    """H6: one DeepSeek-V3-style multi-token-prediction module (DeepSeek-AI 2024, "DeepSeek-V3 Technical
    Report", §2.2): h'_i = M [RMSNorm(h_i); RMSNorm(Emb(t_{i+1}))], one more decoder layer, then the
    model's own final norm and output head predict t_{i+2}. Attached to the model (model.mtp_*)."""
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
    cfg = model.config
    d = cfg.hidden_size
    model.mtp_norm_h = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
    model.mtp_norm_e = LlamaRMSNorm(d, eps=cfg.rms_norm_eps)
    model.mtp_proj = nn.Linear(2 * d, d, bias=False)
    model.mtp_layer = LlamaDecoderLayer(cfg, layer_idx=cfg.num_hidden_layers)
    nn.init.normal_(model.mtp_proj.weight, std=cfg.initializer_range)
    for m in model.mtp_layer.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=cfg.initializer_range)


def llama_mtp_losses(model, x, y):
    """Main next-byte loss and the MTP (byte after next) loss of H6."""
    inner = model.model
    h = inner(input_ids=x).last_hidden_state  # after the final norm
    main = ce(model.lm_head(h), y)
    # the MTP module sees positions 0..T-2: h_i and the embedding of t_{i+1} (= y_i), predicts t_{i+2} (= y_{i+1})
    hi = h[:, :-1]
    ei = inner.embed_tokens(y[:, :-1])
    z = model.mtp_proj(torch.cat([model.mtp_norm_h(hi), model.mtp_norm_e(ei)], dim=-1))
    pos = torch.arange(z.shape[1]).unsqueeze(0)
    pe = inner.rotary_emb(z, pos)
    z = model.mtp_layer(z, attention_mask=None, position_ids=pos, position_embeddings=pe)
    if isinstance(z, tuple):
        z = z[0]
    mtp = ce(model.lm_head(inner.norm(z)), y[:, 1:])
    return main, mtp


# ----------------------------------------------------------------------------- optimizers written by hand

class DecoupledAdamW(torch.optim.AdamW):
    """MosaicML Composer's DecoupledAdamW: the weight decay is scaled by lr / initial_lr (the schedule), not
    by the lr itself (Loshchilov & Hutter's fully decoupled form): p <- p * (1 - wd * lr_t / lr_0), then Adam."""

    @torch.no_grad()
    def step(self, closure=None):
        saved = []
        for group in self.param_groups:
            wd = group["weight_decay"]
            saved.append(wd)
            if wd:
                factor = group["lr"] / group.get("initial_lr", group["lr"])
                for p in group["params"]:
                    if p.grad is not None:
                        p.mul_(1 - factor * wd)
            group["weight_decay"] = 0.0
        super().step(closure)
        for group, wd in zip(self.param_groups, saved):
            group["weight_decay"] = wd


def newton_schulz5(G, steps=5):
    """Muon's orthogonalisation (Keller Jordan, github.com/KellerJordan/Muon): a quintic Newton-Schulz
    iteration that maps G to ~U V^T (in float32 here, bfloat16 on GPUs)."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        A = X @ X.mT
        Bm = b * A + c * A @ A
        X = a * X + Bm @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


class MuonWithAuxAdam(torch.optim.Optimizer):
    """H4: KellerJordan/Muon's `SingleDeviceMuonWithAuxAdam`: groups with use_muon=True (the blocks' 2-D
    weights) get Muon (Nesterov momentum 0.95, orthogonalised, scaled by sqrt(max(1, rows/cols)));
    the others (embeddings, norms, biases) get AdamW."""

    def __init__(self, groups):
        super().__init__(groups, dict())

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if group["use_muon"]:
                    if not state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buf = state["momentum_buffer"]
                    buf.lerp_(p.grad, 1 - group["momentum"])
                    update = p.grad.lerp(buf, group["momentum"])  # Nesterov
                    update = newton_schulz5(update) * max(1, p.size(-2) / p.size(-1)) ** 0.5
                    p.mul_(1 - lr * wd).add_(update, alpha=-lr)
                else:
                    b1, b2 = group["betas"]
                    if not state:
                        state["step"] = 0
                        state["exp_avg"] = torch.zeros_like(p)
                        state["exp_avg_sq"] = torch.zeros_like(p)
                    state["step"] += 1
                    state["exp_avg"].lerp_(p.grad, 1 - b1)
                    state["exp_avg_sq"].lerp_(p.grad.square(), 1 - b2)
                    m_hat = state["exp_avg"] / (1 - b1 ** state["step"])
                    v_hat = state["exp_avg_sq"] / (1 - b2 ** state["step"])
                    p.mul_(1 - lr * wd).addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-lr)


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


def muon_param_groups(model):
    hidden = [p for n, p in model.named_parameters() if p.dim() >= 2 and ".h." in n]
    emb = [p for n, p in model.named_parameters() if p.dim() >= 2 and ".h." not in n]
    vec = [p for n, p in model.named_parameters() if p.dim() < 2]
    adam = dict(use_muon=False, betas=(0.9, 0.95), eps=1e-8)
    return [dict(params=hidden, use_muon=True, lr=0.02, momentum=0.95, weight_decay=0.0),
            dict(params=emb, lr=1e-3, weight_decay=0.1, **adam),
            dict(params=vec, lr=1e-3, weight_decay=0.0, **adam)]


def seqlen_warmup(step, start=16, full=T, over=80, multiple=8):
    """H5: DeepSpeed-style sequence-length warm-up: the window grows linearly from `start` to `full` over
    the first `over` steps, rounded down to a multiple of 8 (the batch's windows are truncated)."""
    L = start + (full - start) * min(1.0, step / over)
    return max(start, int(L) // multiple * multiple)


def build(name, spec, steps):
    """Model, forward function, optimizer, scheduler and loop options of one run."""
    bug = spec["bug"]
    torch.manual_seed(SEED)
    opts = dict(clip=None, loss="ce", ignore_index=None, unshuffled=False, zero_grad_before_step=False,
                resume_strict_false=False, seqlen_warmup=False, mtp=None)
    if spec["model"] == "nano":
        kw = {}
        if bug == "sdpa_triu_mask":
            kw["sdpa_triu_mask"] = True
        if bug == "zero_init_linear":
            kw["zero_init_linear"] = True
        if bug == "layernorm_detached_stats":
            kw["norm"] = LayerNormDetachedStats
        model = GPT(**kw)
        fwd = model
        if name.startswith("H4"):
            optimizer = MuonWithAuxAdam(muon_param_groups(model))
        elif bug == "decoupled_wd_torch_value":
            # BUG (F03): Composer's DecoupledAdamW with the weight_decay value of torch's AdamW recipe (0.1)
            optimizer = DecoupledAdamW(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
        else:
            optimizer = torch.optim.AdamW(nano_param_groups(model), lr=1e-3, betas=(0.9, 0.95))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, cosine(10, steps))
        opts["clip"] = 1.0
    elif spec["model"] == "gpt2":
        model = hf_gpt2()
        fwd = HFWrap(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        scheduler = None
        if bug == "zero_grad_before_step":
            opts["zero_grad_before_step"] = True
        if bug == "resume_strict_false":
            opts["resume_strict_false"] = True
        if name.startswith("H5"):
            opts["seqlen_warmup"] = True
    elif spec["model"] == "llama":
        model = hf_llama()
        if name.startswith("H6"):
            add_llama_mtp(model)
            opts["mtp"] = 0.3  # DeepSeek-V3's MTP loss weight lambda (0.3 for its first 10T tokens)
        fwd = HFWrap(model)
        optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / steps))
        if bug == "pad_is_space":
            opts["ignore_index"] = PAD_ID
        if bug == "unshuffled":
            opts["unshuffled"] = True
    else:
        raise ValueError(spec["model"])
    return model, fwd, optimizer, scheduler, opts


def ce(logits, y, ignore_index=-100):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=ignore_index)


@torch.no_grad()
def evaluate(model, fwd, vb):
    was = model.training
    model.eval()
    losses = [ce(fwd(x), y).item() for x, y in vb]
    model.train(was)
    return sum(losses) / len(losses)


def restart_from_checkpoint(model, optimizer, fresh_model):
    """F06: what a resumed run does, in-process. The checkpoint is saved the way a torch.compile'd model saves
    it (every key prefixed '_orig_mod.'); the "new process" builds its model again (the same seeded init as
    step 0) and loads the checkpoint with strict=False, which matches no key and loads nothing. The optimizer's
    state (moments at step 80) loads fine."""
    ckpt = {"model": {"_orig_mod." + k: v.clone() for k, v in model.state_dict().items()},
            "optimizer": copy.deepcopy(optimizer.state_dict())}
    with torch.no_grad():  # the new process's model: the same seeded initialisation as at step 0
        for p, q in zip(model.parameters(), fresh_model.parameters()):
            p.copy_(q)
    result = model.load_state_dict(ckpt["model"], strict=False)  # BUG (F06): no prefix stripped, strict=False
    optimizer.load_state_dict(ckpt["optimizer"])
    return result


def train_one(name, spec, steps, work, data, use_watch=True):
    train, val = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, fwd, optimizer, scheduler, o = build(name, spec, steps)
    fresh = None
    if o["resume_strict_false"]:
        with torch.random.fork_rng():
            torch.manual_seed(SEED)
            fresh = hf_gpt2()
    model.train()
    vb = val_batches(val)
    stream = read_token_file(tokenize_to_file_bytes(train))
    loader = Unshuffled(stream, B) if o["unshuffled"] else ByteWindows(stream, B, seed=SEED)
    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent = []
    t0 = time.time()
    for step in range(steps + 1):
        if o["resume_strict_false"] and step == RESUME_AT + 1:
            r = restart_from_checkpoint(model, optimizer, fresh)
            print(f"  {name}: resumed at step {step}: {len(r.missing_keys)} missing, "
                  f"{len(r.unexpected_keys)} unexpected keys", flush=True)
        x, y = next(it)
        if o["seqlen_warmup"]:
            L = seqlen_warmup(step)
            x, y = x[:, :L].contiguous(), y[:, :L].contiguous()
        if o["mtp"]:
            main, mtp = llama_mtp_losses(model, x, y)
            loss = main + o["mtp"] * mtp
        else:
            logits = fwd(x)
            if o["ignore_index"] is not None:
                # BUG (F02): the collator's `labels[labels == pad_id] = -100` with pad_id = the space byte (a
                # character-level pipeline that pads with spaces): no space in the text is ever a target
                loss = ce(logits, y, ignore_index=o["ignore_index"])
            else:
                loss = ce(logits, y)
        loss.backward()
        total = loss.detach()
        if use_watch:
            watch.step(total)
        lval = float(total)
        recent = (recent + [lval])[-10:]
        if o["zero_grad_before_step"]:
            # BUG (F08): `optimizer.zero_grad()` moved up one line, between the backward and the
            # step: every step's gradients are dropped before the optimizer sees them
            optimizer.zero_grad(set_to_none=True)
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
        if step == steps:
            break
        if step % 10 == 0 and not math.isfinite(lval):
            print(f"  {name}: non-finite loss at step {step}, stopping", flush=True)
            break
        optimizer.step()
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind3"))
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
