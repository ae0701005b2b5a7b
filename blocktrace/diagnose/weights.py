"""Weights as evidence: each matrix's scale against the usual initialisations, and how far the
weights moved between two moments of training (‖ΔW‖/‖W‖), by kind of tensor.

Kinds are the roles every family shares — attn_q, attn_k, attn_v, attn_o (or attn_qkv where q,
k and v are fused), ffn_w1, ffn_w2, norm, and a mixture of experts' router — read off the parameter names, so a GPT-2 block, a
Llama layer and blocktrace's own block line up in one table.
"""

from __future__ import annotations

import re
from typing import Optional

import torch
from torch import nn

KIND_RULES = (  # (pattern on the parameter name, kind); the first match wins
    # a mixture of experts' router (HF's mlp.gate / block_sparse_moe.gate, blocktrace's ffn.router) and Qwen's
    # shared-expert gate, before the SwiGLU gates they would otherwise be taken for
    (r"(mlp\.gate\.|block_sparse_moe\.gate\.|ffn\.router\.|shared_expert_gate|ffn\.shared_gate)", "router"),
    (r"(c_attn|query_key_value|qkv_proj|in_proj)", "attn_qkv"),
    (r"(q_proj|\.query|attn\.q\b)", "attn_q"), (r"(k_proj|\.key|attn\.k\b)", "attn_k"),
    (r"(v_proj|\.value|attn\.v\b)", "attn_v"),
    (r"(o_proj|out_proj|attn\.c_proj|attention\.dense|attention\.output\.dense)", "attn_o"),
    (r"(c_fc|fc1|\bfc\b|\.up\b|up_proj|gate|dense_h_to_4h|intermediate\.dense|mlp\.0|ffn\.0|w1|w3)", "ffn_w1"),
    (r"(mlp\.c_proj|\.proj\b|down|dense_4h_to_h|output\.dense|mlp\.2|ffn\.2|fc2|w2)", "ffn_w2"),
    (r"(norm|ln_|layernorm|LayerNorm)", "norm"),
)


def tensor_kind(name: str) -> str:
    for pattern, kind in KIND_RULES:
        if re.search(pattern, name):
            return kind
    return name.rsplit(".", 2)[-2] if "." in name else name


def _fan_in(module: nn.Module, weight: torch.Tensor) -> int:
    """The input width of a linear map: nn.Linear stores [out, in], GPT-2's Conv1D [in, out]."""
    return weight.shape[0] if type(module).__name__ == "Conv1D" else weight.shape[-1]


@torch.no_grad()
def weight_statistics(block: nn.Module) -> dict[str, dict]:
    """Per linear map of the block: std, Frobenius norm and fan-in (std·√fan_in ≈ 0.5–1.5 at the usual inits)."""
    stats = {}
    for module_name, module in block.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or isinstance(module, nn.Embedding):
            continue
        values = weight.detach().float()
        std, norm = torch.stack([values.std(), torch.linalg.vector_norm(values)]).tolist()  # one copy to Python
        stats[f"{module_name}.weight"] = {"std": std, "norm": norm, "fan_in": _fan_in(module, weight)}
    return stats


@torch.no_grad()
def snapshot(block: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the block's parameters, to measure how far they move (on the CPU: it waits for the next record)."""
    return {name: p.detach().to("cpu", copy=True) for name, p in block.named_parameters()}


class Movement:
    """Per kind of tensor: ‖W‖ now and the relative update ‖W − W_previous‖ / ‖W_previous‖, summed tensor by tensor
    in float64. Divided by the size the weights had, so a tensor zeroed since the previous moment shows 1, the
    largest change, never a blank (None only without a comparable previous tensor, or where it was all zeros)."""

    def __init__(self):
        self.sums: dict[str, list] = {}  # kind -> [‖W‖², ‖ΔW‖², ‖W_previous‖², comparable]

    @staticmethod
    def _square(tensor: torch.Tensor) -> float:
        return float(torch.linalg.vector_norm(tensor)) ** 2

    def add(self, kind: str, now: torch.Tensor, previous: Optional[torch.Tensor]) -> None:
        entry = self.sums.setdefault(kind, [0.0, 0.0, 0.0, True])
        entry[0] += self._square(now)
        if previous is not None and tuple(previous.shape) == tuple(now.shape):
            entry[1] += self._square(now - previous.to(now.dtype))
            entry[2] += self._square(previous)
        else:
            entry[3] = False

    def result(self) -> dict[str, dict]:
        return {kind: {"norm": norm ** 0.5,
                       "update_ratio": (delta / before) ** 0.5 if comparable and before > 0 else None}
                for kind, (norm, delta, before, comparable) in self.sums.items()}


@torch.no_grad()
def update_ratios(block: nn.Module, previous: Optional[dict[str, torch.Tensor]]) -> dict[str, dict]:
    """A block's parameters against a snapshot of them (see Movement)."""
    movement = Movement()
    for name, parameter in block.named_parameters():
        now = parameter.detach().to("cpu", torch.float64)
        movement.add(tensor_kind(name), now, previous.get(name) if previous is not None else None)
    return movement.result()
