"""What a mixture of experts' router did with the tokens of one call: each expert's share, the
router's entropy, the load-balance loss and the router z-loss.

Computed on the router's own device and kept there; the trace copies them with everything else.
Padding tokens (the token mask) are left out, as in every other statistic: weighted out, never
indexed out (an index's size would need a read on the host).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch


HEAD = 7  # tokens, entropy, load-balance loss, z-loss, largest |logit|, tokens previewed, tokens routed twice


def routing_moments(logits: torch.Tensor, probs: torch.Tensor, chosen: torch.Tensor,
                    token_mask: Optional[torch.Tensor] = None, preview: int = 0) -> torch.Tensor:
    """[tokens, entropy, load-balance loss, z-loss, largest |logit|, P, repeated, load_0 … load_E-1, importance_0 …,
    then the k experts each of the first sequence's first P tokens went to] as one float64 vector on the router's
    device (chosen: [..., T, k] the experts the layer sent each token to; load: token slots per expert; importance:
    mean probability; P = the first sequence's length when ≤ `preview`, else 0; repeated: the share of tokens sent to
    one expert in two of their slots)."""
    experts, k = probs.shape[-1], chosen.shape[-1]
    first = chosen.reshape(-1, probs.shape[-2], k)[0]  # the first sequence, [T, k]
    shown = first.shape[0] if first.shape[0] <= preview else 0
    chosen_first = first[:shown].reshape(-1)
    logits, probs = logits.reshape(-1, experts).float(), probs.reshape(-1, experts).float()
    chosen = chosen.reshape(-1, k)
    real = torch.ones(probs.shape[0], dtype=torch.float32, device=probs.device)
    if token_mask is not None and token_mask.numel() == probs.shape[0]:
        real = token_mask.reshape(-1).to(probs.device, torch.float32)  # weights, not an index: no host read
    tokens = real.sum()
    per_token = 1 / tokens.clamp_min(1)
    # [k, E]: the real tokens each expert got in each slot (a scatter: one_hot checks its input on the host)
    slots = torch.zeros(k, experts, device=probs.device).scatter_add_(1, chosen.T, real[None].expand(k, -1))
    importance = (probs * real[:, None]).sum(0) * per_token
    # Mixtral's / Switch Transformer's load-balance loss as HF computes it: E · Σ_slot Σ_e f_slot,e · P_e
    balance = experts * (slots * per_token * importance[None]).sum()
    entropy = (-(probs * torch.log(probs.clamp_min(torch.finfo(torch.float32).tiny))).sum(-1) * real).sum() * per_token
    z_loss = (torch.logsumexp(logits, dim=-1).pow(2) * real).sum() * per_token  # ST-MoE (Zoph et al. 2022)
    largest = (logits.abs().amax(-1) * real).amax() if probs.shape[0] else logits.new_zeros(())
    head = torch.stack([tokens, entropy, balance, z_loss, largest, torch.full((), float(shown), device=probs.device),
                        (_repeats(chosen) * real).sum() * per_token])
    return torch.cat([head, slots.sum(0), importance, chosen_first.to(head.dtype)]).double()


def _repeats(chosen: torch.Tensor) -> torch.Tensor:
    """[tokens]: 1 where a token's k slots ([tokens, k]) name one expert twice (sorted, neighbours equal), else 0."""
    ordered = chosen.sort(dim=-1).values
    return (ordered[:, 1:] == ordered[:, :-1]).any(-1).float()


@dataclass(frozen=True)
class RoutingSummary:
    experts: int
    per_token: int  # k
    tokens: int
    load: list[float]  # share of the token slots (tokens × k) each expert received
    importance: list[float]  # mean router probability of each expert
    entropy: float  # mean over tokens of the router's entropy, nats
    balance_loss: float  # E · Σ f·P (HF's load_balancing_loss_func): k when balanced, E when all go to k experts
    z_loss: float  # mean over tokens of logsumexp(logits)²
    max_logit: float
    chosen: Optional[list[list[int]]] = None  # the experts each token of a short first sequence went to
    repeated_choice: float = 0.0  # the share of tokens sent to one expert in two of their k slots

    @classmethod
    def of(cls, values: list[float], k: int) -> "RoutingSummary":
        shown = int(values[5])
        experts = (len(values) - HEAD - shown * k) // 2
        tokens, slots = int(values[0]), max(1, int(values[0]) * k)
        load = [count / slots for count in values[HEAD:HEAD + experts]]
        importance = values[HEAD + experts:HEAD + 2 * experts]
        flat = [int(e) for e in values[HEAD + 2 * experts:]]
        chosen = [flat[i * k:(i + 1) * k] for i in range(shown)] if shown else None
        return cls(experts, k, tokens, load, importance, values[1], values[2], values[3], values[4], chosen,
                   values[6])

    @property
    def uniform_entropy(self) -> float:
        return math.log(self.experts)

    @property
    def dead(self) -> list[int]:
        return [expert for expert, share in enumerate(self.load) if share == 0]

    def to_dict(self) -> dict:
        return {"experts": self.experts, "per_token": self.per_token, "tokens": self.tokens, "load": self.load,
                "importance": self.importance, "entropy": self.entropy, "uniform_entropy": self.uniform_entropy,
                "balance_loss": self.balance_loss, "z_loss": self.z_loss, "max_logit": self.max_logit,
                "dead_experts": self.dead, "chosen": self.chosen, "repeated_choice": self.repeated_choice}
