"""ERNIE-4.5 dense (Baidu, 2025; HF's Ernie4_5): Llama's keys and block with RoPE that turns adjacent pairs
(x0, x1), (x2, x3)… (interleaved, theta 500000 by default), one `use_bias` for every linear layer, a head_dim of its
own (128 by default) and a tied head by default. In bfloat16 HF keeps the rotation's cos and sin in float32 where
blocktrace rounds them to the block's dtype first: last-bit differences in q and k there, none in float32."""

from __future__ import annotations

from blocktrace.sources.families.base import rope_fields
from blocktrace.sources.families.llama import Llama


class Ernie4_5(Llama):
    # Llama keys, interleaved RoPE
    name, hf_classes = "ernie4_5", ("Ernie4_5DecoderLayer",)
    defaults = {**Llama.defaults, "rms_norm_eps": 1e-5, "head_dim": 128, "use_bias": False}
    tie_default = True

    def config_fields(self, config):
        return {**super().config_fields(config), "head_size": self.head_size(config),
                "rope_interleaved": True, **rope_fields(config, default_theta=500_000.0)}

    def head_size(self, config):
        return self.setting(config, "head_dim", "integer")

    def bias_fields(self, config):
        bias = self.setting(config, "use_bias", "boolean")
        return {"bias": bias, "attn_bias": bias}
