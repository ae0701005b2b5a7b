"""A block in the tutorials' style (ln1 / attn / ln2 / ffn), for `blocktrace run --module`.

    blocktrace check --module examples.tutorial_block:forgot_residual

`healthy` is seed 000's TransformerBlock; `forgot_residual` returns ffn(ln2(x1)) instead of
x1 + ffn(ln2(x1)), the kind of slip that keeps a model from converging.
"""

import torch
from torch import nn


class TransformerBlock(nn.Module):
    def __init__(self, d_model=16, n_heads=4, d_ff=64, add_second_residual=True):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.add_second_residual = add_second_residual

    def forward(self, x):  # x: [seq_len, d_model] or [batch, seq_len, d_model]
        x_norm1 = self.ln1(x)
        t = x.shape[-2]
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        attn_out, _ = self.attn(x_norm1, x_norm1, x_norm1, attn_mask=mask, need_weights=False)
        x1 = x + attn_out  # the residual adds the original x, not x_norm1
        ffn_out = self.ffn(self.ln2(x1))
        return x1 + ffn_out if self.add_second_residual else ffn_out


def healthy():
    torch.manual_seed(0)
    return TransformerBlock()


def forgot_residual():
    torch.manual_seed(0)
    return TransformerBlock(add_second_residual=False)
