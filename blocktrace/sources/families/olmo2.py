"""OLMo-2 (Llama's key names, its own wiring): the norms sit after the sublayers, before each
residual add — x + norm(attn(x)), then x1 + norm(mlp(x1)), "reordered norm" in the OLMo-2
paper — so a layer has `post_attention_layernorm` and `post_feedforward_layernorm` and no
`input_layernorm`; QK-norm is one RMSNorm over all heads' q (and one over all k), applied to
the projection before it is split into heads; RMSNorm multiplies its gain in float32."""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import WHOLE_QK_NORM, HFLayer, rmsnorm_shape
from blocktrace.sources.families.llama import Llama
from blocktrace.vocab import FFNKind, Norm, Placement
from blocktrace.wiring import REORDERED


class OLMo2(Llama):
    # Llama keys, norms after each sublayer, QK-norm
    name, hf_classes = "olmo2", ("Olmo2DecoderLayer",)
    hf_layer = HFLayer({"attn": "self_attn", "norm1": "post_attention_layernorm", "ffn": "mlp",
                        "norm2": "post_feedforward_layernorm"}, REORDERED, Norm.RMSNORM, hidden="mlp.act_fn")
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "silu"}
    marker = "post_feedforward_layernorm.weight"  # no input_layernorm: the norms follow the sublayers

    def config_fields(self, config):
        return {**super().config_fields(config), "placement": Placement.REORDERED, "qk_norm": WHOLE_QK_NORM,
                "norm_gain_float32": True}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, norm="post_attention_layernorm.weight", ffn_in="mlp.gate_proj.weight")

    def parameters(self, read, c):
        d = c.d_model
        return {**self.attention(read, c), "norm1.weight": read("post_attention_layernorm.weight", (d,)),
                **self.mlp(read, c), "norm2.weight": read("post_feedforward_layernorm.weight", (d,))}

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm is not Norm.RMSNORM or \
                config.placement is not Placement.REORDERED or config.qk_norm != WHOLE_QK_NORM:
            raise UsageError("olmo2 weights need --norm rmsnorm, --ffn swiglu, the reordered wiring (a norm after "
                             "each sublayer) and its QK-norm over all heads")
