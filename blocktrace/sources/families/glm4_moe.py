"""GLM-4.5 (Zhipu AI, 2025; HF's Glm4Moe): DeepSeek-V3's mixture of experts (the grouped sigmoid router with its
choice bias, `n_shared_experts` ungated shared experts, `first_k_dense_replace` dense layers first, the same keys)
under Llama's grouped-query attention: biases on q, k and v with `attention_bias` (none on the output projection),
an optional per-head QK-norm before RoPE (`use_qk_norm`: `self_attn.q_norm`, `self_attn.k_norm`), and RoPE on the
first half of each head's dims by default (`partial_rotary_factor` 0.5, as Glm4MoeConfig sets it when absent). The
multi-token prediction layers the hub's files hold after the last layer are not the model's layers."""

from __future__ import annotations

from blocktrace.sources.families.base import rope_fields
from blocktrace.sources.families.deepseek import DeepSeekV3
from blocktrace.sources.families.llama import Llama
from blocktrace.vocab import Norm


class Glm4Moe(DeepSeekV3):
    # grouped-query attention, DeepSeek-V3's experts
    name, hf_classes = "glm4_moe", ("Glm4MoeDecoderLayer",)
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "silu", "n_routed_experts": 128, "n_shared_experts": 1,
                "num_experts_per_tok": 8, "moe_intermediate_size": 1408, "intermediate_size": 10944,
                "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
                "routed_scaling_factor": 1.0, "use_qk_norm": False, "attention_bias": False}
    config_keys = {key: value for key, value in DeepSeekV3.config_keys.items() if key != "latent"}
    nested_keys = {}
    attention = staticmethod(Llama.attention)

    def config_fields(self, config):
        heads = config.integer("num_attention_heads")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads,
                "kv_heads": config.integer("num_key_value_heads") or heads, "head_size": config.integer("head_dim"),
                "norm": Norm.RMSNORM, "ffn": self.activation(config),
                "eps": self.setting(config, "rms_norm_eps", positive=True),
                "qk_norm": self.qk_norm(config), **self.bias_fields(config),
                **rope_fields(config, default_fraction=0.5), **self.router_fields(config)}

    def qk_norm(self, config) -> bool:
        return self.setting(config, "use_qk_norm", "boolean")

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False, "qkv_bias": self.setting(config, "attention_bias", "boolean")}

    def notes(self, config):
        return super(DeepSeekV3, self).notes(config)  # the experts' notes, not latent attention's
