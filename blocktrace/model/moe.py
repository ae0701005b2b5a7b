"""A mixture of experts in place of the FFN (Shazeer et al. 2017; Mixtral, Qwen-MoE, OLMoE, DeepSeek).

A linear router scores every expert for every token; the softmax of those logits (in float32,
as HF computes it) picks each token's top-k experts, whose outputs are summed weighted by their
probabilities (rescaled to sum to 1 where the model says so). DeepSeek's routers choose within
groups of experts (RouterKind; V3's scores are sigmoids, its choice biased) and scale the
weights; Llama-4's router scales each chosen expert's input by the sigmoid of its logit.
Qwen2-MoE adds a shared expert that every token passes through, gated by sigmoid(w·x);
DeepSeek's and Llama-4's shared experts have no gate. The router's logits and probabilities,
the routed sum and the shared expert's share pass through hook points: the traced sub-steps of
ffn, from which the routing statistics are read (tracing.routing), with the experts each token
went to.
"""

from __future__ import annotations

import torch
from torch import nn

from blocktrace.config import BIASED_ROUTER_NORM_MIN, BlockConfig
from blocktrace.model.layers import GatedFFN, HookPoint, gated_ffn
from blocktrace.vocab import RouterKind

SUBSTEPS = ("router_logits", "router_probs", "routed", "shared")


def top_k_weights(probs: torch.Tensor, k: int, renormalise: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's k most probable experts and their weights: (weights [..., k], experts [..., k])."""
    weights, chosen = torch.topk(probs, k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, chosen


def router_distribution(kind: RouterKind, logits: torch.Tensor) -> torch.Tensor:
    """The router's scores as a distribution over the experts, in float32: softmax(logits), or for a sigmoid router
    its scores divided by their sum (DeepSeek-V3's normalised affinities, which its balance loss reads)."""
    if kind is RouterKind.SIGMOID_GROUPED:
        scores = torch.sigmoid(logits.float())
        return scores / scores.sum(dim=-1, keepdim=True)
    return torch.softmax(logits, dim=-1, dtype=torch.float)  # Llama-4's too: its load-balance loss reads this


def grouped_choice(scores: torch.Tensor, groups: int, kept: int, k: int, by_two_best: bool,
                   outside: float) -> torch.Tensor:
    """DeepSeek's choice: the experts of each token's `kept` best groups (a group scored by its best expert, V2's, or
    by its two best summed, V3's), the others set to `outside`; then the top k. [N, k]."""
    grouped = scores.view(-1, groups, scores.shape[-1] // groups)
    group_scores = grouped.topk(2, dim=-1).values.sum(-1) if by_two_best else grouped.amax(-1)
    best = torch.topk(group_scores, kept, dim=-1, sorted=False).indices
    keep = torch.zeros_like(group_scores).scatter_(1, best, 1).bool()
    masked = scores.masked_fill(~keep.repeat_interleave(scores.shape[-1] // groups, dim=-1), outside)
    return torch.topk(masked, k, dim=-1, sorted=False).indices


class MixtureOfExperts(nn.Module):
    def __init__(self, config: BlockConfig):
        super().__init__()
        spec = config.experts
        self.k, self.renormalise = spec.experts_per_token, spec.renormalise_top_k
        self.kind, self.groups, self.groups_kept = spec.router, spec.expert_groups, spec.groups_per_token
        self.scaling = spec.routed_scaling
        self.router = nn.Linear(config.d_model, spec.n_experts, bias=spec.router_bias)
        # DeepSeek-V3's e_score_correction_bias: moves the choice, never the weights; a buffer, as in HF (set by the
        # training loop's load balancing, not by gradients)
        self.register_buffer("choice_bias", torch.zeros(spec.n_experts) if spec.choice_bias else None)
        self.experts = nn.ModuleList(gated_ffn(config) for _ in range(spec.n_experts))
        self.shared_expert = self.shared_gate = None
        if spec.shared_expert_d_ff is not None:
            self.shared_expert = GatedFFN(config.replace(d_ff=spec.shared_expert_d_ff, experts=None))
            if spec.shared_expert_gated:
                self.shared_gate = nn.Linear(config.d_model, 1, bias=False)
            self.shared = HookPoint()
        self.router_logits, self.router_probs, self.routed = HookPoint(), HookPoint(), HookPoint()
        self.chosen = HookPoint()  # [..., T, k] the experts each token went to (not a sub-step: indices)

    @property
    def substeps(self) -> tuple[str, ...]:
        return SUBSTEPS if self.shared_expert is not None else SUBSTEPS[:-1]

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind.grouped or self.kind is RouterKind.SOFTMAX_BIASED:  # DeepSeek's and ERNIE's compute in
            # float32 whatever the model's dtype, as HF's
            return nn.functional.linear(x.float(), self.router.weight.float())
        return self.router(x)

    def _route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each token's experts and their weights, [N, k] each, largest weight first, as the model's router computes
        them (the order changes no sum: the experts' outputs are added expert by expert)."""
        logits = logits.reshape(-1, logits.shape[-1])
        if self.kind is RouterKind.SOFTMAX:
            return top_k_weights(torch.softmax(logits, dim=-1, dtype=torch.float), self.k, self.renormalise)
        if self.kind is RouterKind.SOFTMAX_BIASED:
            return self._biased_route(torch.softmax(logits, dim=-1, dtype=torch.float))
        if self.kind is RouterKind.SIGMOID_TOPK:  # Llama-4: the top-k logits' sigmoids, in float32, cast back
            top, chosen = torch.topk(logits, self.k, dim=-1)
            return torch.sigmoid(top.float()).to(logits.dtype), chosen
        weights, chosen = self._grouped_route(logits)
        weights, order = weights.sort(dim=-1, descending=True)
        return weights, chosen.gather(1, order)

    def _biased_route(self, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ERNIE-4.5's: the top-k of p + bias chosen, their p renormalised (HF's sum floored at moe_norm_min)."""
        chosen = torch.topk(probs + self.choice_bias, self.k, dim=-1).indices
        weights = probs.gather(1, chosen)
        weights = weights / torch.clamp(weights.sum(dim=-1, keepdim=True), min=BIASED_ROUTER_NORM_MIN)
        weights, order = weights.sort(dim=-1, descending=True)
        return weights, chosen.gather(1, order)

    def _grouped_route(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind is RouterKind.SOFTMAX_GROUPED:  # DeepSeek-V2: the chosen probabilities, never renormalised
            probs = torch.softmax(logits, dim=-1, dtype=torch.float)
            chosen = grouped_choice(probs, self.groups, self.groups_kept, self.k, False, 0.0)
            return probs.gather(1, chosen) * self.scaling, chosen
        scores = torch.sigmoid(logits)
        biased = scores + self.choice_bias if self.choice_bias is not None else scores
        chosen = grouped_choice(biased, self.groups, self.groups_kept, self.k, True, float("-inf"))
        weights = scores.gather(1, chosen)
        if self.renormalise:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)  # HF's, with its epsilon
        return weights * self.scaling, chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., T, d]
        logits = self.router_logits(self._logits(x))  # [..., T, E]
        self.router_probs(router_distribution(self.kind, logits))
        weights, chosen = self._route(logits)
        self.chosen(chosen.reshape(*logits.shape[:-1], self.k))
        flat, weights = x.reshape(-1, x.shape[-1]), weights.to(x.dtype)
        out = torch.zeros_like(flat)
        scales_input = self.kind is RouterKind.SIGMOID_TOPK  # Llama-4 weighs what goes into an expert
        for index, expert in enumerate(self.experts):  # expert by expert, in order, as HF sums them
            tokens, slot = torch.where(chosen == index)
            if tokens.numel():
                weight = weights[tokens, slot, None]
                routed = expert(flat[tokens] * weight) if scales_input else expert(flat[tokens]) * weight
                out.index_add_(0, tokens, routed)
        out = self.routed(out.reshape(x.shape))
        if self.shared_expert is not None:
            shared = self.shared_expert(x)
            if self.shared_gate is not None:  # Qwen2-MoE's gate; DeepSeek's and Llama-4's shared experts have none
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + self.shared(shared)
        return out
