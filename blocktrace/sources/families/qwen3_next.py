"""Qwen3-Next (Qwen, 2025; HF's Qwen3Next): a hybrid of gated delta-rule layers and gated attention layers, with
Qwen2-MoE's experts. Every layer is Pre-RMSNorm (input_layernorm, post_attention_layernorm), each norm's gain
(1 + w) in float32 as Gemma's; its token mixer is either
- a gated delta net (config.GatedDeltaNet: `linear_attn.in_proj_qkvz`, `in_proj_ba`, `conv1d`, `dt_bias`, `A_log`,
  `norm`, `out_proj`), or
- gated attention: q_proj makes each head's query and its gate side by side ([H, 2, head_dim] rows; read here as
  attn.q_proj and attn.gate_proj), a per-head QK-norm with gain (1 + w), RoPE on the first `partial_rotary_factor`
  of each head's dims (0.25 by default), each head's output × sigmoid(gate) before o_proj.
`layer_types` says which ("linear_attention", "full_attention"), or, without it, every `full_attention_interval`-th
layer (4) attends, as Qwen3NextConfig computes it. The FFN is Qwen2-MoE's: experts of `moe_intermediate_size` with a
shared expert gated by sigmoid(w·x), top-k renormalised with `norm_topk_prob` (default true here); layers that
`mlp_only_layers` or `decoder_sparse_step` leave dense, and every layer where num_experts is 0, have one SwiGLU of
`intermediate_size`. The multi-token-prediction head (`mtp.*`) is outside the layers and not read."""

from __future__ import annotations

from typing import Optional

import torch

from blocktrace.config import GatedDeltaNet
from blocktrace.phrases import phrase
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import HFLayer, linear, refuse_quantised, rope_fields
from blocktrace.sources.families.gemma import FULL
from blocktrace.sources.families.moe import Qwen2MoE
from blocktrace.vocab import Norm

LINEAR = "linear_attention"
# Qwen3NextConfig's rule without layer_types: every 4th layer attends (a keyword it pops, so no attribute of it)
FULL_ATTENTION_INTERVAL = 4
QWEN3_NEXT_STEPS = {"norm1": "input_layernorm", "attn": "self_attn|linear_attn", "norm2": "post_attention_layernorm",
                    "ffn": "mlp"}


class Qwen3Next(Qwen2MoE):
    # gated delta-rule and gated attention layers, experts
    name, hf_classes = "qwen3_next", ("Qwen3NextDecoderLayer",)
    hf_layer = HFLayer(QWEN3_NEXT_STEPS, norm=Norm.RMSNORM, router="mlp.gate")
    # Qwen3NextConfig's defaults
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "head_dim": 256, "attention_bias": False,
                "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
                "shared_expert_intermediate_size": 512, "norm_topk_prob": True,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32}

    def config_fields(self, config):
        refuse_quantised(config)
        heads = config.integer("num_attention_heads")
        experts = self.setting(config, "num_experts", "integer", positive=False)
        ffn = {**self.moe_fields(config), "shared_expert_d_ff": self.setting(
            config, "shared_expert_intermediate_size", "integer")} if experts else self.all_dense(config)
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "norm": Norm.RMSNORM,
                "eps": self.setting(config, "rms_norm_eps", positive=True), "ffn": self.activation(config),
                "kv_heads": config.integer("num_key_value_heads") or heads,
                "head_size": self.setting(config, "head_dim", "integer"), "bias": False,
                "attn_bias": self.setting(config, "attention_bias", "boolean"), "qk_norm": True, "norm_offset": 1.0,
                "attn_output_gate": True, **rope_fields(config, default_fraction=0.25), **ffn}

    def moe_fields(self, config: ConfigFile) -> dict:
        return {"n_experts": self.setting(config, "num_experts", "integer"),
                "d_ff": self.setting(config, "moe_intermediate_size", "integer"),
                "experts_per_token": self.setting(config, "num_experts_per_tok", "integer"),
                "renormalise_top_k": self.always_renormalise or self.setting(config, "norm_topk_prob", "boolean")}

    @staticmethod
    def all_dense(config: ConfigFile) -> dict:
        return {"experts": None, "d_ff": config.integer("intermediate_size")}

    def sparse(self, config: ConfigFile, layer: int) -> bool:
        """Qwen2-MoE's rule, where the model has experts at all (HF: num_experts > 0)."""
        return bool(self.setting(config, "num_experts", "integer", positive=False)) and super().sparse(config, layer)

    def norm_offset(self) -> float:
        return 1.0  # the final norm too is Qwen3NextRMSNorm: gain (1 + w)

    def layer_kinds(self, config: ConfigFile) -> list[str]:
        layers = config.integer("num_hidden_layers")
        kinds = config.layer_types(layers, known=(FULL, LINEAR))
        if kinds is not None:
            return kinds
        interval = config.integer("full_attention_interval", FULL_ATTENTION_INTERVAL)
        return [LINEAR if (layer + 1) % interval else FULL for layer in range(layers)]

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        fields = self.dense_fields(config, layer)
        if self.layer_kinds(config)[layer] != LINEAR:
            return fields
        mixer = GatedDeltaNet(*(self.setting(config, key, "integer", positive=True) for key in (
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")))
        # the attention layers' settings mean nothing to a delta net: not said of it
        return {**fields, "token_mixer": mixer, "rope_theta": None, "rope_scaling": None, "rotary_fraction": 1.0,
                "qk_norm": False, "attn_output_gate": False}

    def attention(self, read, c) -> dict:
        return self.delta_net(read, c) if c.token_mixer is not None else self.gated_attention(read, c)

    @staticmethod
    def gated_attention(read, c) -> dict:
        """q_proj's rows are [head, (query, gate), head_dim]: the queries and the gates read apart."""
        d, h, hd = c.d_model, c.n_heads, c.head_dim
        kv = c.n_kv_heads * hd
        fused = read("self_attn.q_proj.weight", (2 * h * hd, d)).view(h, 2, hd, d)
        state = {"attn.q_proj.weight": fused[:, 0].reshape(h * hd, d).contiguous(),
                 "attn.gate_proj.weight": fused[:, 1].reshape(h * hd, d).contiguous(),
                 **linear(read, "self_attn.k_proj", "attn.k_proj", kv, d, c.projection_bias),
                 **linear(read, "self_attn.v_proj", "attn.v_proj", kv, d, c.projection_bias),
                 **linear(read, "self_attn.o_proj", "attn.out_proj", d, h * hd, c.attention_bias),
                 "attn.q_norm.weight": read("self_attn.q_norm.weight", (hd,)),
                 "attn.k_norm.weight": read("self_attn.k_norm.weight", (hd,))}
        if c.projection_bias:
            bias = read("self_attn.q_proj.bias", (2 * h * hd,)).view(h, 2, hd)
            state.update({"attn.q_proj.bias": bias[:, 0].reshape(h * hd).contiguous(),
                          "attn.gate_proj.bias": bias[:, 1].reshape(h * hd).contiguous()})
        return state

    def delta_net(self, read, c) -> dict:
        spec, d = c.token_mixer, c.d_model
        keys, values = spec.key_heads * spec.key_dims, spec.value_heads * spec.value_dims
        return {**self.delta_projections(read, c),
                "attn.conv.weight": read("linear_attn.conv1d.weight", (2 * keys + values, 1, spec.kernel)),
                "attn.dt_bias": read("linear_attn.dt_bias", (spec.value_heads,)),
                "attn.A_log": read("linear_attn.A_log", (spec.value_heads,)),
                "attn.norm.weight": read("linear_attn.norm.weight", (spec.value_dims,)),
                "attn.out_proj.weight": read("linear_attn.out_proj.weight", (d, values))}

    @staticmethod
    def delta_projections(read, c) -> dict:
        """in_proj_qkvz and in_proj_ba, grouped by key head as Qwen3-Next stores them (and its module reads them)."""
        spec, d = c.token_mixer, c.d_model
        keys, values = spec.key_heads * spec.key_dims, spec.value_heads * spec.value_dims
        return {"attn.in_proj_qkvz.weight": read("linear_attn.in_proj_qkvz.weight", (2 * keys + 2 * values, d)),
                "attn.in_proj_ba.weight": read("linear_attn.in_proj_ba.weight", (2 * spec.value_heads, d))}

    def notes(self, config: Optional[ConfigFile]):
        notes = super().notes(config)
        if config is not None:
            linear_layers = [str(k) for k, kind in enumerate(self.layer_kinds(config)) if kind == LINEAR]
            notes.append(phrase("gated delta-rule layers: {layers}", layers=", ".join(linear_layers) or "none"))
            if "layer_types" not in config and "full_attention_interval" not in config:
                notes.append(phrase("config.json has no layer_types and no full_attention_interval: every {interval}th "
                                    "layer attends, the others are delta-rule layers, as HF computes it",
                                    interval=FULL_ATTENTION_INTERVAL))
        return notes


def grouped_by_key_head(spec: GatedDeltaNet, d: int, *parts: torch.Tensor) -> torch.Tensor:
    """Projections stored apart, each [key_heads · width, d] with its rows in head order, as one matrix whose rows are
    grouped by key head (per key head, a slice of each part in turn): Qwen3-Next's in_proj_qkvz and in_proj_ba
    layout, the one the gated delta net's module reads. A permutation of rows: every number the same."""
    return torch.cat([part.reshape(spec.key_heads, -1, d) for part in parts], dim=1).reshape(-1, d)
