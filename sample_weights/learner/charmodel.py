"""A learner's character model, as the tutorials write it: nanoGPT's names, attention by hand (no
scaled_dot_product_attention), the MLP an nn.Sequential (keys `mlp.0.weight`, no layout blocktrace reads), and a
forward(idx, targets) that always computes its loss. README's Watch example trains it, its docs' `check --model`
example reads its checkpoint, and tests/test_user_model.py checks blocktrace against its own forward."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d, heads, block_size):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads
        self.register_buffer("mask", torch.tril(torch.ones(block_size, block_size)))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.c_attn(x).split(C, 2))
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.heads)
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d, heads, block_size):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(d), Attention(d, heads, block_size), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CharGPT(nn.Module):
    def __init__(self, vocab_size=96, n_embd=32, n_head=4, n_layer=2, block_size=32):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head, block_size) for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets):
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(idx.shape[1]))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

