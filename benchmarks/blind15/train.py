"""Train every run of the fifteenth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind14/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF OLMoE, a mixture of experts,
and OpenAI GPT-1, a post-LayerNorm Transformer, built from configs), new recipes (OLMoE's load-balancing and
router z-losses; GPT-1's warm-up from zero; bfloat16 autocast with Adamax; learned persistent memory key/values;
R-Drop) and new bugs. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and
<work>/<name>/log.jsonl (step, loss = mean training cross-entropy of the last 10 steps, loss_step, loss_opt = the
optimised loss of the last 10 steps where it is not the plain cross-entropy, val_loss = held-out cross-entropy of
the training model, lr of the first parameter group).
"""

from __future__ import annotations

import argparse
import contextlib
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
LR = 3e-3
# H1 / H4: OLMoE (Muennighoff et al. 2024): 8 experts, top-2, load-balancing loss 0.01, router z-loss 0.001
N_EXPERTS, TOP_K = 8, 2
AUX_COEF, Z_COEF = 0.01, 0.001
# H2: GPT-1 (Radford et al. 2018): linear warm-up from 0, then a cosine to 0
GPT1_LR, GPT1_WARMUP = float(os.environ.get('B15_GPT1_LR', 1e-3)), 20
# H3: Adamax (Kingma & Ba 2015, section 7.1), its default lr 2e-3 and betas (0.9, 0.999)
ADAMAX_LR = 2e-3
# H4: persistent memory key/values (Sukhbaatar et al. 2019; lucidrains/x-transformers num_mem_kv)
NUM_MEM_KV = 16
# H5: R-Drop (Liang et al. 2021): dropout 0.1, two passes, alpha 1
RDROP_ALPHA, DROPOUT = 1.0, 0.1
RDROP_LR = float(os.environ.get('B15_RDROP_LR', 1e-3))
# F02: DataCollatorForLanguageModeling's masked-LM defaults (mlm=True, mlm_probability 0.15, 80/10/10)
MLM_PROB, MASK_ID = 0.15, 0  # byte 0 (absent from the text) plays the tokenizer's mask token


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


# ----------------------------------------------------------------------------- HF models

def hf_olmoe():
    from transformers import OlmoeConfig, OlmoeForCausalLM
    cfg = OlmoeConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=4, num_experts=N_EXPERTS,
                      num_experts_per_tok=TOP_K, norm_topk_prob=False, max_position_embeddings=T,
                      initializer_range=0.02, attention_dropout=0.0, output_router_logits=True,
                      router_aux_loss_coef=AUX_COEF, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return OlmoeForCausalLM(cfg)


def hf_gpt1(dropout=0.0):
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel
    cfg = OpenAIGPTConfig(vocab_size=VOCAB, n_positions=T, n_embd=128, n_layer=3, n_head=4, afn="gelu",
                          resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout, initializer_range=0.02)
    return OpenAIGPTLMHeadModel(cfg)


# F01: the router's topk unpacked in the wrong order, the dtype error silenced with a cast
def _router_forward_swapped(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.softmax(router_logits, dtype=torch.float, dim=-1)
    # BUG (F01): torch.topk returns (values, indices); bound as (indices, values). The one-hot of the expert
    # dispatch then failed on float indices, and the cast below made the error go away.
    router_indices, router_top_value = torch.topk(router_probs, self.top_k, dim=-1)
    router_indices = router_indices.long()  # probabilities < 1 -> expert 0, every token, both slots
    router_top_value = router_top_value.to(router_logits.dtype)  # the expert numbers, used as gate weights
    return router_logits, router_top_value, router_indices


def patch_router_topk_swapped(model):
    import types
    for layer in model.model.layers:
        layer.mlp.gate.forward = types.MethodType(_router_forward_swapped, layer.mlp.gate)


# H4: persistent memory key/values, as an attention function registered with transformers
def _memkv_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """sdpa over [memory; keys]: NUM_MEM_KV learned key/value vectors per head, prepended to every layer's keys
    and values (x-transformers' num_mem_kv). Query i may attend to every memory slot and to the keys 0..i: the
    causal diagonal is aligned to the bottom right of the (T, M + T) score matrix. upper_left is F07's bug."""
    b, h, t, d = query.shape
    mk = module.mem_k.unsqueeze(0).expand(b, -1, -1, -1).to(key.dtype)
    mv = module.mem_v.unsqueeze(0).expand(b, -1, -1, -1).to(value.dtype)
    k = torch.cat([mk, key], dim=2)
    v = torch.cat([mv, value], dim=2)
    m = mk.shape[2]
    if getattr(module, "mask_upper_left", False):
        # BUG (F07): is_causal=True with more keys than queries: sdpa aligns the causal mask to the top left, so
        # query i sees the keys 0..i of [memory; text]: the memory and the text up to i - M, never its last M bytes
        out = F.scaled_dot_product_attention(query, k, v, is_causal=True, scale=scaling)
    else:
        i = torch.arange(t)[:, None]
        j = torch.arange(m + t)[None, :]
        allowed = (j < m) | (j - m <= i)
        out = F.scaled_dot_product_attention(query, k, v, attn_mask=allowed, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def add_memory_kv(model, upper_left=False):
    from transformers import AttentionInterface
    AttentionInterface.register("memkv", _memkv_attention)
    cfg = model.config
    hd = cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator().manual_seed(SEED + 1)
    for layer in model.model.layers:
        attn = layer.self_attn
        attn.mem_k = torch.nn.Parameter(torch.randn(cfg.num_key_value_heads, NUM_MEM_KV, hd, generator=g))
        attn.mem_v = torch.nn.Parameter(torch.randn(cfg.num_key_value_heads, NUM_MEM_KV, hd, generator=g))
        attn.mask_upper_left = upper_left
    cfg._attn_implementation = "memkv"


# F06: GPT-1's post-LN block with the feed-forward residual taken from the block input
def _block_forward_ffn_residual_from_input(self, x, attention_mask=None, output_attentions=False):
    attn_outputs = self.attn(x, attention_mask=attention_mask, output_attentions=output_attentions)
    a = attn_outputs[0]
    n = self.ln_1(x + a)
    m = self.mlp(n)
    h = self.ln_2(x + m)  # BUG (F06): x (the block input) where n (the attention sub-layer's output) was meant
    return [h] + list(attn_outputs[1:])


def patch_ffn_residual_from_input(model):
    import types
    for block in model.transformer.h:
        block.forward = types.MethodType(_block_forward_ffn_residual_from_input, block)


# ----------------------------------------------------------------------------- optimizers

class LerpAdamW(torch.optim.Optimizer):
    """AdamW written out the way torch.optim.Adam's single-tensor path writes its moments:
    m.lerp_(g, 1 - beta1); v.mul_(beta2).addcmul_(g, g, value=1 - beta2); bias corrections; decoupled decay
    p *= 1 - lr wd; denom = v.sqrt() / sqrt(1 - beta2^t) + eps. sqrt_in_place is F08's bug: the denominator written
    v.sqrt_().div_(...).add_(eps), in-place ops on the second-moment state itself."""

    def __init__(self, params, lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0, sqrt_in_place=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.sqrt_in_place = sqrt_in_place

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                if wd:
                    p.mul_(1 - lr * wd)
                if self.sqrt_in_place:
                    # BUG (F08): the denominator built with in-place ops on the state itself: v.sqrt_() (and the
                    # division and eps) overwrite the second moment, so the next step's EMA starts from sqrt(v̂) + eps
                    denom = v.sqrt_().div_(math.sqrt(1 - b2 ** t)).add_(eps)
                else:
                    denom = (v.sqrt() / math.sqrt(1 - b2 ** t)).add_(eps)
                p.addcdiv_(m, denom, value=-lr / (1 - b1 ** t))
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


def gpt1_warmup(step, warmup=GPT1_WARMUP):
    """GPT-1's warm-up: linear from 0 over the first `warmup` updates."""
    return min(1.0, step / warmup)


def gpt1_cosine(step, total, warmup=GPT1_WARMUP):
    """GPT-1's annealing: a cosine from 1 to 0 over the steps after the warm-up."""
    p = min(1.0, max(0.0, (step - warmup) / max(1, total - warmup)))
    return 0.5 * (1 + math.cos(math.pi * p))


# ----------------------------------------------------------------------------- losses and data transforms

def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1), ignore_index=-100)


def router_z_loss(router_logits):
    """ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): mean over tokens of logsumexp(router logits)^2, averaged
    over the layers."""
    return sum(torch.logsumexp(r.float(), dim=-1).pow(2).mean() for r in router_logits) / len(router_logits)


def rdrop_kl(z1, z2, log_input=True):
    """R-Drop's symmetric KL (Liang et al. 2021; dropreg/R-Drop's compute_kl_loss): F.kl_div(log_softmax(p),
    softmax(q)) + F.kl_div(log_softmax(q), softmax(p)), halved; summed over the vocabulary, mean over positions.
    log_input=False is F09's bug: F.kl_div handed the probabilities, softmax(p), as its input, which it takes as
    log-probabilities."""
    z1, z2 = z1.float().reshape(-1, VOCAB), z2.float().reshape(-1, VOCAB)
    if log_input:
        a, b = F.log_softmax(z1, -1), F.log_softmax(z2, -1)
    else:
        a, b = F.softmax(z1, -1), F.softmax(z2, -1)  # BUG (F09): probabilities where log-probabilities go
    pa, pb = F.softmax(z1, -1), F.softmax(z2, -1)
    kl = F.kl_div(a, pb, reduction="none").sum(-1) + F.kl_div(b, pa, reduction="none").sum(-1)
    return kl.mean() / 2


def mlm_collate(chunk, g):
    """F02's bug: DataCollatorForLanguageModeling with its default mlm=True (torch_mask_tokens): 15% of the
    positions chosen; labels -100 everywhere else; of the chosen inputs 80% replaced by the mask token, 10% by a
    random token, 10% kept. The causal model then shifts the labels as usual."""
    labels = chunk.clone()
    chosen = torch.rand(chunk.shape, generator=g) < MLM_PROB
    labels[~chosen] = -100
    inputs = chunk.clone()
    replaced = (torch.rand(chunk.shape, generator=g) < 0.8) & chosen
    inputs[replaced] = MASK_ID
    rnd = (torch.rand(chunk.shape, generator=g) < 0.5) & chosen & ~replaced
    inputs[rnd] = torch.randint(VOCAB, chunk.shape, generator=g)[rnd]
    return inputs, labels


def nanogpt_get_batch(data):
    """H5's sampler, as nanoGPT's get_batch draws its windows: from the global torch RNG."""
    ix = torch.randint(len(data) - T - 1, (B,))
    return torch.stack([data[i:i + T + 1] for i in ix.tolist()])


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, optimizer (the object the loop steps), scheduler lambda(s) and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(clip=1.0, moe=False, autocast=False, rdrop=False, bug=bug, lams=None, compound_warmup=False)
    lam = lambda s: warmup_cosine_factor(s, steps)  # noqa: E731
    if twin.startswith("H1") or twin.startswith("H4"):
        model = hf_olmoe()
        o["moe"] = True
        if bug == "router_topk_swapped":
            patch_router_topk_swapped(model)
        if twin.startswith("H4"):
            add_memory_kv(model, upper_left=bug == "memkv_causal_upper_left")
            optimizer = LerpAdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95),
                                  sqrt_in_place=bug == "adam_sqrt_inplace_state")
        else:
            optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95))
    elif twin.startswith("H2"):
        model = hf_gpt1()
        if bug == "zero_head_tied":
            with torch.no_grad():
                model.lm_head.weight.zero_()  # BUG (F04): the head is the token embedding (tied): both are zeroed
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.01), lr=GPT1_LR, betas=(0.9, 0.999))
        if bug == "warmup_dampens_current_lr":
            o["compound_warmup"] = True
        lam = lambda s: gpt1_warmup(s) * gpt1_cosine(s, steps)  # noqa: E731
    elif twin.startswith("H3"):
        model = hf_gpt1()
        if bug == "ffn_residual_from_input":
            patch_ffn_residual_from_input(model)
        optimizer = torch.optim.Adamax(model.parameters(), lr=ADAMAX_LR, betas=(0.9, 0.999))
        o["autocast"] = True
    elif twin.startswith("H5"):
        model = hf_gpt1(dropout=DROPOUT)
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=RDROP_LR, betas=(0.9, 0.95))
        o["rdrop"] = True
    else:
        raise ValueError(twin)
    return model, optimizer, lam, o


def train_one(name, spec, steps, work, data, use_watch=True):
    train_text, val_text = data
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    model, optimizer, lam, o = build(name, spec, steps)
    bug = o["bug"]
    model.train()
    vb = val_batches(to_ids(val_text))
    shared = work / "_data" / "train.bin"
    if not shared.exists() or shared.stat().st_size != 2 * len(train_text):
        write_token_file(train_text, shared)
    stream = read_token_file(shared)
    loader = ByteWindows(stream, B, seed=SEED)
    stream_t = torch.from_numpy(stream)
    if o["compound_warmup"]:
        # F03: H2's schedule written with torch's chainable cosine (CosineAnnealingLR, whose step multiplies the
        # current lr by the ratio of successive cosine factors) after a hand-written linear warm-up from ~0 over
        # GPT1_WARMUP steps. BUG (F03): the warm-up scales the *current* lr, g["lr"] *= factor, where the initial
        # lr was meant, g["lr"] = g["initial_lr"] * factor: the factors compound (and the cosine carries the
        # product on), lr = peak x 1/20 x 2/20 x ... x 20/20 = peak x 20!/20^20
        cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps - GPT1_WARMUP, eta_min=0.0)
        for g_ in optimizer.param_groups:
            g_["lr"] *= 1 / GPT1_WARMUP

        class _Sched:
            k = 0

            def step(self):
                self.k += 1
                if self.k < GPT1_WARMUP:
                    for g_ in optimizer.param_groups:
                        g_["lr"] *= (self.k + 1) / GPT1_WARMUP  # BUG (F03): the current lr, not initial_lr
                else:
                    cosine.step()
        schedulers = [_Sched()]
    elif o["lams"]:
        schedulers = [torch.optim.lr_scheduler.LambdaLR(optimizer, f) for f in o["lams"]]
    else:
        schedulers = [torch.optim.lr_scheduler.LambdaLR(optimizer, lam)]
    clip_params = [p for p in model.parameters() if p.requires_grad]
    mlm_g = torch.Generator().manual_seed(SEED + 2)
    amp = (lambda: torch.autocast(device_type="cpu", dtype=torch.bfloat16)) if o["autocast"] else contextlib.nullcontext
    # BUG (F05): one autocast context around the whole loop (forward, backward, clipping, optimizer step,
    # evaluation) instead of one per forward: autocast's cache of the bfloat16 copies of the weights is cleared only
    # when the outermost autocast context exits, so every forward reuses the casts made at step 0
    outer = torch.autocast(device_type="cpu", dtype=torch.bfloat16) if bug == "autocast_whole_loop" \
        else contextlib.nullcontext()
    if o["rdrop"]:
        torch.manual_seed(SEED)  # the sampler and the dropout masks draw from the global RNG, seeded once

    def evaluate():
        model.eval()
        with torch.no_grad(), amp():
            vls = [ce(model(input_ids=xv).logits, yv).item() for xv, yv in vb]
        model.train()
        return sum(vls) / len(vls)

    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent, recent_opt = [], []
    log_opt = o["moe"] or o["rdrop"]
    t0 = time.time()
    with outer:
        for step in range(steps + 1):
            if o["rdrop"]:
                if bug == "reseed_every_step":
                    # BUG (F10): the loop re-seeds the global RNG at every step ("reproducible dropout") with the
                    # run's seed instead of seed + step: the sampler draws the same 16 windows and the dropout the
                    # same masks at every step
                    torch.manual_seed(SEED)
                chunk = nanogpt_get_batch(stream_t)
            else:
                chunk = next(it)
            if bug == "inputs_targets_unpacked_swapped":
                pair = (chunk[:, :-1], chunk[:, 1:])  # the collate returns (inputs, targets)
                y, x = pair  # BUG (F02): unpacked as (targets, inputs): the model reads bytes 1..T, learns bytes 0..T-1
            else:
                x, y = chunk[:, :-1], chunk[:, 1:]
            with amp():
                if o["moe"]:
                    out = model(input_ids=x, output_router_logits=True)
                    logits = out.logits
                    loss_ce = ce(logits, y)
                    loss = loss_ce + AUX_COEF * out.aux_loss + Z_COEF * router_z_loss(out.router_logits)
                elif o["rdrop"]:
                    logits = model(input_ids=x).logits
                    logits2 = model(input_ids=x).logits
                    loss_ce = (ce(logits, y) + ce(logits2, y)) / 2
                    loss = loss_ce + RDROP_ALPHA * rdrop_kl(logits, logits2, log_input=bug != "rdrop_kl_probs")
                else:
                    logits = model(input_ids=x).logits
                    loss_ce = ce(logits, y)
                    loss = loss_ce
            loss.backward()
            if use_watch:
                watch.step(loss)
            lval, lce = loss.item(), loss_ce.item()
            recent = (recent + [lce])[-10:]
            recent_opt = (recent_opt + [lval])[-10:]
            if o["clip"] is not None:
                torch.nn.utils.clip_grad_norm_(clip_params, o["clip"])
            if step % 10 == 0:
                vl = evaluate()
                rec = dict(step=step, loss=sum(recent) / len(recent), loss_step=lce, val_loss=vl,
                           lr=optimizer.param_groups[0]["lr"])
                if log_opt:
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
            for sch in schedulers:
                sch.step()
    if use_watch:
        watch.close()
    log.close()
    (folder / "run.json").write_text(json.dumps(dict(name=name, steps=steps, seconds=time.time() - t0, **spec)))
    return time.time() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run names, or prefixes (F03, F, H)")
    ap.add_argument("--steps", type=int, default=STEPS, help=f"optimizer steps per run [{STEPS}]")
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind15"))
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
