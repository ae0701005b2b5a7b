"""Train every run of the fourteenth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind13/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF OLMo-3, GPTBigCode
(SantaCoder/StarCoder-1), Gemma-3 and Persimmon, built from configs), new recipes (AdEMAMix; fill-in-the-middle
training; a reservoir layer frozen at its random init; the Poly-1 loss; the Grokfast gradient filter) and new bugs.
Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and <work>/<name>/log.jsonl (step,
loss = mean training cross-entropy of the last 10 steps, loss_step, loss_opt = the optimised loss of the last 10
steps where it is not the plain cross-entropy, val_loss = held-out cross-entropy of the training model, lr of the
first parameter group).
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
# H1: AdEMAMix (Pagliardini, Ablin & Grangier 2024; apple/ml-ademamix): betas (0.9, 0.999, 0.9999), alpha 5,
# the alpha and beta3 schedulers over the whole run (T_alpha = T_beta3 = the number of steps)
ADEMAMIX_BETAS = (0.9, 0.999, 0.9999)
ADEMAMIX_ALPHA = 5.0
# H2: fill-in-the-middle (Bavarian et al. 2022; SantaCoder / StarCoder): FIM rate 0.5, SPM rate 0.5, three
# sentinel bytes absent from the corpus
FIM_RATE, FIM_SPM_RATE = 0.5, 0.5
FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE = 1, 2, 3
ETA_MIN_RATIO = 0.1  # H2: the cosine ends at eta_min = 10% of the peak
RESERVOIR_LAYER = 1  # H3: the middle layer stays at its random init (Shen et al. 2021)
POLY_EPS = 1.0  # H4: Poly-1 (Leng et al. 2022)
GROK_ALPHA, GROK_LAMB = 0.98, 2.0  # H5: Grokfast-EMA (Lee et al. 2024; ironjr/grokfast defaults)


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


def fim_permute(sample, rng):
    """The FIM transformation of one window (after loubnabnl/santacoder-finetuning's fim.py and bigcode's
    Megatron-LM): with probability FIM_RATE, cut the window at two uniform boundaries into prefix / middle / suffix
    and rearrange it as PSM, <PRE> prefix <SUF> suffix <MID> middle, or (with probability FIM_SPM_RATE) as SPM,
    <PRE> <SUF> suffix <MID> prefix middle (StarCoder's SPM variant); the suffix is truncated by the three sentinels
    so that the window keeps its length. Otherwise the window is left as it is."""
    if rng.random() >= FIM_RATE:
        return sample
    n = len(sample)
    lo, hi = sorted(rng.integers(0, n + 1, size=2).tolist())
    prefix, middle, suffix = sample[:lo], sample[lo:hi], sample[hi:]
    cut = len(suffix) - 3
    if cut < 0:  # no room for the sentinels in the suffix: leave the window as it is
        return sample
    suffix = suffix[:cut]
    pre, suf, mid = (torch.tensor([t]) for t in (FIM_PREFIX, FIM_SUFFIX, FIM_MIDDLE))
    if rng.random() < FIM_SPM_RATE:
        out = torch.cat([pre, suf, suffix, mid, prefix, middle])
    else:
        out = torch.cat([pre, prefix, suf, suffix, mid, middle])
    assert len(out) == n
    return out


def val_batches(val, n=32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    ix = torch.randint(len(val) - T - 1, (n,), generator=g)
    chunk = torch.stack([val[i:i + T + 1] for i in ix.tolist()])
    x, y = chunk[:, :-1], chunk[:, 1:]
    return [(x[i:i + 16], y[i:i + 16]) for i in range(0, n, 16)]


# ----------------------------------------------------------------------------- HF models

def _cfg_common():
    return dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, max_position_embeddings=T, initializer_range=0.02,
                attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def _build(config_cls, model_cls, **kw):
    c = _cfg_common()
    c.update(kw)
    cfg = config_cls(**c)
    cfg._attn_implementation = "sdpa"
    return model_cls(cfg)


def hf_olmo3():
    from transformers import Olmo3Config, Olmo3ForCausalLM
    return _build(Olmo3Config, Olmo3ForCausalLM, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=4096)


def hf_bigcode():
    from transformers import GPTBigCodeConfig, GPTBigCodeForCausalLM
    cfg = GPTBigCodeConfig(vocab_size=VOCAB, n_positions=T, n_embd=128, n_layer=3, n_head=4, n_inner=512,
                           multi_query=True, activation_function="gelu_pytorch_tanh", resid_pdrop=0.0,
                           embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.02, tie_word_embeddings=True,
                           bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    return GPTBigCodeForCausalLM(cfg)


def hf_gemma3(bidirectional=False):
    from transformers import Gemma3TextConfig, Gemma3ForCausalLM
    return _build(Gemma3TextConfig, Gemma3ForCausalLM, tie_word_embeddings=True, query_pre_attn_scalar=32,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=4096,
                  # BUG (F10) when bidirectional: EmbeddingGemma's flag left on in a causal LM's config
                  use_bidirectional_attention=bidirectional)


def hf_persimmon():
    from transformers import PersimmonConfig, PersimmonForCausalLM
    c = _cfg_common()
    for k in ("num_key_value_heads", "head_dim"):
        c.pop(k)
    c.update(intermediate_size=512, qk_layernorm=True, hidden_dropout=0.0, tie_word_embeddings=False,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    cfg = PersimmonConfig(**c)
    cfg._attn_implementation = "sdpa"
    return PersimmonForCausalLM(cfg)


class LlamaStyleRMSNorm(torch.nn.Module):
    """F06's bug: a fused RMSNorm in Llama's form, x_hat * w, patched in for Gemma-3's norms, whose weights are
    stored as an offset from 1 (Gemma computes x_hat * (1 + w), w initialised at 0): the offset is dropped."""

    def __init__(self, gemma_norm):
        super().__init__()
        self.weight = gemma_norm.weight  # the same Parameter (zeros at init)
        self.eps = gemma_norm.eps

    def forward(self, x):
        xf = x.float()
        out = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * self.weight.float()).type_as(x)  # BUG (F06): Gemma's 1 + w written as w


def patch_rmsnorm_without_offset(model):
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Gemma3RMSNorm):
                setattr(parent, name, LlamaStyleRMSNorm(child))


# ----------------------------------------------------------------------------- optimizers

def _ademamix_alpha(step, alpha, total):
    return min(step * alpha / total, alpha)


def _ademamix_beta3(step, beta_start, beta_end, total):
    if step >= total:
        return beta_end
    t = step / total
    ls, le = math.log(beta_start), math.log(beta_end)
    return math.exp(ls * le / ((1 - t) * le + t * ls))


class AdEMAMix(torch.optim.Optimizer):
    """AdEMAMix (Pagliardini, Ablin & Grangier 2024, "The AdEMAMix Optimizer: Better, Faster, Older", Algorithm 1;
    after apple/ml-ademamix's PyTorch code): a fast EMA m1 (beta1) and a slow EMA m2 (beta3) of the gradients,
    update = (m1_hat + alpha m2) / (sqrt(v_hat) + eps) + wd p, with alpha and beta3 warmed up over T steps by the
    paper's schedulers; m2 has no bias correction. slow_bias_correction is F02's bug (m2 divided by 1 - beta3^t,
    as Adam does for m1)."""

    def __init__(self, params, lr, betas=ADEMAMIX_BETAS, alpha=ADEMAMIX_ALPHA, T_alpha_beta3=None, eps=1e-8,
                 weight_decay=0.0, slow_bias_correction=False):
        super().__init__(params, dict(lr=lr, betas=betas, alpha=alpha, T_alpha_beta3=T_alpha_beta3, eps=eps,
                                      weight_decay=weight_decay))
        self.slow_bias_correction = slow_bias_correction

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            b1, b2, b3_final = group["betas"]
            alpha_final, T_ab = group["alpha"], group["T_alpha_beta3"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg_fast"] = torch.zeros_like(p)
                    st["exp_avg_slow"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
                if T_ab is not None:
                    alpha = _ademamix_alpha(t, alpha_final, T_ab)
                    b3 = _ademamix_beta3(t, b1, b3_final, T_ab)
                else:
                    alpha, b3 = alpha_final, b3_final
                m1, m2, v = st["exp_avg_fast"], st["exp_avg_slow"], st["exp_avg_sq"]
                m1.mul_(b1).add_(g, alpha=1 - b1)
                m2.mul_(b3).add_(g, alpha=1 - b3)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                denom = (v.sqrt() / math.sqrt(bc2)).add_(eps)
                slow = m2
                if self.slow_bias_correction:
                    slow = m2 / (1 - b3 ** t)  # BUG (F02): Adam's bias correction carried over to the slow EMA
                update = (m1 / bc1 + alpha * slow) / denom
                if wd:
                    update.add_(p, alpha=wd)
                p.add_(update, alpha=-lr)
        return None


def gradfilter_ema(m, grads=None, alpha=GROK_ALPHA, lamb=GROK_LAMB):
    """Grokfast-EMA, as ironjr/grokfast's grokfast.py writes it: an EMA of each parameter's gradient (alpha) added,
    times lamb, to the gradient before the optimizer step; returns the EMA state for the next call."""
    if grads is None:
        grads = {n: p.grad.data.detach() for n, p in m.named_parameters() if p.requires_grad and p.grad is not None}
    for n, p in m.named_parameters():
        if p.requires_grad and p.grad is not None:
            grads[n] = grads[n] * alpha + p.grad.data.detach() * (1 - alpha)
            p.grad.data = p.grad.data + grads[n] * lamb
    return grads


def matrix_groups(params, wd):
    params = list(params)
    decay = [p for p in params if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in params if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def freeze_reservoir(model, attribute_bug=False):
    """H3's reservoir layer (Shen et al. 2021, "Reservoir Transformers"): every parameter frozen, then the trained
    parts switched back on: the embedding (and the head tied to it), the first and last decoder layers and the final
    norm; the middle layer stays at its random initialisation. attribute_bug is F05's bug: the layers are switched
    on with `layer.requires_grad = True`, which sets a plain attribute on the Module and leaves its parameters
    frozen."""
    model.requires_grad_(False)
    model.get_input_embeddings().weight.requires_grad = True
    model.model.norm.weight.requires_grad = True
    for i, layer in enumerate(model.model.layers):
        if i == RESERVOIR_LAYER:
            continue
        if attribute_bug:
            layer.requires_grad = True  # BUG (F05): a Module attribute, not requires_grad_(True)
        else:
            layer.requires_grad_(True)


# ----------------------------------------------------------------------------- schedules

def warmup_cosine_factor(step, total, warmup=WARMUP, floor=FLOOR):
    """min(1, (step + 1) / warmup) times a cosine from 1 to floor over `total` steps."""
    p = min(1.0, step / max(1, total))
    cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / warmup) * cos


def warmup_cosine_eta_min_factor(step, total, base_lr, eta_min, warmup=WARMUP):
    """H2's schedule written with an absolute minimum, as CosineAnnealingLR's closed form: lr = eta_min + (base_lr -
    eta_min) (1 + cos(pi p)) / 2, after a linear warm-up; returned as a factor of base_lr."""
    p = min(1.0, step / max(1, total))
    lr = eta_min + (base_lr - eta_min) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / warmup) * lr / base_lr


def hf_cosine_with_warmup_factor(step, num_warmup_steps, num_training_steps, num_cycles=0.5):
    """transformers' get_cosine_schedule_with_warmup lambda (_get_cosine_schedule_with_warmup_lr_lambda):
    max(0, 0.5 (1 + cos(pi 2 num_cycles progress))) after a linear warm-up."""
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))


# ----------------------------------------------------------------------------- losses

def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))


def poly1(logits, y, sigmoid_pt=False):
    """Poly-1 (Leng et al. 2022, "PolyLoss", eq. 3): CE + epsilon (1 - p_t), p_t the softmax probability of the
    target, mean over positions. sigmoid_pt is F07's bug: p_t taken as sigmoid(z_t), the form of the paper's
    Poly-1 focal loss (sigmoid-based), in the softmax cross-entropy's place."""
    z = logits.float().reshape(-1, VOCAB)
    yy = y.reshape(-1)
    ce_ = F.cross_entropy(z, yy)
    zt = z.gather(-1, yy[:, None]).squeeze(-1)
    if sigmoid_pt:
        pt = torch.sigmoid(zt)  # BUG (F07): the focal (sigmoid) form's p_t
    else:
        pt = torch.softmax(z, dim=-1).gather(-1, yy[:, None]).squeeze(-1)
    return ce_ + POLY_EPS * (1 - pt).mean()


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, optimizer (the object the loop steps), scheduler lambda and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(clip=1.0, fim=False, poly=False, grokfast=False, bug=bug)
    lam = lambda s: warmup_cosine_factor(s, steps)  # noqa: E731
    if twin.startswith("H1"):
        model = hf_olmo3()
        optimizer = AdEMAMix(matrix_groups(model.parameters(), 0.1), lr=LR, T_alpha_beta3=steps,
                             slow_bias_correction=bug == "ademamix_slow_bias_corrected")
        if bug == "clip_max_norm_zero":
            o["clip"] = 0.0  # BUG (F01): max_grad_norm 0 ("0 = off" in the config), no `> 0` guard before clipping
    elif twin.startswith("H2"):
        model = hf_bigcode()
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95))
        o["fim"] = True
        if bug == "eta_min_ratio":
            eta_min = ETA_MIN_RATIO  # BUG (F04): the ratio given where the absolute minimum lr is read
        else:
            eta_min = ETA_MIN_RATIO * LR
        lam = lambda s: warmup_cosine_eta_min_factor(s, steps, LR, eta_min)  # noqa: E731
    elif twin.startswith("H3"):
        model = hf_gemma3()
        if bug == "rmsnorm_offset_dropped":
            patch_rmsnorm_without_offset(model)
        freeze_reservoir(model, attribute_bug=bug == "unfreeze_module_attribute")
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(matrix_groups(trainable, 0.1), lr=LR, betas=(0.9, 0.95))
    elif twin.startswith("H4"):
        model = hf_persimmon()
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95))
        o["poly"] = True
        # BUG (F08) when num_cycles=3: the restart count of the hard-restarts schedule given to the plain cosine
        cycles = 3 if bug == "cosine_num_cycles" else 0.5
        lam = lambda s: hf_cosine_with_warmup_factor(s, WARMUP, steps, num_cycles=cycles)  # noqa: E731
    elif twin.startswith("H5"):
        model = hf_gemma3(bidirectional=bug == "bidirectional_flag")
        optimizer = torch.optim.AdamW(matrix_groups(model.parameters(), 0.1), lr=LR, betas=(0.9, 0.95))
        o["grokfast"] = True
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
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
    clip_params = [p for p in model.parameters() if p.requires_grad]
    fim_rng = np.random.default_rng(SEED)
    grads = None

    def evaluate():
        model.eval()
        with torch.no_grad():
            vls = [ce(model(input_ids=xv).logits, yv).item() for xv, yv in vb]
        model.train()
        return sum(vls) / len(vls)

    it = iter(loader)
    if use_watch:
        watch = Watch(model, folder / "watch.jsonl", every=10, optimizer=optimizer, overwrite=True)
    log = open(folder / "log.jsonl", "w")
    recent, recent_opt = [], []
    log_opt = o["poly"]
    t0 = time.time()
    for step in range(steps + 1):
        chunk = next(it)
        if o["fim"]:
            fim_chunk = torch.stack([fim_permute(row, fim_rng) for row in chunk])
            if bug == "fim_inputs_only":
                # BUG (F03): the FIM permutation applied to the inputs only; the labels are cut from the window
                # as it was before the permutation
                x, y = fim_chunk[:, :-1], chunk[:, 1:]
            else:
                x, y = fim_chunk[:, :-1], fim_chunk[:, 1:]
        else:
            x, y = chunk[:, :-1], chunk[:, 1:]
        logits = model(input_ids=x).logits
        loss_ce = ce(logits, y)
        if o["poly"]:
            loss = poly1(logits, y, sigmoid_pt=bug == "poly1_sigmoid_pt")
        else:
            loss = loss_ce
        loss.backward()
        if use_watch:
            watch.step(loss)
        lval, lce = loss.item(), loss_ce.item()
        recent = (recent + [lce])[-10:]
        recent_opt = (recent_opt + [lval])[-10:]
        if o["grokfast"]:
            if bug == "grokfast_args_swapped":
                grads = gradfilter_ema(model, grads, GROK_LAMB, GROK_ALPHA)  # BUG (F09): (alpha, lamb) swapped
            else:
                grads = gradfilter_ema(model, grads, alpha=GROK_ALPHA, lamb=GROK_LAMB)
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind14"))
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
