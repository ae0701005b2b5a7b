"""LFM2 (Liquid AI, 2025; HF's Lfm2): a hybrid of gated short-convolution layers and attention layers. Every layer is
Pre-RMSNorm (operator_norm, ffn_norm) with a SwiGLU feed-forward (w1 gate, w3 up, w2 down); its token mixer is
either attention with a per-head QK-norm (q_layernorm, k_layernorm) and RoPE, or a short convolution
(config.ShortConvolution: conv.in_proj, conv.conv, conv.out_proj). `layer_types` says which ("full_attention" or
"conv"), or, without it, `full_attn_idxs` lists the attention layers (all of them when absent), as Lfm2Config
computes it. The FFN's width is Lfm2MLP's: with block_auto_adjust_ff_dim, ⅔ of intermediate_size (block_ff_dim in
the hub's files), times block_ffn_dim_multiplier, rounded up to block_multiple_of. The final norm is
`embedding_norm`, applied after the last layer."""

from __future__ import annotations

from typing import Optional

from blocktrace.config import ShortConvolution
from blocktrace.phrases import phrase
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import (gated_mlp, head_weight, HeadSpec, HFLayer, linear, LossKind,
                                              refuse_quantised, rmsnorm_shape, rope_fields)
from blocktrace.sources.families.gemma import FULL
from blocktrace.sources.families.llama import Llama
from blocktrace.vocab import FFNKind, Norm

CONV = "conv"
LFM2_STEPS = {"norm1": "operator_norm", "attn": "self_attn|conv", "norm2": "ffn_norm", "ffn": "feed_forward"}


class LFM2(Llama):
    # short-convolution and attention layers
    name, hf_classes = "lfm2", ("Lfm2DecoderLayer",)
    hf_layer = HFLayer(LFM2_STEPS, norm=Norm.RMSNORM)
    marker = "operator_norm.weight"
    tie_default = True
    defaults = {"norm_eps": 1e-5, "conv_L_cache": 3, "conv_bias": False, "block_auto_adjust_ff_dim": True,
                "block_ffn_dim_multiplier": 1.0, "block_multiple_of": 256}
    config_keys = {**Llama.config_keys, "eps": "norm_eps", "d_ff": "intermediate_size", "token_mixer": "conv_L_cache"}

    def config_fields(self, config):
        refuse_quantised(config)
        heads = config.integer("num_attention_heads")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "d_ff": self.ffn_width(config),
                "eps": self.setting(config, "norm_eps", positive=True), "ffn": self.activation(config),
                "norm": Norm.RMSNORM, "kv_heads": config.integer("num_key_value_heads") or heads, "qk_norm": True,
                "bias": False, "attn_bias": False, **rope_fields(config, default_theta=1_000_000.0)}

    def activation(self, config):
        return FFNKind.SWIGLU  # Lfm2MLP: w2(silu(w1(x)) · w3(x)); Lfm2Config has no hidden_act to read

    def ffn_width(self, config: ConfigFile) -> int:
        """Lfm2MLP's width, computed as it does (int() truncations included)."""
        width = config.integer("block_ff_dim") if "block_ff_dim" in config else config.integer("intermediate_size")
        if not self.setting(config, "block_auto_adjust_ff_dim", "boolean"):
            return width
        width = int(2 * width / 3)
        multiplier = self.setting(config, "block_ffn_dim_multiplier", positive=True)
        if multiplier is not None:
            width = int(multiplier * width)
            multiple = self.setting(config, "block_multiple_of", "integer", positive=True)
            width = multiple * ((width + multiple - 1) // multiple)
        return width

    def shape_fields(self, checkpoint, base):
        """The widths the tensors say, to hold config.json to them: d_model from the norm, d_ff from the FFN."""
        return rmsnorm_shape(checkpoint, base, norm="operator_norm.weight", ffn_in="feed_forward.w1.weight")

    def ties(self, config: Optional[ConfigFile]) -> bool:
        if config is not None and "tie_embedding" in config:  # the hub's name, which Lfm2Config reads first
            return config.boolean("tie_embedding")
        return super().ties(config)

    def layer_kinds(self, config: ConfigFile) -> list[str]:
        layers = config.integer("num_hidden_layers")
        kinds = config.layer_types(layers, known=(FULL, CONV))
        if kinds is not None:
            return kinds
        given = config.raw("full_attn_idxs")
        if given is None:
            return [FULL] * layers
        if not isinstance(given, list) or any(type(v) is not int or not 0 <= v < layers for v in given):
            raise config.bad("full_attn_idxs", f"a list of layer indices below {layers} (the attention layers)", given)
        return [FULL if layer in given else CONV for layer in range(layers)]

    def layer_fields(self, config, layer):
        if config is None or self.layer_kinds(config)[layer] != CONV:
            return {}
        kernel = self.setting(config, "conv_L_cache", "integer", positive=True)
        # the attention layers' settings mean nothing to a convolution: not said of it
        return {"token_mixer": ShortConvolution(kernel, self.setting(config, "conv_bias", "boolean")),
                "rope_theta": None, "rope_scaling": None, "qk_norm": False}

    def parameters(self, read, c):
        return {"norm1.weight": read("operator_norm.weight", (c.d_model,)), **self.mixer(read, c),
                "norm2.weight": read("ffn_norm.weight", (c.d_model,)),
                **gated_mlp(read, "feed_forward", "ffn", c.d_ff, c.d_model, names=("w1", "w3", "w2"))}

    @staticmethod
    def mixer(read, c) -> dict:
        d = c.d_model
        if c.token_mixer is not None:
            spec = c.token_mixer
            state = {**linear(read, "conv.in_proj", "attn.in_proj", 3 * d, d, spec.bias),
                     "attn.conv.weight": read("conv.conv.weight", (d, 1, spec.kernel)),
                     **linear(read, "conv.out_proj", "attn.out_proj", d, d, spec.bias)}
            if spec.bias:
                state["attn.conv.bias"] = read("conv.conv.bias", (d,))
            return state
        hd, q, kv = c.head_dim, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        return {**linear(read, "self_attn.q_proj", "attn.q_proj", q, d, False),
                **linear(read, "self_attn.k_proj", "attn.k_proj", kv, d, False),
                **linear(read, "self_attn.v_proj", "attn.v_proj", kv, d, False),
                **linear(read, "self_attn.out_proj", "attn.out_proj", d, q, False),
                "attn.q_norm.weight": read("self_attn.q_layernorm.weight", (hd,)),
                "attn.k_norm.weight": read("self_attn.k_layernorm.weight", (hd,))}

    def head(self, checkpoint, info):
        """embedding_norm (the final RMSNorm, after the last layer), then lm_head or the tied embedding."""
        weight, tied = head_weight(checkpoint, info, "lm_head.weight", f"{info.prefix}{self.embedding_key}")
        return HeadSpec(LossKind.NEXT_TOKEN, weight, f"{info.prefix}embedding_norm.weight", norm=Norm.RMSNORM,
                        eps=self.setting(info.config, "norm_eps", positive=True), tied=tied)

    def notes(self, config):
        notes = super().notes(config)
        if config is not None:
            kinds = self.layer_kinds(config)
            convolved = [str(k) for k, kind in enumerate(kinds) if kind == CONV]
            notes.append(phrase("short-convolution layers: {layers}", layers=", ".join(convolved) or "none"))
        return notes
