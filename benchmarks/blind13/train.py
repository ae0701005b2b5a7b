"""Train every run of the thirteenth blind benchmark (see runs.py / README.md), one output folder per run.

    python train.py [--only NAME ...] [--steps N] [--work DIR]

The setting of benchmarks/blind12/ (byte-level language models on Python's own standard library: the
top-level modules for training, the email/ package held out), with new models (HF Apertus, Seed-OSS, LFM2,
OLMo-1 and Cohere2, built from configs), new recipes (token-level unlikelihood training; packed documents with
a custom 4D block-diagonal mask and restarting position ids; Adam-atan2 with a cautious mask and fully
decoupled weight decay; SGD on parameter groups that carry their own learning rates; the confidence penalty)
and new bugs. Each run writes <work>/<name>/watch.jsonl (a blocktrace Watch in the loop) and
<work>/<name>/log.jsonl (step, loss = mean training cross-entropy of the last 10 steps, loss_step, loss_opt =
the optimised loss of the last 10 steps where it is not the plain cross-entropy, val_loss = held-out
cross-entropy of the training model, lr of the first parameter group).
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
UL_ALPHA = 1.0  # H1: unlikelihood weight (Welleck et al. 2019: alpha 1.0 for token-level UL)
SEP = 0  # H2: the byte that separates packed documents (absent from the corpus)
ATAN2_A, ATAN2_B = 1.27, 1.0  # H3: lucidrains/adam-atan2-pytorch defaults
DECOUPLED_WD = 3e-4  # H3: fully decoupled weight decay per step at the peak lr (= AdamW wd 0.1 at lr 3e-3)
SGD_LR = 0.3  # H4
SGD_WARMUP_RATIO = 0.1  # H4: 16 of 160 steps
CONF_BETA = 0.1  # H5: confidence penalty weight


# ----------------------------------------------------------------------------- data

def training_files():
    root = Path(json.__file__).parent.parent
    return sorted(root.glob("*.py"))


def corpus_bytes():
    root = Path(json.__file__).parent.parent
    train = b"".join(p.read_bytes() for p in training_files())
    val = b"".join(p.read_bytes() for p in sorted((root / "email").rglob("*.py")))
    return train, val


def packed_documents():
    """H2's stream: every training module cut at its top-level separators (two blank lines, PEP 8) into
    documents, joined by the separator byte SEP (0, absent from the text)."""
    docs = []
    for p in training_files():
        docs += [d for d in p.read_bytes().split(b"\n\n\n") if d.strip()]
    return bytes([SEP]).join(docs) + bytes([SEP])


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


def packing_inputs(x, causal=True):
    """H2's collator: from a (B, T) window of the packed stream, the document of every position (a separator ends
    its document), a 4D boolean mask (B, 1, T, T) that lets position t attend to position s of the same document
    with s <= t (True = attend, transformers' convention for a boolean 4D mask, used as given), and position ids
    that restart at 0 at every document. causal=False is F03's bug."""
    is_sep = (x == SEP).long()
    doc = is_sep.cumsum(-1) - is_sep  # the separator belongs to the document it ends
    same = doc[:, :, None] == doc[:, None, :]
    if causal:
        mask = same & torch.ones(T, T, dtype=torch.bool).tril()[None]
    else:
        mask = same  # BUG (F03): the block-diagonal document mask without its causal part
    idx = torch.arange(x.shape[1]).expand_as(x)
    start = torch.where(torch.cat([torch.ones_like(is_sep[:, :1]), is_sep[:, :-1]], 1).bool(), idx,
                        torch.zeros_like(idx)).cummax(-1).values
    return mask[:, None], idx - start


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
                attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def _build(config_cls, model_cls, **kw):
    c = _cfg_common()
    c.update(kw)
    cfg = config_cls(**c)
    cfg._attn_implementation = "sdpa"
    return model_cls(cfg)


def hf_apertus():
    from transformers import ApertusConfig, ApertusForCausalLM
    return _build(ApertusConfig, ApertusForCausalLM, tie_word_embeddings=False)


def hf_seedoss():
    from transformers import SeedOssConfig, SeedOssForCausalLM
    return _build(SeedOssConfig, SeedOssForCausalLM, tie_word_embeddings=False)


def hf_lfm2():
    from transformers import Lfm2Config, Lfm2ForCausalLM
    return _build(Lfm2Config, Lfm2ForCausalLM, tie_word_embeddings=True,
                  layer_types=["conv", "full_attention", "conv"])


def hf_olmo():
    from transformers import OlmoConfig, OlmoForCausalLM
    return _build(OlmoConfig, OlmoForCausalLM, tie_word_embeddings=False)


def hf_cohere2():
    from transformers import Cohere2Config, Cohere2ForCausalLM
    return _build(Cohere2Config, Cohere2ForCausalLM, tie_word_embeddings=True, logit_scale=1.0,
                  layer_types=["full_attention"] * 3)


@torch.no_grad()
def reinit_linears(model, std=0.02, positional=False):
    """H5's own init pass over the block matrices (as a custom _init_weights does): every nn.Linear weight drawn
    from N(0, std). positional is F09's bug: nn.init.normal_(w, std), whose second positional parameter is the
    mean (normal_(tensor, mean=0.0, std=1.0)): N(0.02, 1)."""
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings():
            if positional:
                torch.nn.init.normal_(m.weight, std)  # BUG (F09): mean=std, std=1.0
            else:
                torch.nn.init.normal_(m.weight, mean=0.0, std=std)


# ----------------------------------------------------------------------------- optimizers

class CautiousAdamAtan2(torch.optim.Optimizer):
    """Adam-atan2 (Everett et al. 2024, "Scaling Exponents Across Parameterizations and Optimizers", §4; after
    lucidrains/adam-atan2-pytorch): update = a * atan2(m_hat, b * sqrt(v_hat)), no eps; the cautious mask of Liang
    et al. 2024 ("Cautious Optimizers", kyleliang919/C-Optim): the update kept where update * grad > 0 (p moves
    by -lr * update, so against the gradient), rescaled by 1 / mean(mask); fully decoupled weight decay as
    lucidrains' decoupled_wd: wd / init_lr, so p *= 1 - lr * wd / init_lr (DECOUPLED_WD per step at the peak).
    additive_mask is F05's bug (the optax-convention condition update * grad < 0); wd_in_loop is F06's
    (wd /= init_lr inside the loop over the group's parameters, lucidrains/adam-atan2-pytorch#5)."""

    def __init__(self, params, lr, betas=(0.9, 0.95), weight_decay=0.0, a=ATAN2_A, b=ATAN2_B,
                 additive_mask=False, wd_in_loop=False):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay, a=a, b=b))
        self.init_lr = lr
        self.additive_mask, self.wd_in_loop = additive_mask, wd_in_loop

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, a, b = group["lr"], group["a"], group["b"]
            wd = group["weight_decay"]
            if not self.wd_in_loop:
                wd /= self.init_lr
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if self.wd_in_loop:
                    wd /= self.init_lr  # BUG (F06): inside the loop, so it compounds over the group's parameters
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                t = st["step"]
                if wd:
                    p.mul_(1 - lr * wd)
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.lerp_(g, 1 - b1)
                v.lerp_(g * g, 1 - b2)
                m_hat = m / (1 - b1 ** t)
                v_hat = v / (1 - b2 ** t)
                update = torch.atan2(m_hat, b * v_hat.sqrt()).mul_(a)
                if self.additive_mask:
                    mask = (update * g < 0).to(g.dtype)  # BUG (F05): optax's additive-convention condition
                else:
                    mask = (update * g > 0).to(g.dtype)
                mask.div_(mask.mean().clamp_(min=1e-3))
                p.add_(update * mask, alpha=-lr)
        return None


def matrix_groups(model, wd):
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def sgd_groups(model):
    """H4's parameter groups, each with its own lr (and no lr given to the optimizer itself): the block matrices at
    SGD_LR with weight decay 1e-4, the embedding, head and vectors at SGD_LR without."""
    emb = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    mats = [p for p in model.parameters() if p.dim() >= 2 and id(p) not in emb]
    rest = [p for p in model.parameters() if p.dim() < 2 or id(p) in emb]
    return [{"params": mats, "lr": SGD_LR, "weight_decay": 1e-4}, {"params": rest, "lr": SGD_LR, "weight_decay": 0.0}]


# ----------------------------------------------------------------------------- schedules

def warmup_cosine_factor(step, total, warmup=WARMUP, floor=FLOOR):
    """min(1, (step + 1) / warmup) times a cosine from 1 to floor over `total` steps."""
    p = min(1.0, step / max(1, total))
    cos = floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return min(1.0, (step + 1) / warmup) * cos


def hf_cosine_with_warmup_factor(step, num_warmup_steps, num_training_steps, floor=FLOOR):
    """transformers' get_cosine_schedule_with_warmup lambda (linear warm-up from 0, then a half cosine), with a
    floor of 10% of the peak: step / max(1, num_warmup_steps) while step < num_warmup_steps."""
    if step < num_warmup_steps:
        return float(step) / float(max(1, num_warmup_steps))
    progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
    return floor + (1 - floor) * max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


# ----------------------------------------------------------------------------- losses

def ce(logits, y):
    return F.cross_entropy(logits.float().reshape(-1, VOCAB), y.reshape(-1))  # ignore_index -100


def unlikelihood(logits, y, probs_from_logprobs=False):
    """Token-level unlikelihood (Welleck et al. 2019, facebookresearch/unlikelihood_training's
    candidate_penalty_ce_loss): for each position, -sum over the negative candidates c of log(1 - p_c), the
    candidates being the distinct targets of the earlier positions of the row (its previous context), the
    position's own target excluded; mean over positions; p = exp(log_softmax(z)) as the reference code's
    lprobs.exp(). probs_from_logprobs is F02's bug (the exp omitted: 1 - log p >= 1)."""
    bsz, tl, v = logits.shape
    onehot = F.one_hot(y, v).float()
    seen = (onehot.cumsum(1) - onehot) > 0
    seen = seen.scatter(-1, y.unsqueeze(-1), False)  # the target is not its own negative candidate
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    if probs_from_logprobs:
        p = lprobs  # BUG (F02): the exp of the log-probabilities omitted
    else:
        p = lprobs.exp()
    one_minus = torch.clamp(1.0 - p, min=1e-5)
    return -(torch.log(one_minus) * seen).sum(-1).mean()


def entropy_term(logits, summed=False):
    """The confidence penalty's entropy H(p) = -sum p log p of each position, averaged over positions. summed is
    F10's bug (summed over the batch's 2,048 positions)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    h = -(logp.exp() * logp).sum(-1)
    if summed:
        return h.sum()  # BUG (F10): reduction 'sum' over the 2,048 positions
    return h.mean()


# ----------------------------------------------------------------------------- one run

def build(name, spec, steps):
    """Model, optimizer (the object the loop steps), scheduler lambda and loop options of one run."""
    bug = spec["bug"]
    twin = spec["twin"] or name
    torch.manual_seed(SEED)
    o = dict(clip=1.0, ul=False, packed=False, conf=False, bug=bug)
    lam = lambda s: warmup_cosine_factor(s, steps)  # noqa: E731
    if twin.startswith("H1"):
        model = hf_apertus()
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
        o["ul"] = True
        if bug == "schedule_args_swapped":
            # BUG (F01): get_cosine_schedule_with_warmup(optimizer, num_training_steps, num_warmup_steps)
            lam = lambda s: hf_cosine_with_warmup_factor(s, steps, WARMUP)  # noqa: E731
        else:
            lam = lambda s: hf_cosine_with_warmup_factor(s, WARMUP, steps)  # noqa: E731
    elif twin.startswith("H2"):
        model = hf_seedoss()
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
        o["packed"] = True
    elif twin.startswith("H3"):
        model = hf_lfm2()
        optimizer = CautiousAdamAtan2(matrix_groups(model, DECOUPLED_WD), lr=3e-3, betas=(0.9, 0.95),
                                      additive_mask=bug == "cautious_additive_convention",
                                      wd_in_loop=bug == "decoupled_wd_compounded")
    elif twin.startswith("H4"):
        model = hf_olmo()
        optimizer = torch.optim.SGD(sgd_groups(model), momentum=0.9,
                                    nesterov=True)
        if bug == "warmup_ratio_as_steps":
            n_warm = SGD_WARMUP_RATIO  # BUG (F08): the ratio passed as the number of warm-up steps
        else:
            n_warm = int(SGD_WARMUP_RATIO * steps)
        lam = lambda s: hf_cosine_with_warmup_factor(s, n_warm, steps)  # noqa: E731
    elif twin.startswith("H5"):
        model = hf_cohere2()
        reinit_linears(model, positional=bug == "init_normal_positional")
        optimizer = torch.optim.AdamW(matrix_groups(model, 0.1), lr=3e-3, betas=(0.9, 0.95))
        o["conf"] = True
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
    if o["packed"]:
        shared = work / "_data" / "train_packed.bin"
        text = packed_documents()
    else:
        shared = work / "_data" / "train.bin"
        text = train_text
    if not shared.exists() or shared.stat().st_size != 2 * len(text):
        write_token_file(text, shared)
    stream = read_token_file(shared)
    loader = ByteWindows(stream, B, seed=SEED)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lam)
    if bug == "clip_filter_exhausted":
        # BUG (F07): a filter object is an iterator: the first clip_grad_norm_ call consumes it
        clip_params = filter(lambda p: p.requires_grad, model.parameters())
    else:
        clip_params = [p for p in model.parameters() if p.requires_grad]

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
    log_opt = o["ul"] or o["conf"]
    t0 = time.time()
    for step in range(steps + 1):
        chunk = next(it)
        x, y = chunk[:, :-1], chunk[:, 1:]
        if o["packed"]:
            mask4d, pos = packing_inputs(x, causal=bug != "docmask_not_causal")
            if bug == "docmask_float":
                mask4d = mask4d.float()  # BUG (F04): 1.0 / 0.0, which transformers adds to the scores
            logits = model(input_ids=x, attention_mask=mask4d, position_ids=pos).logits
            # no label across a document boundary: the prediction made at a separator is not trained
            y = y.masked_fill(x == SEP, -100)
        else:
            logits = model(input_ids=x).logits
        loss_ce = ce(logits, y)
        if o["ul"]:
            loss = loss_ce + UL_ALPHA * unlikelihood(logits, y, probs_from_logprobs=bug == "ul_exp_omitted")
        elif o["conf"]:
            loss = loss_ce - CONF_BETA * entropy_term(logits, summed=bug == "entropy_summed")
        else:
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
    ap.add_argument("--work", default=os.environ.get("BLIND_WORK", "/work/bench-out/blind13"))
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
