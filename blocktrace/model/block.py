"""The Transformer block: its steps built and run from the wiring table (blocktrace.wiring).

Each step is a submodule, the two residual additions included, so that a plain
`register_forward_hook` sees every value the tutorials' six-step table lists; which step reads
which (Pre-LN, Post-LN, DeepNorm, sandwich, reordered, a parallel residual) is the wiring's.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from blocktrace.config import STEP_NAMES, BlockConfig, Experts, QKNorm
from blocktrace.model.init import apply_deepnorm_beta, initialise
from blocktrace.model.layers import LatentAttention, MultiHeadAttention, make_ffn, make_norm
from blocktrace.model.moe import MixtureOfExperts
from blocktrace.model.gated_delta import GatedDeltaNet
from blocktrace.model.mamba2 import Mamba2
from blocktrace.model.short_conv import ShortConvolution
from blocktrace.vocab import SANDWICH_STEPS, FFNKind, Init, MixerKind, Norm, Placement, QKSpan, RouterKind
from blocktrace.wiring import INPUT, Kind


# Each token mixer that is not attention, a piece in a file of its own: its module, which names its operation
# (`label`) and gives its sub-steps' formulas (`operations`).
MIXERS = {MixerKind.SHORT_CONV: ShortConvolution, MixerKind.GATED_DELTA: GatedDeltaNet, MixerKind.MAMBA2: Mamba2}


class Residual(nn.Module):
    """α·stream + m·update (α = 1 but for DeepNorm, m = 1 but for Granite's residual_multiplier), as a module of its
    own so the sum can be hooked."""

    def __init__(self, alpha: float = 1.0, multiplier: float = 1.0):
        super().__init__()
        self.alpha, self.multiplier = alpha, multiplier

    def forward(self, stream: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
        if self.multiplier != 1.0:
            update = update * self.multiplier  # HF's order: residual + hidden_states * multiplier
        return stream + update if self.alpha == 1.0 else self.alpha * stream + update


class TransformerBlock(nn.Module):
    """The steps of `config.wiring`, each a submodule, run in its order."""

    def __init__(self, config: BlockConfig):
        super().__init__()
        self.config = config
        self.wiring = config.wiring
        # Built in the tutorials' order (sandwich norms last), whatever the execution order: a seed draws the same
        # parameters for the same step under every wiring, so compare's variants share them.
        present = set(self.wiring.order)
        for name in (*STEP_NAMES, *SANDWICH_STEPS):
            if name in present:
                self.add_module(name, _make_step(self.wiring.step(name).kind, config))
        self._released = self.wiring.last_reads()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, d] or [B, T, d]
        values = {INPUT: x}
        for step, released in zip(self.wiring.steps, self._released):
            values[step.name] = self._modules[step.name](*(values[source] for source in step.reads))
            for name in released:  # dropped as soon as no later step reads it, as a written-out forward would
                del values[name]
        return values[self.wiring.output]

    def attend_with(self, key_mask: Optional[torch.Tensor] = None, query_chunk: Optional[int] = None) -> None:
        """How the next inputs are attended: `key_mask` [B, T] (False at padding: no weight on those keys) and the
        query rows computed at once (None: as many as fit layers.attention_chunk_bytes). Neither changes a number."""
        self.attn.key_mask, self.attn.query_chunk = key_mask, query_chunk

    def step_modules(self) -> dict[str, nn.Module]:
        return {name: self._modules[name] for name in self.wiring.order}


def _make_step(kind: Kind, config: BlockConfig) -> nn.Module:
    if kind is Kind.NORM:
        return make_norm(config)
    if kind is Kind.ATTENTION:
        if config.token_mixer is not None:
            return MIXERS[config.token_mixer.mixer](config)
        return LatentAttention(config) if config.latent is not None else MultiHeadAttention(config)
    if kind is Kind.FFN:
        return MixtureOfExperts(config) if config.experts is not None else make_ffn(config)
    return Residual(config.residual_scale, config.residual_multiplier)


def build_block(config: BlockConfig, seed: int = 0, init: Init = Init.DEFAULT) -> TransformerBlock:
    """A block whose parameters are drawn from `seed`: same seed, same numbers.

    init: "default" (PyTorch's own), "xavier" or "xiong" (see blocktrace.model.init). DeepNorm's β
    scaling of the FFN, V and O weights is applied on top, as its definition requires.
    The global RNG is forked so that building a block never disturbs the caller's random state.
    """
    with torch.random.fork_rng(devices=[]):
        # The CPU's generator only: the block is built on the CPU, and torch.manual_seed would also reseed every
        # accelerator's generator, which fork_rng(devices=[]) does not restore (and costs ~1 ms formatting a stack).
        torch.default_generator.manual_seed(seed)
        block = TransformerBlock(config)
        initialise(block, Init(init))
    if config.placement is Placement.DEEPNORM:
        apply_deepnorm_beta(block)
    return block.eval()


def execution_order(config: BlockConfig) -> tuple[str, ...]:
    return config.wiring.order


NORM_NAMES = {Norm.LAYERNORM: "LayerNorm", Norm.RMSNORM: "RMSNorm"}
FFN_NAMES = {FFNKind.GELU: "FFN_GELU", FFNKind.GELU_TANH: "FFN_GELU_tanh", FFNKind.RELU: "FFN_ReLU",
             FFNKind.RELU2: "FFN_ReLU²",
             FFNKind.SWIGLU: "SwiGLU", FFNKind.GEGLU: "GeGLU", FFNKind.GEGLU_EXACT: "GeGLU_exact",
             FFNKind.SWIGLU_CLAMPED: "SwiGLU_clamped", FFNKind.XIELU: "FFN_xIELU"}


def _norm_name(config: BlockConfig) -> str:
    name = NORM_NAMES[config.norm]
    return f"{name}[{config.norm_offset:g}+w]" if config.norm_offset else name  # Gemma's gain is (1 + w)


def _ffn_name(config: BlockConfig) -> str:
    experts = config.experts
    if experts is None:
        return FFN_NAMES[config.ffn]
    shared = " + shared" if experts.shared_expert_d_ff is not None else ""
    router = "" if experts.router is RouterKind.SOFTMAX else f", {experts.router.value} router"
    return f"MoE[top-{experts.experts_per_token} of {experts.n_experts} {FFN_NAMES[config.ffn]}{shared}{router}]"


def substep_operations(config: BlockConfig) -> dict[str, str]:
    """The traced sub-steps inside attn and ffn, as formulas."""
    return {
        "attn.q": "q = heads(q_proj(x_in))", "attn.k": "k = heads(k_proj(x_in))",
        **(_qk_norm_operations(config.qk_norm) if config.qk_norm is not None else {}),
        "attn.q_rope": "q_rope = RoPE(q, positions)", "attn.k_rope": "k_rope = RoPE(k, positions)",
        **(_latent_operations(config) if config.latent is not None else {}),
        **(MIXERS[config.token_mixer.mixer].operations(config) if config.token_mixer is not None else {}),
        **(_expert_operations(config.experts) if config.experts is not None else {}),
        "attn.output_gate": "sigmoid(gate_proj(x_in))  (multiplies each head's output before out_proj)",
    }


def _qk_norm_operations(norm: QKNorm) -> dict[str, str]:
    """The QK-norm's two sub-steps: a learned RMSNorm, or Llama-4's division by the RMS alone."""
    scope = "over all heads" if norm.span is QKSpan.ALL_HEADS else "per head" + (", after RoPE" if norm.after_rope
                                                                                 else "")
    return {f"attn.{x}_norm": f"{x} = RMSNorm({x}) {scope}" if norm.gain else f"{x} = {x} / RMS({x}) {scope} (no gain)"
            for x in "qk"}


def _expert_operations(experts: Experts) -> dict[str, str]:
    """A mixture of experts' sub-steps: the router's logits and choice, the routed sum, the shared expert."""
    return {"ffn.router_logits": "logits = router(x_in)  (one per expert)",
            "ffn.router_probs": _router_operation(experts),
            "ffn.routed": "Σ over its top-k experts: expert_e(s_e · x_in)" if experts.router is RouterKind.SIGMOID_TOPK
            else f"Σ over its top-k experts: {_weight_name(experts)} · expert_e(x_in)",
            "ffn.shared": "shared_expert(x_in)" if not experts.shared_expert_gated
            else "sigmoid(gate(x_in)) · shared_expert(x_in)"}


def _latent_operations(config: BlockConfig) -> dict[str, str]:
    """Latent attention's sub-steps: its two latents, then q and k per head and their rotated dims."""
    latent = config.latent
    q = "q_b_proj(q_latent)" if latent.q_rank is not None else "q_proj(x_in)"
    return {"attn.q_latent": f"q_latent = RMSNorm(q_a_proj(x_in))  ({latent.q_rank} wide)",
            "attn.q": f"q = heads({q})  ({latent.nope_dims} + {latent.rope_dims} dims each)",
            "attn.kv_latent": f"kv_latent = RMSNorm(kv_a_proj(x_in)[:{latent.kv_rank}])  (what a cache keeps)",
            "attn.k": f"k = heads(kv_b_proj(kv_latent))[:{latent.nope_dims}] + kv_a_proj(x_in)[{latent.kv_rank}:] "
                      "(shared by the heads)",
            "attn.q_rope": f"q_rope = RoPE(q[{latent.nope_dims}:], positions)",
            "attn.k_rope": f"k_rope = RoPE(k[{latent.nope_dims}:], positions)  (one for every head)"}


def _router_operation(experts: Experts) -> str:
    k, renormalised = experts.experts_per_token, ", renormalised" if experts.renormalise_top_k else ""
    if experts.router is RouterKind.SOFTMAX:
        return f"p = softmax(logits), top-{k} kept{renormalised}"
    if experts.router is RouterKind.SIGMOID_TOPK:
        return f"p = softmax(logits); the top-{k} logits chosen, s = sigmoid(logit)"
    if experts.router is RouterKind.SOFTMAX_BIASED:
        return f"p = softmax(logits); chosen by p + bias: top-{k}, their p renormalised"
    groups = f"top-{k} within the best {experts.groups_per_token} of {experts.expert_groups} groups"
    if experts.router is RouterKind.SOFTMAX_GROUPED:
        return f"p = softmax(logits), {groups} (a group's score: its best p)"
    bias = " + bias" if experts.choice_bias else ""
    return (f"p = s / Σs, s = sigmoid(logits); chosen by s{bias}: {groups} (a group's score: its two best)"
            f"{renormalised}")


def _weight_name(experts: Experts) -> str:
    """How the router weighs an expert's output: its probability, or DeepSeek's sigmoid score, times the scaling."""
    weight = "s_e" if experts.router is RouterKind.SIGMOID_GROUPED else "p_e"
    return weight if experts.routed_scaling == 1.0 else f"{experts.routed_scaling:g} · {weight}"


def step_operations(config: BlockConfig) -> dict[str, str]:
    """Each step as a formula, with the tutorial's variable names (x_norm1, attn_out, x1, ...)."""
    wiring = config.wiring
    alpha = "" if config.residual_scale == 1.0 else f"{config.residual_scale:.4g}·"
    multiplier = "" if config.residual_multiplier == 1.0 else f"{config.residual_multiplier:.4g}·"
    # What sets the layer's attention apart: no rotation in a RoPE model (NoPE), a sink logit per head (gpt-oss)
    parts = config.attention_parts
    marks = [mark for mark, on in (("NoPE", config.nope), ("sinks", parts.sinks),
                                   ("latent", config.latent is not None), ("L2 QK-norm", config.qk_norm is not None and not config.qk_norm.gain),
                                   (f"chunks of {parts.chunk}", parts.chunk is not None),
                                   ("query temperature", parts.temperature is not None),
                                   ("output gate", config.attn_output_gate)) if on]
    attention = f"MultiHeadAttention[{', '.join(marks)}]" if marks else "MultiHeadAttention"
    if config.token_mixer is not None:
        attention = MIXERS[config.token_mixer.mixer].label(config.token_mixer)
    functions = {Kind.NORM: _norm_name(config), Kind.ATTENTION: attention, Kind.FFN: _ffn_name(config)}
    formulas = {}
    for step in wiring.steps:
        values = [wiring.value_of(source) for source in step.reads]
        if step.kind is Kind.RESIDUAL:
            formula = f"{step.value} = {alpha}{values[0]} + {multiplier}{values[1]}"
        else:
            formula = f"{step.value} = {functions[step.kind]}({values[0]})"
        formulas[step.name] = f"{formula}  {step.note}" if step.note else formula
    return formulas
