"""A mixture of experts in place of the FFN (Shazeer et al. 2017; Mixtral, Qwen-MoE, OLMoE).

A linear router scores every expert for every token; the softmax of those logits (in float32,
as HF computes it) picks each token's top-k experts, whose outputs are summed weighted by their
probabilities (rescaled to sum to 1 where the model says so). Qwen2-MoE adds a shared expert
that every token passes through, gated by sigmoid(w·x). The router's logits and probabilities,
the routed sum and the shared expert's share pass through hook points: the traced sub-steps
of ffn, from which the routing statistics are read (tracing.routing).
"""

from __future__ import annotations

import torch
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.model.layers import GatedFFN, HookPoint, gated_ffn

SUBSTEPS = ("router_logits", "router_probs", "routed", "shared")


def top_k_weights(probs: torch.Tensor, k: int, renormalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's k most probable experts and their weights: (weights [..., k], experts [..., k])."""
    weights, chosen = torch.topk(probs, k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, chosen


class MixtureOfExperts(nn.Module):
    def __init__(self, config: BlockConfig):
        super().__init__()
        self.k, self.renormalise = config.experts_per_token, config.renormalise_top_k
        self.router = nn.Linear(config.d_model, config.n_experts, bias=config.router_bias)
        self.experts = nn.ModuleList(gated_ffn(config) for _ in range(config.n_experts))
        self.shared_expert = self.shared_gate = None
        if config.shared_expert_d_ff is not None:
            self.shared_expert = GatedFFN(config.replace(d_ff=config.shared_expert_d_ff, n_experts=None,
                                                         shared_expert_d_ff=None))
            self.shared_gate = nn.Linear(config.d_model, 1, bias=False)
            self.shared = HookPoint()
        self.router_logits, self.router_probs, self.routed = HookPoint(), HookPoint(), HookPoint()

    @property
    def substeps(self) -> tuple[str, ...]:
        return SUBSTEPS if self.shared_expert is not None else SUBSTEPS[:-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., T, d]
        logits = self.router_logits(self.router(x))  # [..., T, E]
        probs = self.router_probs(torch.softmax(logits, dim=-1, dtype=torch.float))
        weights, chosen = top_k_weights(probs, self.k, self.renormalise)
        flat, weights, chosen = x.reshape(-1, x.shape[-1]), weights.to(x.dtype).reshape(-1, self.k), \
            chosen.reshape(-1, self.k)
        out = torch.zeros_like(flat)
        for index, expert in enumerate(self.experts):  # expert by expert, in order, as HF sums them
            tokens, slot = torch.where(chosen == index)
            if tokens.numel():
                out.index_add_(0, tokens, expert(flat[tokens]) * weights[tokens, slot, None])
        out = self.routed(out.reshape(x.shape))
        if self.shared_expert is not None:
            out = out + self.shared(torch.sigmoid(self.shared_gate(x)) * self.shared_expert(x))
        return out
