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

from blocktrace.host import to_host
from blocktrace.tracing.stats import widened

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
def weight_moments(block: nn.Module) -> dict[str, dict]:
    """Per linear map of the block: Σw and Σw² as device scalars (summed in float32 at least), the count and the fan-in (read with
    weight_summary once on the host; exact for a weight sharded across ranks, whose sums cover every shard). A module's
    2-D `.weight` is a linear map by convention; a bare 2-D parameter (a hand-written `x @ W`) is listed with its
    shape and no fan-in, for weight_summary to keep only where it meets the stream."""
    moments = {}
    for module_name, module in block.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2 and not isinstance(module, nn.Embedding):
            moments[f"{module_name}.weight"] = _moments(weight, _fan_in(module, weight))
        for name, parameter in module.named_parameters(recurse=False):
            if parameter is not weight and parameter.dim() == 2 and parameter.is_floating_point():
                moments[f"{module_name}.{name}" if module_name else name] = {
                    **_moments(parameter, None), "shape": list(parameter.shape)}
    return moments


def _moments(weight: torch.Tensor, fan_in: Optional[int]) -> dict:
    total, squares = sum_and_squares(weight)
    return {"sum": total, "squares": squares, "count": weight.numel(), "fan_in": fan_in,
            "spread": sampled_spread(weight)}


SPREAD_SAMPLE = 4096  # entries of a matrix read, strided, for its spread: no published initialisation repeats one


def sampled_spread(weight: torch.Tensor) -> torch.Tensor:
    """max − min over a strided sample of the matrix's entries (of this rank's shard where it is sharded), a device
    scalar: exactly 0 where every sampled entry is equal. Its moments cannot say so: a float32 Σw² − (Σw)²/n of a
    constant 4096 × 4096 matrix left a 'std' of 15% of its rms in rounding on this project's AVX2 CPU."""
    local = weight.to_local() if hasattr(weight, "to_local") else weight
    flat = local.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // SPREAD_SAMPLE)].float()
    # an empty shard (a rank holding none of it) says nothing: NaN, never "equal"
    return sample.amax() - sample.amin() if sample.numel() else torch.full((), float("nan"), device=flat.device)


WIDEN_CHUNK = 1 << 18  # elements widened at a time on a CPU: the float32 piece stays in cache


def sum_and_squares(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Σw and Σw² as float64 device scalars, summed in float32 at least. A half-precision weight on a CPU is widened
    a piece at a time into one float32 buffer: an 8B checkpoint's 14336 × 4096 MLP matrix widened whole is a 235 MB
    copy, 173 ms on this project's 2-core CPU against 28 ms by pieces that stay in cache, and a fresh 1 MB piece
    each time costs a 3B bfloat16 `check` 0.2 s more than one buffer refilled (benchmarks/RESULTS.md). Elsewhere in
    one piece (a GPU's bandwidth makes one copy cheap; hundreds of small kernels would not be)."""
    weight = weight.detach()
    if weight.dtype not in (torch.float16, torch.bfloat16) or weight.device.type != "cpu":
        values = widened(weight)
        return values.sum().double(), squared_norm(values)
    pieces = weight.reshape(-1).split(WIDEN_CHUNK)
    buffer = torch.empty(min(WIDEN_CHUNK, weight.numel()), dtype=torch.float32)
    sums, squares = torch.empty(len(pieces), dtype=torch.float64), torch.empty(len(pieces), dtype=torch.float64)
    for index, piece in enumerate(pieces):
        wide = buffer[:piece.numel()].copy_(piece)
        sums[index], squares[index] = wide.sum(), torch.dot(wide, wide)
    return sums.sum(), squares.sum()


def weight_summary(moments: dict[str, dict], width: Optional[int] = None) -> dict[str, dict]:
    """weight_moments on the host -> per weight its mean, std (unbiased, as torch.std), Frobenius norm, fan-in
    (std·√fan_in ≈ 0.5–1.5 at the usual inits), fan-out and sampled spread. A bare 2-D parameter counts as a weight
    matrix only where one of its sides is the stream's width (a map into or out of the stream: W_query [d, d_out] as
    the hand-written `x @ W`, not a state-space layer's A_log [2d, 16]); whether it is used as `x @ W` or
    F.linear(x, W) cannot be read from the tensor, so only a square one has a fan-in."""
    summary = {}
    for name, m in moments.items():
        shape = m.get("shape")
        if shape is not None and width not in shape:
            continue
        n, fan_in = m["count"], m["fan_in"] if shape is None else (width if shape[0] == shape[1] else None)
        variance = (m["squares"] - m["sum"] ** 2 / n) / max(n - 1, 1)
        summary[name] = {"mean": m["sum"] / max(n, 1), "std": max(variance, 0.0) ** 0.5, "norm": m["squares"] ** 0.5,
                         "fan_in": fan_in, "spread": m.get("spread"),
                         "fan_out": n // fan_in if fan_in else None}
    return summary


def weight_statistics(block: nn.Module, width: Optional[int] = None) -> dict[str, dict]:
    """weight_summary of the block's weights, in one copy to the host."""
    return weight_summary(to_host(weight_moments(block)), width)


def squared_norm(tensor: torch.Tensor) -> torch.Tensor:
    """‖t‖² as a float64 device scalar. The norm itself runs in the tensor's (widened) dtype: asked for float64,
    torch would first copy the whole tensor to float64 (a checkpoint's largest weight, twice over, at every
    checkpoint `track` reads)."""
    return torch.linalg.vector_norm(widened(tensor)).double().square()


@torch.no_grad()
def snapshot(block: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of the block's parameters where they live (the device; a sharded parameter's shard), to measure
    how far they move by the next record: the weights never travel to the host."""
    return {name: p.detach().clone() for name, p in block.named_parameters()}


ROUNDED_DTYPES = (torch.float16, torch.bfloat16)  # formats coarse enough to swallow an optimizer's update


class Movement:
    """Per kind of tensor: ‖W‖ now and the relative update ‖W − W_previous‖ / ‖W_previous‖, summed tensor by tensor
    in float64 on the tensors' device. Divided by the size the weights had, so a tensor zeroed since the previous
    moment shows 1, the largest change, never a blank (None only without a comparable previous tensor, or where
    it was all zeros). For 16-bit tensors an optimizer updates in place, also the share of elements that did not
    change at all (`unchanged`: updates smaller than the format's rounding step are lost). `values()` is what the
    host needs; `result` reads it there."""

    def __init__(self):
        self.sums: dict[str, list] = {}  # kind -> [‖W‖², ‖ΔW‖², ‖W_previous‖²] as device scalars
        self.comparable: dict[str, bool] = {}
        self.unchanged: dict[str, list] = {}  # kind -> [elements unchanged, elements] of rounded tensors
        self.elements: dict[str, int] = {}  # kind -> its tensors' element count (a host number: no transfer)
        # kind -> the entries of its matrices with a nonzero gradient (a device count), and the fewest entries one
        # of those matrices' rows or columns holds (a host number)
        self.gradient_entries: dict[str, torch.Tensor] = {}
        self.line: dict[str, int] = {}
        self.trainable: dict[str, bool] = {}  # kind -> whether any of its tensors requires a gradient

    def add(self, kind: str, now: torch.Tensor, previous: Optional[torch.Tensor], rounded: bool = False,
            trainable: bool = True) -> None:
        self.trainable[kind] = self.trainable.get(kind, False) or trainable
        entry = self.sums.setdefault(kind, [0.0, 0.0, 0.0])
        self.comparable.setdefault(kind, True)
        self.elements[kind] = self.elements.get(kind, 0) + now.numel()
        entry[0] = entry[0] + squared_norm(now)
        if previous is not None and tuple(previous.shape) == tuple(now.shape):
            entry[1] = entry[1] + squared_norm(widened(now) - widened(previous.to(now.dtype)))
            entry[2] = entry[2] + squared_norm(previous)
            if rounded and now.dtype in ROUNDED_DTYPES and previous.dtype == now.dtype:
                counts = self.unchanged.setdefault(kind, [0, 0])
                counts[0], counts[1] = counts[0] + (now == previous).sum(), counts[1] + now.numel()
        else:
            self.comparable[kind] = False

    def add_gradient(self, kind: str, gradient: torch.Tensor) -> None:
        """A matrix's gradient: how many of its entries it reaches (a weight's gradient reaches every entry of every
        row whose unit gets a gradient, so fewer than a row's worth means the weight is not reached through its
        product with the input)."""
        if gradient.dim() != 2:
            return
        nonzero = (gradient != 0).sum()
        before = self.gradient_entries.get(kind)
        self.gradient_entries[kind] = nonzero if before is None else before + nonzero.to(before.device)
        self.line[kind] = min(self.line.get(kind, min(gradient.shape)), min(gradient.shape))

    def frozen_kinds(self) -> list[str]:
        """The kinds none of whose tensors requires a gradient (a LoRA fine-tune's base matrices): no optimizer
        moves them, so the update-size checks leave them out."""
        return [kind for kind, trainable in self.trainable.items() if not trainable]

    def values(self) -> dict[str, list]:
        return {kind: [*sums, *self.unchanged.get(kind, [None, None]), self.gradient_entries.get(kind)]
                for kind, sums in self.sums.items()}

    def result(self, values: Optional[dict[str, list]] = None) -> dict[str, dict]:
        """{kind: {norm, update_ratio, elements[, unchanged]}} from `values()` on the host (read here, in one copy,
        when not given)."""
        if values is None:
            values = to_host(self.values())
        return {kind: {"norm": norm ** 0.5,
                       "update_ratio": (delta / before) ** 0.5 if self.comparable[kind] and before > 0 else None,
                       "elements": self.elements[kind], **({"unchanged": same / total} if total else {}),
                       **({"gradient_entries": reached, "line": self.line[kind]} if reached is not None else {})}
                for kind, (norm, delta, before, same, total, reached) in values.items()}


@torch.no_grad()
def movement(block: nn.Module, previous: Optional[dict[str, torch.Tensor]], updated_in_place: Optional[set] = None) \
        -> Movement:
    """A block's parameters against a snapshot of them (see Movement), on their device. `updated_in_place`: the
    ids of the tensors an optimizer steps itself (their unchanged elements are counted); a tensor it does not hold
    may have float32 master weights elsewhere, whose updates accumulate there."""
    moved = Movement()
    for name, parameter in block.named_parameters():
        rounded = updated_in_place is not None and parameter.requires_grad and id(parameter) in updated_in_place
        kind = tensor_kind(name)
        moved.add(kind, parameter.detach(), previous.get(name) if previous is not None else None, rounded,
                  parameter.requires_grad)
        if parameter.requires_grad and parameter.grad is not None and not hasattr(parameter.grad, "to_local"):
            moved.add_gradient(kind, parameter.grad.detach())  # (a sharded gradient's shard says nothing alone)
    return moved
