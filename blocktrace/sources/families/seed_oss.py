"""Seed-OSS (ByteDance Seed, 2025; HF's SeedOss): Llama's keys and block with biases of their own — on q, k and v
(`attention_bias`, on by default), on the output projection (`attention_out_bias`) and on the MLP (`mlp_bias`) —
and a head_dim of its own (128 by default, whatever hidden_size / num_attention_heads is). Its dropouts act in
training only."""

from __future__ import annotations

from blocktrace.sources.families.llama import Llama


class SeedOss(Llama):
    # Llama keys, q/k/v biases
    name, hf_classes = "seed_oss", ("SeedOssDecoderLayer",)
    defaults = {**Llama.defaults, "head_dim": 128, "attention_bias": True, "attention_out_bias": False,
                "mlp_bias": False}

    def config_fields(self, config):
        return {**super().config_fields(config), "head_size": self.setting(config, "head_dim", "integer")}

    def bias_fields(self, config):
        return {"bias": self.setting(config, "mlp_bias", "boolean"),
                "attn_bias": self.setting(config, "attention_out_bias", "boolean"),
                "qkv_bias": self.setting(config, "attention_bias", "boolean")}
