"""Parameter initialisations: PyTorch's default, Xavier, and the setting of Xiong et al. 2020.

"xiong" is the setting of Lemma 2 / Theorem 1 of "On Layer Normalization in the Transformer
Architecture": Xavier-normal weights, zero biases, W^Q = W^K = 0 (so attention is uniform),
norm gain 1 and shift 0. Use it with one head and d_ff = d_model to match the paper.
"""

from __future__ import annotations

import torch
from torch import nn

from blocktrace.vocab import Init


def _linears(module: nn.Module):
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def initialise(block: nn.Module, scheme: Init) -> None:
    """Re-draw the block's parameters in place (from the global RNG, which the caller seeds)."""
    if scheme is Init.DEFAULT:
        return
    with torch.no_grad():
        for linear in _linears(block):
            nn.init.xavier_normal_(linear.weight)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        if scheme is Init.XIONG:
            for linear in (block.attn.q_proj, block.attn.k_proj):
                nn.init.zeros_(linear.weight)


def apply_deepnorm_beta(block: nn.Module) -> None:
    """Scale the FFN, V and O projection weights by β = (8N)^-¼ (Wang et al. 2022); not Q and K."""
    beta = block.config.deepnorm_beta
    with torch.no_grad():
        for linear in [*_linears(block.ffn), block.attn.v_proj, block.attn.out_proj]:
            linear.weight.mul_(beta)
