"""GLM-4 dense (Zhipu AI, 2025; HF's Glm4): a sandwich of four RMSNorms per layer — input_layernorm before attention
and post_self_attn_layernorm after it, post_attention_layernorm before the MLP and post_mlp_layernorm after it
(Gemma-2's wiring, with plain gains) — SwiGLU with gate and up stacked in `mlp.gate_up_proj` (Phi-3's layout), biases
on q, k and v with `attention_bias` (on by default; none on o_proj), and RoPE turning adjacent pairs of the first
`partial_rotary_factor` of each head (0.5 when absent, as Glm4Config sets it)."""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import HFLayer, rmsnorm_shape, rope_fields
from blocktrace.sources.families.llama import Llama
from blocktrace.sources.families.phi3 import Phi3
from blocktrace.vocab import FFNKind, Norm, Placement
from blocktrace.wiring import SANDWICH

GLM4_STEPS = {"norm1": "input_layernorm", "attn": "self_attn", "post_attn_norm": "post_self_attn_layernorm",
              "norm2": "post_attention_layernorm", "ffn": "mlp", "post_ffn_norm": "post_mlp_layernorm"}


class Glm4(Llama):
    # four norms per layer, fused gate_up_proj
    name, hf_classes = "glm4", ("Glm4DecoderLayer",)
    hf_layer = HFLayer(GLM4_STEPS, SANDWICH, Norm.RMSNORM, hidden="mlp.activation_fn")
    defaults = {"rms_norm_eps": 1.5625e-07, "hidden_act": "silu", "head_dim": 128, "attention_bias": True}
    mlp = staticmethod(Phi3.mlp)

    def config_fields(self, config):
        return {**super().config_fields(config), "placement": Placement.SANDWICH, "rope_interleaved": True,
                "head_size": self.setting(config, "head_dim", "integer"), **rope_fields(config, default_fraction=0.5)}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False, "qkv_bias": self.setting(config, "attention_bias", "boolean")}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, ffn_in="mlp.gate_up_proj.weight", fused=2)

    def parameters(self, read, c):
        d = c.d_model
        return {"norm1.weight": read("input_layernorm.weight", (d,)), **self.attention(read, c),
                "post_attn_norm.weight": read("post_self_attn_layernorm.weight", (d,)),
                "norm2.weight": read("post_attention_layernorm.weight", (d,)), **self.mlp(read, c),
                "post_ffn_norm.weight": read("post_mlp_layernorm.weight", (d,))}

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm is not Norm.RMSNORM or not config.sandwich:
            raise UsageError("glm4 weights hold four norms per layer: they need --norm rmsnorm, --ffn swiglu and the "
                             "sandwich wiring")
