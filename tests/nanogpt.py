"""nanoGPT's model and its checkpoint writer, reproduced from Karpathy's model.py and train.py.

Not a test module: the reference a hand-written training loop produces. The model is
nanoGPT's own code (LayerNorm with an optional bias, nn.Linear attention with c_attn
[3d, d], nn.GELU(), the head tied to wte); `save_ckpt` writes what train.py writes.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    block_size: int = 64
    vocab_size: int = 96
    n_layer: int = 3
    n_head: int = 4
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size))  # the slow path's mask

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying, as nanoGPT does

    def hidden(self, idx):
        """The residual stream entering each block, and the last block's output."""
        pos = torch.arange(0, idx.size(1), dtype=torch.long)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        states = []
        for block in self.transformer.h:
            states.append(x)
            x = block(x)
        return states + [x]

    def forward(self, idx, targets=None):
        x = self.hidden(idx)[-1]
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def randomised(config: GPTConfig, seed: int = 0) -> GPT:
    """nanoGPT's model with every parameter random (norm gains near 1), so no mapping error can hide."""
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn_like(parameter)
            parameter.copy_(1.0 + 0.3 * noise if "ln_" in name and name.endswith("weight") else 0.15 * noise)
    return model


def save_ckpt(model: GPT, path, iter_num: int = 0, compiled_prefix: bool = False, optimizer=None) -> None:
    """What nanoGPT's train.py writes: the state dict, the optimizer, model_args, iter_num, config."""
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = model.state_dict()
    if compiled_prefix:  # train.py saves the compiled model's state dict: every key under _orig_mod.
        state = {f"_orig_mod.{k}": v for k, v in state.items()}
    model_args = {k: v for k, v in asdict(model.config).items() if k != "dropout"}
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "model_args": model_args, "iter_num": iter_num,
                "best_val_loss": torch.tensor(3.5), "config": {"learning_rate": 1e-3, "batch_size": 12}}, path)


def from_model_args(**model_args) -> GPT:
    """The factory a nanoGPT user points `check --model` at: the checkpoint's model_args build the model."""
    return GPT(GPTConfig(**model_args))
