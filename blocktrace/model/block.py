"""The Transformer block: six named step modules wired Pre-LN, Post-LN, DeepNorm, sandwich or reordered.

Each step is a submodule, the two residual additions included, so that a plain
`register_forward_hook` sees every value the tutorials' six-step table lists. Sandwich
wiring (Peri-LN, Gemma-2) adds two steps, the norms after each sublayer; reordered wiring
(OLMo-2) keeps only those: norm1 and norm2 normalise each sublayer's output before its add. A
parallel residual (GPT-NeoX) feeds both sublayers from the same stream.
"""

from __future__ import annotations

import torch
from torch import nn

from blocktrace.config import STEP_NAMES, BlockConfig
from blocktrace.model.layers import MultiHeadAttention, make_ffn, make_norm
from blocktrace.model.moe import MixtureOfExperts
from blocktrace.vocab import FFNKind, Init, Norm, Placement


class Residual(nn.Module):
    """α·stream + update (α = 1 but for DeepNorm), as a module of its own so the sum can be hooked."""

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, stream: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        return stream + update if self.alpha == 1.0 else self.alpha * stream + update


class TransformerBlock(nn.Module):
    def __init__(self, config: BlockConfig):
        super().__init__()
        self.config = config
        self.norm1 = make_norm(config)
        self.attn = MultiHeadAttention(config)
        self.residual1 = Residual(config.residual_scale)
        self.norm2 = make_norm(config)
        self.ffn = MixtureOfExperts(config) if config.n_experts else make_ffn(config)
        self.residual2 = Residual(config.residual_scale)
        if config.sandwich:
            self.post_attn_norm, self.post_ffn_norm = make_norm(config), make_norm(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, d] or [B, T, d]
        config = self.config
        if config.post_norm:
            x1 = self.norm1(self.residual1(x, self.attn(x)))
            return self.norm2(self.residual2(x1, self.ffn(x1)))
        if config.placement is Placement.REORDERED:
            x1 = self.residual1(x, self.norm1(self.attn(x)))
            return self.residual2(x1, self.norm2(self.ffn(x1)))
        if config.sandwich:
            x1 = self.residual1(x, self.post_attn_norm(self.attn(self.norm1(x))))
            return self.residual2(x1, self.post_ffn_norm(self.ffn(self.norm2(x1))))
        x1 = self.residual1(x, self.attn(self.norm1(x)))
        ffn_input = x if config.parallel_residual else x1  # parallel: both sublayers read x
        return self.residual2(x1, self.ffn(self.norm2(ffn_input)))

    def step_modules(self) -> dict[str, nn.Module]:
        return {name: getattr(self, name) for name in execution_order(self.config)}


def build_block(config: BlockConfig, seed: int = 0, init: Init = Init.DEFAULT) -> TransformerBlock:
    """A block whose parameters are drawn from `seed`: same seed, same numbers.

    init: "default" (PyTorch's own), "xavier" or "xiong" (see blocktrace.model.init). DeepNorm's β
    scaling of the FFN, V and O weights is applied on top, as its definition requires.
    The global RNG is forked so that building a block never disturbs the caller's random state.
    """
    from blocktrace.model.init import apply_deepnorm_beta, initialise

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = TransformerBlock(config)
        initialise(block, Init(init))
    if config.placement is Placement.DEEPNORM:
        apply_deepnorm_beta(block)
    return block.eval()


def execution_order(config: BlockConfig) -> tuple[str, ...]:
    if config.post_norm:
        return ("attn", "residual1", "norm1", "ffn", "residual2", "norm2")
    if config.sandwich:
        return ("norm1", "attn", "post_attn_norm", "residual1", "norm2", "ffn", "post_ffn_norm", "residual2")
    if config.placement is Placement.REORDERED:
        return ("attn", "norm1", "residual1", "ffn", "norm2", "residual2")
    return STEP_NAMES


NORM_NAMES = {Norm.LAYERNORM: "LayerNorm", Norm.RMSNORM: "RMSNorm"}
FFN_NAMES = {FFNKind.GELU: "FFN_GELU", FFNKind.GELU_TANH: "FFN_GELU_tanh", FFNKind.RELU: "FFN_ReLU",
             FFNKind.SWIGLU: "SwiGLU", FFNKind.GEGLU: "GeGLU", FFNKind.GEGLU_EXACT: "GeGLU_exact"}


def _norm_name(config: BlockConfig) -> str:
    name = NORM_NAMES[config.norm]
    return f"{name}[{config.norm_offset:g}+w]" if config.norm_offset else name  # Gemma's gain is (1 + w)


def _ffn_name(config: BlockConfig) -> str:
    if config.n_experts is None:
        return FFN_NAMES[config.ffn]
    shared = " + shared" if config.shared_expert_d_ff is not None else ""
    return f"MoE[top-{config.experts_per_token} of {config.n_experts} {FFN_NAMES[config.ffn]}{shared}]"


def substep_operations(config: BlockConfig) -> dict[str, str]:
    """The traced sub-steps inside attn and ffn, as formulas."""
    scope = "over all heads" if config.qk_norm_whole else "per head"
    renormalised = ", renormalised" if config.renormalise_top_k else ""
    return {
        "attn.q": "q = heads(q_proj(x_in))", "attn.k": "k = heads(k_proj(x_in))",
        "attn.q_norm": f"q = RMSNorm(q) {scope}", "attn.k_norm": f"k = RMSNorm(k) {scope}",
        "attn.q_rope": "q_rope = RoPE(q, positions)", "attn.k_rope": "k_rope = RoPE(k, positions)",
        "ffn.router_logits": "logits = router(x_in)  (one per expert)",
        "ffn.router_probs": f"p = softmax(logits), top-{config.experts_per_token} kept{renormalised}",
        "ffn.routed": "Σ over its top-k experts: p_e · expert_e(x_in)",
        "ffn.shared": "sigmoid(gate(x_in)) · shared_expert(x_in)",
    }


def step_operations(config: BlockConfig) -> dict[str, str]:
    """Each step as a formula, with the tutorial's variable names (x_norm1, attn_out, x1, ...)."""
    norm, ffn = _norm_name(config), _ffn_name(config)
    if config.post_norm:
        alpha = "" if config.residual_scale == 1.0 else f"{config.residual_scale:.4g}·"
        return {
            "attn": "attn_out = MultiHeadAttention(x)",
            "residual1": f"r1 = {alpha}x + attn_out",
            "norm1": f"x1 = {norm}(r1)",
            "ffn": f"ffn_out = {ffn}(x1)",
            "residual2": f"r2 = {alpha}x1 + ffn_out",
            "norm2": f"x2 = {norm}(r2)",
        }
    if config.sandwich:
        return {
            "norm1": f"x_norm1 = {norm}(x)",
            "attn": "attn_out = MultiHeadAttention(x_norm1)",
            "post_attn_norm": f"attn_normed = {norm}(attn_out)",
            "residual1": "x1 = x + attn_normed",
            "norm2": f"x_norm2 = {norm}(x1)",
            "ffn": f"ffn_out = {ffn}(x_norm2)",
            "post_ffn_norm": f"ffn_normed = {norm}(ffn_out)",
            "residual2": "x2 = x1 + ffn_normed",
        }
    if config.placement is Placement.REORDERED:
        return {
            "attn": "attn_out = MultiHeadAttention(x)",
            "norm1": f"attn_normed = {norm}(attn_out)",
            "residual1": "x1 = x + attn_normed",
            "ffn": f"ffn_out = {ffn}(x1)",
            "norm2": f"ffn_normed = {norm}(ffn_out)",
            "residual2": "x2 = x1 + ffn_normed",
        }
    if config.parallel_residual:
        return {
            "norm1": f"x_norm1 = {norm}(x)",
            "attn": "attn_out = MultiHeadAttention(x_norm1)",
            "residual1": "x1 = x + attn_out",
            "norm2": f"x_norm2 = {norm}(x)  (parallel: reads x, not x1)",
            "ffn": f"ffn_out = {ffn}(x_norm2)",
            "residual2": "x2 = x1 + ffn_out  (= x + attn_out + ffn_out)",
        }
    return {
        "norm1": f"x_norm1 = {norm}(x)",
        "attn": "attn_out = MultiHeadAttention(x_norm1)",
        "residual1": "x1 = x + attn_out",
        "norm2": f"x_norm2 = {norm}(x1)",
        "ffn": f"ffn_out = {ffn}(x_norm2)",
        "residual2": "x2 = x1 + ffn_out",
    }
