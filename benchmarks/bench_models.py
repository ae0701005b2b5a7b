"""The models the failure benchmark trains, and the blocks `check --module` reads back.

HF models (GPT-2, Llama, BERT as a causal Post-LN decoder) are saved with save_pretrained, as
users save them. The nanoGPT-style model carries the two bugs that live in code rather than in
weights — a missing causal mask, a residual that adds the normed tensor — and its checkpoints
are safetensors of its state dict; `block()` rebuilds its first block from the checkpoint named
by BLOCKTRACE_BENCH_CHECKPOINT, for `blocktrace check --module bench_models:block`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

D_MODEL, N_HEAD, N_LAYER, CONTEXT = 64, 4, 4, 128


class Attention(nn.Module):  # nanoGPT's CausalSelfAttention
    def __init__(self, d: int, heads: int, causal: bool, mask_off_by_one: bool = False, view_bug: bool = False):
        super().__init__()
        self.c_attn, self.c_proj, self.heads, self.causal = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, causal
        self.mask_off_by_one, self.view_bug = mask_off_by_one, view_bug

    def forward(self, x):
        b, t, c = x.shape
        if self.view_bug:  # the bug (Karpathy's mistake 6): .view(B, heads, T, d) where a transpose is needed
            q, k, v = (z.reshape(b, self.heads, t, c // self.heads) for z in self.c_attn(x).split(c, 2))
        else:
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        if self.mask_off_by_one:  # the bug: tril(…, diagonal=1) lets each token see the next one
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril(diagonal=1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class SequenceNorm(nn.Module):
    """The bug: a LayerNorm over the sequence instead of the features (normalises each feature across tokens)."""

    def __init__(self, d: int):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        centred = x - x.mean(dim=1, keepdim=True)
        return centred / (centred.pow(2).mean(dim=1, keepdim=True) + 1e-5).sqrt() * self.weight + self.bias


NORMS = {"layernorm": nn.LayerNorm, "identity": lambda d: nn.Identity(), "sequence": SequenceNorm}


class Block(nn.Module):  # nanoGPT's Block, with the bug under test switched on
    def __init__(self, d: int, heads: int, causal: bool = True, residual_normed: bool = False,
                 mask_off_by_one: bool = False, norm: str = "layernorm", ffn_residual: bool = True,
                 view_bug: bool = False):
        super().__init__()
        self.ln_1, self.ln_2 = NORMS[norm](d), NORMS[norm](d)
        self.attn = Attention(d, heads, causal, mask_off_by_one, view_bug)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.residual_normed, self.ffn_residual = residual_normed, ffn_residual

    def forward(self, x):
        normed = self.ln_1(x)
        x = (normed if self.residual_normed else x) + self.attn(normed)  # the bug: normed + attn(normed)
        normed = self.ln_2(x)
        if not self.ffn_residual:  # the bug: the FFN's output replaces the stream
            return self.mlp(normed)
        return (normed if self.residual_normed else x) + self.mlp(normed)


BLOCK_OPTIONS = ("causal", "residual_normed", "mask_off_by_one", "norm", "ffn_residual", "view_bug")


class NanoGPT(nn.Module):
    def __init__(self, vocab: int, shift: bool = True, softmax_output: bool = False, reduction: str = "mean",
                 **block_options):
        super().__init__()
        self.options = {"vocab": vocab, **block_options}
        self.shift = shift  # False, the bug: position t is trained to predict its own token
        self.softmax_output = softmax_output  # True, the bug (Karpathy's mistake 4): probabilities into the loss
        self.reduction = reduction  # "sum", the bug: the loss grows with the batch
        self.wte, self.wpe = nn.Embedding(vocab, D_MODEL), nn.Embedding(CONTEXT, D_MODEL)
        self.h = nn.ModuleList(Block(D_MODEL, N_HEAD, **block_options) for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.apply(_init)

    def forward(self, ids, labels=None):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        if self.softmax_output:
            logits = torch.softmax(logits, dim=-1)
        loss = None
        if labels is not None:
            shift = 1 if self.shift else 0
            loss = F.cross_entropy(logits[:, : logits.shape[1] - shift].reshape(-1, logits.shape[-1]),
                                   labels[:, shift:].reshape(-1), reduction=self.reduction)
        return type("Output", (), {"loss": loss, "logits": logits})()

    def save(self, directory: Path) -> None:
        from safetensors.torch import save_file

        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.state_dict().items()}, str(directory / "model.safetensors"))
        (directory / "nano.json").write_text(json.dumps(self.options))


def _init(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)


def block() -> nn.Module:
    """The first block of the checkpoint in BLOCKTRACE_BENCH_CHECKPOINT, for `check --module`."""
    from safetensors.torch import load_file

    directory = Path(os.environ["BLOCKTRACE_BENCH_CHECKPOINT"])
    options = json.loads((directory / "nano.json").read_text())
    layer = Block(D_MODEL, N_HEAD, **{k: v for k, v in options.items() if k in BLOCK_OPTIONS})
    state = load_file(str(directory / "model.safetensors"))
    layer.load_state_dict({k[len("h.0."):]: v for k, v in state.items() if k.startswith("h.0.")})
    return layer.eval()
