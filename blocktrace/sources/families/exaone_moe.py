"""EXAONE-MoE (LG, 2025; HF's ExaoneMoe): EXAONE-4's attention — a per-head QK-norm, sliding-window layers that
rotate q and k, global layers without RoPE (NoPE) wherever the model has a sliding window — in a Pre-RMSNorm layer
(OLMoE's: input_layernorm, post_attention_layernorm, not EXAONE-4's reordered norms), with DeepSeek-V3's experts:
the grouped sigmoid router with its choice bias (kept in the file as `mlp.e_score_correction_bias`),
`num_shared_experts` ungated shared experts, × `routed_scaling_factor`. `mlp_layer_types` ("dense", "sparse") says
which layers have experts, else the first `first_k_dense_replace` are dense, as ExaoneMoeConfig computes it."""

from __future__ import annotations

from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import rope_fields
from blocktrace.sources.families.exaone4 import Exaone4
from blocktrace.sources.families.glm4_moe import Glm4Moe

MLP_KINDS = ("dense", "sparse")


class ExaoneMoe(Glm4Moe):
    # EXAONE-4's attention, DeepSeek-V3's experts
    name, hf_classes = "exaone_moe", ("ExaoneMoeDecoderLayer",)
    choice_bias_key = "mlp.e_score_correction_bias"
    routed_key, shared_key = "num_experts", "num_shared_experts"
    config_keys = {**Glm4Moe.config_keys, "n_experts": "num_experts"}  # errors say the file's own key
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "silu", "intermediate_size": 16384, "moe_intermediate_size": 1024,
                "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1, "first_k_dense_replace": 1,
                "norm_topk_prob": True, "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
                "sliding_window": 4096, "sliding_window_pattern": 4}  # ExaoneMoeConfig's
    sliding_by_default = Exaone4.sliding_by_default

    def config_fields(self, config):
        return {**super().config_fields(config), **rope_fields(config)}  # every dim rotated: not GLM-4.5's half

    def qk_norm(self, config) -> bool:
        return True  # Exaone4Attention's q_norm and k_norm, per head

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False}

    def sparse(self, config: ConfigFile, layer: int) -> bool:
        kinds = config.raw("mlp_layer_types", None)
        if kinds is None:
            return super().sparse(config, layer)
        layers = config.integer("num_hidden_layers")
        if not isinstance(kinds, list) or len(kinds) != layers or any(kind not in MLP_KINDS for kind in kinds):
            raise config.bad("mlp_layer_types", f"a list of {layers} entries, each dense or sparse", kinds)
        return kinds[layer] == "sparse"

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        return {**super().layer_fields(config, layer), **Exaone4.layer_fields(self, config, layer)}
