"""Apertus (Swiss AI, 2025; HF's Apertus): Llama's attention with a per-head QK-norm before RoPE (Qwen3's), its
norms named `attention_layernorm` and `feedforward_layernorm`, and an ungated MLP down(xIELU(up(x))): xIELU's two
learned scalars and its constants β and ε are tensors of each layer (`mlp.act_fn.alpha_p`, `alpha_n`, `beta`,
`eps`). RoPE is llama3-scaled at theta 12,000,000 by default (ApertusConfig's rope_parameters when a file has none)."""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.arcee import Arcee
from blocktrace.sources.families.base import HFLayer, rmsnorm_shape, rope_fields
from blocktrace.sources.families.llama import Llama
from blocktrace.vocab import FFNKind, Norm

APERTUS_STEPS = {"norm1": "attention_layernorm", "attn": "self_attn", "norm2": "feedforward_layernorm", "ffn": "mlp"}
# ApertusConfig's RoPE when the file gives none (its __post_init__), and its theta.
DEFAULT_ROPE = {"rope_type": "llama3", "rope_theta": 12_000_000.0, "factor": 8.0,
                "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


class Apertus(Llama):
    # Llama keys, QK-norm, xIELU MLP
    name, hf_classes = "apertus", ("ApertusDecoderLayer",)
    hf_layer = HFLayer(APERTUS_STEPS, norm=Norm.RMSNORM, hidden="mlp.act_fn")
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "xielu"}  # ApertusConfig's
    marker = "attention_layernorm.weight"
    activations = {"xielu": FFNKind.XIELU}  # ApertusMLP's; another hidden_act is refused

    def config_fields(self, config):
        parameters = config.merged("rope_scaling", "rope_parameters")
        if not parameters.data:
            parameters = ConfigFile(config.path, DEFAULT_ROPE)
        return {**super().config_fields(config), "qk_norm": True,
                **rope_fields(config, parameters=parameters, default_theta=DEFAULT_ROPE["rope_theta"])}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, norm="attention_layernorm.weight", ffn_in="mlp.up_proj.weight",
                             ffn=FFNKind.XIELU)

    def parameters(self, read, c):
        return {"norm1.weight": read("attention_layernorm.weight", (c.d_model,)), **self.attention(read, c),
                "norm2.weight": read("feedforward_layernorm.weight", (c.d_model,)), **self.mlp(read, c)}

    @staticmethod
    def mlp(read, c) -> dict:
        return {**Arcee.mlp(read, c),  # up_proj and down_proj around an activation, here with weights of its own
                "ffn.act.alpha_p": read("mlp.act_fn.alpha_p", (1,)), "ffn.act.alpha_n": read("mlp.act_fn.alpha_n", (1,)),
                "ffn.act.beta": read("mlp.act_fn.beta", ()), "ffn.act.eps": read("mlp.act_fn.eps", ())}

    def check(self, config):
        if config.ffn is not FFNKind.XIELU or config.norm is not Norm.RMSNORM or config.sandwich:
            raise UsageError(f"{self.name} weights need --norm rmsnorm, --ffn xielu and no sandwich norms")
