"""Helium (Kyutai, 2025; HF's Helium): Llama's keys and block with RoPE that turns adjacent pairs (interleaved, theta
100,000 by default), RMSNorm whose gain multiplies in float32 (HeliumRMSNorm: weight.float() · x̂, then the cast;
OLMo-2's order), biases on q, k and v only with `attention_bias` (o_proj never has one), `mlp_bias` on the three MLP
projections, head_dim 128 and eps 1e-8 by default. Its o_proj is [d, d]: a file whose heads × head_dim is not
hidden_size is refused, as HF could not load it."""

from __future__ import annotations

from blocktrace.sources.families.base import rope_fields
from blocktrace.sources.families.llama import Llama

DEFAULT_THETA = 100_000.0  # HeliumConfig's default_theta


class Helium(Llama):
    # Llama keys, interleaved RoPE
    name, hf_classes = "helium", ("HeliumDecoderLayer",)
    defaults = {**Llama.defaults, "rms_norm_eps": 1e-8, "head_dim": 128}  # HeliumConfig's

    def config_fields(self, config):
        heads, width = config.integer("num_attention_heads"), config.integer("hidden_size")
        head_size = self.setting(config, "head_dim", "integer")
        if heads is not None and width is not None and heads * head_size != width:
            raise config.bad("head_dim", f"hidden_size / num_attention_heads = {width / heads:g} (Helium's o_proj is "
                             "hidden_size × hidden_size)", head_size)
        return {**super().config_fields(config), "head_size": head_size, "rope_interleaved": True,
                "norm_gain_float32": True, **rope_fields(config, default_theta=DEFAULT_THETA)}

    def bias_fields(self, config):
        return {"bias": config.boolean("mlp_bias", False), "attn_bias": False,
                "qkv_bias": config.boolean("attention_bias", False)}
