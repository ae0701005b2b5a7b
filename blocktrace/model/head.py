"""What turns the last block's output into logits: the final norm and the output projection
(BERT's masked-LM head has a dense + activation + LayerNorm transform in between; Gemma-2
soft-caps the logits; Cohere and Granite scale them by a constant)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from blocktrace.model.layers import RMSNorm, _activation
from blocktrace.vocab import FFNKind, Norm


class OutputHead(nn.Module):
    def __init__(self, weight: torch.Tensor, *, bias: Optional[torch.Tensor] = None,
                 norm: Optional[nn.Module] = None, transform: Optional[nn.Module] = None,
                 softcap: Optional[float] = None, logit_scale: float = 1.0):
        super().__init__()
        self.norm, self.transform = norm, transform
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.softcap, self.logit_scale = softcap, logit_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.transform is not None:
            x = self.transform(x)
        logits = F.linear(x, self.weight, self.bias)
        if self.logit_scale != 1.0:  # Cohere's logit_scale, Granite's 1 / logits_scaling
            logits = logits * self.logit_scale
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def final_norm(kind: Norm, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float,
               offset: float) -> nn.Module:
    if kind is Norm.RMSNORM:
        norm = RMSNorm(weight.shape[0], eps, offset)
        norm.weight = nn.Parameter(weight, requires_grad=False)
        return norm
    norm = nn.LayerNorm(weight.shape[0], eps=eps, bias=bias is not None)
    norm.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        norm.bias = nn.Parameter(bias, requires_grad=False)
    return norm


def masked_lm_transform(dense_weight: torch.Tensor, dense_bias: torch.Tensor, norm_weight: torch.Tensor,
                        norm_bias: torch.Tensor, activation: FFNKind, eps: float) -> nn.Module:
    """BERT's BertPredictionHeadTransform: dense, activation, LayerNorm."""
    dense = nn.Linear(dense_weight.shape[1], dense_weight.shape[0])
    dense.weight, dense.bias = nn.Parameter(dense_weight, False), nn.Parameter(dense_bias, False)
    return nn.Sequential(dense, _activation(activation), final_norm(Norm.LAYERNORM, norm_weight, norm_bias, eps, 0.0))
