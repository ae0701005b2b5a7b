"""ERNIE-4.5 MoE (Baidu, 2025; HF's Ernie4_5_Moe): ERNIE-4.5's attention (ernie4_5.py: interleaved RoPE, one
`use_bias`, tied head) with a mixture of experts: `mlp.gate` computes in float32, the top-`moe_k` of softmax(logits)
+ `mlp.moe_statics.e_score_correction_bias` are chosen and their probabilities renormalised (router softmax_biased),
`moe_num_shared_experts` shared experts are one ungated SwiGLU `moe_num_shared_experts` × `moe_intermediate_size`
wide (`mlp.shared_experts`). The layers from `moe_layer_start_index` to `moe_layer_end_index` (−1: the last) whose
number is a multiple of `moe_layer_interval` are sparse, the others one SwiGLU of `intermediate_size`
(Ernie4_5_MoeDecoderLayer's rule). The multi-token-prediction layers are not the model's layers."""

from __future__ import annotations

from blocktrace.config import BIASED_ROUTER_NORM_MIN
from blocktrace.errors import WeightsError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import HFLayer, rmsnorm_shape
from blocktrace.sources.families.ernie4_5 import Ernie4_5
from blocktrace.sources.families.llama import LLAMA_STEPS
from blocktrace.sources.families.moe import MixtureFamily, expert_mlps, shared_mlp
from blocktrace.vocab import Norm, RouterKind


class Ernie4_5Moe(Ernie4_5):
    # interleaved RoPE, experts chosen with a bias
    name, hf_classes = "ernie4_5_moe", ("Ernie4_5_MoeDecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, router="mlp.gate")
    # Ernie4_5_MoeConfig's defaults; it has no head_dim (d / heads without one) and its moe_layer_end_index −1 or
    # absent is the last layer
    defaults = {**{k: v for k, v in Ernie4_5.defaults.items() if k != "head_dim"}, "moe_intermediate_size": 1536,
                "moe_k": 6, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
                "moe_layer_interval": 1, "moe_norm_min": 1e-12}

    config_keys = {**Ernie4_5.config_keys, "d_ff": "moe_intermediate_size"}

    def shape_fields(self, checkpoint, base):
        """The width the tensors say, to hold config.json to it (the FFN's width differs between dense and sparse
        layers: not compared)."""
        return rmsnorm_shape(checkpoint, base)

    def config_fields(self, config):
        norm_min = self.setting(config, "moe_norm_min", positive=True)
        if norm_min != BIASED_ROUTER_NORM_MIN:
            raise WeightsError(f"{config.path}: moe_norm_min {norm_min} is not supported (only {BIASED_ROUTER_NORM_MIN}, "
                               "HF's default: the floor under the chosen probabilities' sum)")
        if self.setting(config, "use_bias", "boolean"):  # no published ERNIE-4.5 MoE sets it (HF's default: off)
            raise WeightsError(f"{config.path}: use_bias true is not supported for {self.name}: HF's experts then have "
                               "no biases where its shared experts and attention do, a split blocktrace's block lacks")
        shared = self.setting(config, "moe_num_shared_experts", "integer", positive=False)
        width = self.setting(config, "moe_intermediate_size", "integer")
        return {**super().config_fields(config), "n_experts": self.setting(config, "moe_num_experts", "integer"),
                "experts_per_token": self.setting(config, "moe_k", "integer"), "d_ff": width,
                "router": RouterKind.SOFTMAX_BIASED, "choice_bias": True, "renormalise_top_k": True,
                "shared_expert_d_ff": shared * width if shared else None, "shared_expert_gated": False}

    def head_size(self, config):
        return config.integer("head_dim")  # Ernie4_5_MoeConfig has none: d / heads without one

    def sparse(self, config: ConfigFile, layer: int) -> bool:
        start = self.setting(config, "moe_layer_start_index", "integer", positive=False)
        end = config.integer("moe_layer_end_index", -1, positive=False)
        end = config.integer("num_hidden_layers") - 1 if end == -1 else end
        interval = self.setting(config, "moe_layer_interval", "integer")
        return (layer + 1) % interval == 0 and start <= layer <= end

    def layer_fields(self, config, layer):
        return MixtureFamily.dense_fields(self, config, layer)  # a dense layer is one SwiGLU of intermediate_size

    def ffn(self, read, c) -> dict:
        if c.experts is None:
            return self.mlp(read, c)
        e = c.experts.n_experts
        return {"ffn.router.weight": read("mlp.gate.weight", (e, c.d_model)),
                "ffn.choice_bias": read("mlp.moe_statics.e_score_correction_bias", (1, e)).reshape(e),
                **expert_mlps(read, c), **shared_mlp(read, c)}
