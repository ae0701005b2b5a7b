"""dots.llm1 (rednote hi lab, 2025; HF's Dots1): DeepSeek-V3's mixture of experts (the grouped sigmoid router with its
choice bias, `n_shared_experts` ungated shared experts, `first_k_dense_replace` dense layers first, the same keys)
under Qwen3's attention: a per-head QK-norm before RoPE, `attention_bias` on q, k, v and o; sliding windows on the
layers `layer_types` marks, or, without it, from `max_window_layers` on wherever `sliding_window` is set (Dots1Config's
rule, with no use_sliding_window switch). Dots1Config has no default for the experts' count, choice or shared width:
a file without them is refused, as HF could not build the model."""

from __future__ import annotations

from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.glm4_moe import Glm4Moe
from blocktrace.sources.families.llama import SLIDING

EXPERTS_WITHOUT_DEFAULT = ("n_routed_experts", "num_experts_per_tok", "n_shared_experts")


class Dots1(Glm4Moe):
    # Qwen3's attention, DeepSeek-V3's experts
    name, hf_classes = "dots1", ("Dots1DecoderLayer",)
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "moe_intermediate_size": 1408, "intermediate_size": 10944,
                "first_k_dense_replace": 0, "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
                "routed_scaling_factor": 1.0, "attention_bias": False, "sliding_window": 4096,
                "max_window_layers": 62, **dict.fromkeys(EXPERTS_WITHOUT_DEFAULT)}  # Dots1Config's

    def config_fields(self, config):
        for key in EXPERTS_WITHOUT_DEFAULT:
            if config.integer(key, positive=key != "n_shared_experts") is None:
                raise config.bad(key, "an integer (Dots1Config has no default for it)", None)
        return {**super().config_fields(config), "rotary_fraction": 1.0}  # HF's default RoPE turns every dim

    def qk_norm(self, config) -> bool:
        return True  # Dots1Attention's q_norm and k_norm, per head, whatever the file says

    def bias_fields(self, config):
        bias = self.setting(config, "attention_bias", "boolean")
        return {"bias": False, "attn_bias": bias, "qkv_bias": bias}

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        return {**super().layer_fields(config, layer), "sliding_window": self.window(config, layer)}

    def window(self, config: ConfigFile, layer: int):
        """The layer's sliding window: layer_types', else Dots1Config's rule (from max_window_layers on)."""
        size = self.setting(config, "sliding_window", "integer")
        types = config.layer_types(config.integer("num_hidden_layers"))
        sliding = types[layer] == SLIDING if types is not None else \
            size is not None and layer >= self.setting(config, "max_window_layers", "integer", positive=False)
        return size if sliding else None
