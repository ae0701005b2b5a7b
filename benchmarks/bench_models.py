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
    def __init__(self, d: int, heads: int, causal: bool):
        super().__init__()
        self.c_attn, self.c_proj, self.heads, self.causal = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, causal

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, 2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):  # nanoGPT's Block, with the bug under test switched on
    def __init__(self, d: int, heads: int, causal: bool = True, residual_normed: bool = False):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), Attention(d, heads, causal), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.residual_normed = residual_normed

    def forward(self, x):
        normed = self.ln_1(x)
        x = (normed if self.residual_normed else x) + self.attn(normed)  # the bug: normed + attn(normed)
        normed = self.ln_2(x)
        return (normed if self.residual_normed else x) + self.mlp(normed)


class NanoGPT(nn.Module):
    def __init__(self, vocab: int, causal: bool = True, residual_normed: bool = False):
        super().__init__()
        self.options = {"vocab": vocab, "causal": causal, "residual_normed": residual_normed}
        self.wte, self.wpe = nn.Embedding(vocab, D_MODEL), nn.Embedding(CONTEXT, D_MODEL)
        self.h = nn.ModuleList(Block(D_MODEL, N_HEAD, causal, residual_normed) for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.apply(_init)

    def forward(self, ids, labels=None):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.T
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
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
    layer = Block(D_MODEL, N_HEAD, options["causal"], options["residual_normed"])
    state = load_file(str(directory / "model.safetensors"))
    layer.load_state_dict({k[len("h.0."):]: v for k, v in state.items() if k.startswith("h.0.")})
    return layer.eval()
