"""gpt-oss (OpenAI, 2025; Llama's key names): a mixture of experts in every layer with three pieces of its own —
attention sinks (`self_attn.sinks`: one learned logit per head that joins each softmax row and takes weight from
the keys, then is dropped), a router with a bias whose top-k logits are softmaxed (the chosen experts' probabilities
renormalised: the same numbers), and experts whose gate and up projections are stored fused and interleaved
(`mlp.experts.gate_up_proj` [E, d, 2f], gate in the even columns) with biases, computing
down((clamp(up, ±L) + 1) · g·sigmoid(α·g)), g = min(gate, L). Biases on q, k, v and o; YaRN RoPE; sliding-window
layers alternating with full ones (`layer_types`, or every other layer from the first). The hub's MXFP4 files
(quantization_config) are refused: trace the bf16 checkpoint."""

from __future__ import annotations

from blocktrace.config import GLUClamp
from blocktrace.errors import UsageError
from blocktrace.sources.families.base import HFLayer, rope_fields
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama, every_other_layer
from blocktrace.sources.families.moe import MixtureFamily
from blocktrace.sources.configfile import ConfigFile
from blocktrace.vocab import FFNKind, Norm

# GptOssConfig's RoPE when the file gives none (its __post_init__), and its theta.
DEFAULT_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


class GptOss(MixtureFamily, Llama):
    # attention sinks, biased router, clamped SwiGLU experts
    name, hf_classes = "gpt_oss", ("GptOssDecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, router="mlp.router")
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "silu", "sliding_window": 128, "swiglu_limit": 7.0,
                "swiglu_alpha": 1.702, "intermediate_size": 2880, "num_experts_per_tok": 4, "rope_theta": 150_000.0}
    expert_width_key = "intermediate_size"
    always_renormalise = True  # softmax over the top-k logits: the chosen probabilities renormalised

    def config_fields(self, config):
        heads = config.integer("num_attention_heads")
        parameters = config.merged("rope_scaling", "rope_parameters")
        if not parameters.data:
            parameters = ConfigFile(config.path, DEFAULT_ROPE)
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "head_size": config.integer("head_dim"),
                "kv_heads": config.integer("num_key_value_heads") or heads, "norm": Norm.RMSNORM,
                "eps": self.setting(config, "rms_norm_eps", positive=True), "ffn": FFNKind.SWIGLU_CLAMPED,
                "bias": True, "attn_bias": config.boolean("attention_bias", True), "attn_sinks": True,
                "router_bias": True, "glu_clamp": GLUClamp(self.setting(config, "swiglu_limit", positive=True),
                                      self.setting(config, "swiglu_alpha", positive=True)), **self.moe_fields(config),
                **rope_fields(config, parameters=parameters, default_theta=self.defaults["rope_theta"])}

    def activation(self, config):
        return FFNKind.SWIGLU_CLAMPED

    sliding_by_default = staticmethod(every_other_layer)

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        return {"sliding_window": self.required(config, "sliding_window", f"layer {layer} attends within a window, "
                                                "sized", "integer") if self.sliding(config, layer) else None}

    def shape_fields(self, checkpoint, base):
        return {**MixtureFamily.shape_fields(self, checkpoint, base), "ffn": FFNKind.SWIGLU_CLAMPED}

    def parameters(self, read, c):
        d, e, f = c.d_model, c.experts.n_experts, c.d_ff
        state = {"norm1.weight": read("input_layernorm.weight", (d,)), **self.attention(read, c),
                 "attn.sinks": read("self_attn.sinks", (c.n_heads,)),
                 "norm2.weight": read("post_attention_layernorm.weight", (d,)),
                 "ffn.router.weight": read("mlp.router.weight", (e, d)), "ffn.router.bias": read("mlp.router.bias", (e,))}
        gate_up, gate_up_bias = read("mlp.experts.gate_up_proj", (e, d, 2 * f)), \
            read("mlp.experts.gate_up_proj_bias", (e, 2 * f))
        down, down_bias = read("mlp.experts.down_proj", (e, f, d)), read("mlp.experts.down_proj_bias", (e, d))
        for k in range(e):  # HF computes x @ W + b and takes the gate from the even columns, up from the odd
            state.update({f"ffn.experts.{k}.gate.weight": gate_up[k][:, 0::2].t().contiguous(),
                          f"ffn.experts.{k}.gate.bias": gate_up_bias[k][0::2].contiguous(),
                          f"ffn.experts.{k}.up.weight": gate_up[k][:, 1::2].t().contiguous(),
                          f"ffn.experts.{k}.up.bias": gate_up_bias[k][1::2].contiguous(),
                          f"ffn.experts.{k}.down.weight": down[k].t().contiguous(),
                          f"ffn.experts.{k}.down.bias": down_bias[k].contiguous()})
        return state

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU_CLAMPED or config.norm is not Norm.RMSNORM or config.sandwich:
            raise UsageError("gpt_oss weights need --norm rmsnorm, its clamped SwiGLU experts and Pre-LN wiring")

    def notes(self, config):
        return [*super().notes(config), "attention sinks: each query's weights over the keys sum to less than 1 (its "
                "head's sink takes the rest, as in HF); the attention statistics and checks read the keys' weights"]

    def top_level_defaults(self, config):
        return [key for key in self.defaults if key != "rope_theta"]
