"""OLMo-Hybrid (Ai2, 2026; HF's OlmoHybrid): gated delta-rule layers among attention layers, each kind with its own
wiring and its own HF class.
- A delta-rule layer (OlmoHybridLinearAttentionDecoderLayer) is Pre-RMSNorm (input_layernorm,
  post_attention_layernorm), its token mixer Qwen3-Next's gated delta net with its projections stored apart
  (`linear_attn.q_proj`, `k_proj`, `v_proj`, `g_proj` the output gate, `a_proj`, `b_proj`; read into Qwen3-Next's
  grouping by key head, a permutation of rows), β = 2·sigmoid(b) with `linear_allow_neg_eigval` (its default: the
  state's eigenvalues may turn negative), and its output norm at eps 1e-5 whatever `rms_norm_eps` (`o_norm`, as FLA's
  fused kernel).
- An attention layer is OLMo-3's: the norms after each sublayer (post_attention_layernorm, post_feedforward_layernorm),
  QK-norm over all heads, no sliding window; RoPE only where the file gives rope_parameters with a theta (the released
  checkpoints have none: every layer NoPE, as HF computes it).
The norms' gains multiply in float32 (Olmo2RMSNorm). `layer_types`, or OlmoHybridConfig's rule (every 4th layer
attends; the last one when that leaves none), says which."""

from __future__ import annotations

import torch

from blocktrace.config import GatedDeltaNet
from blocktrace.errors import UsageError, WeightsError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import NOPE_FIELDS, WHOLE_QK_NORM, HFLayer, linear, rmsnorm_shape, rope_fields
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.sources.families.olmo2 import OLMo2
from blocktrace.sources.families.qwen3_next import LINEAR, grouped_by_key_head
from blocktrace.vocab import FFNKind, Norm, Placement

FULL = "full_attention"
DELTA_NORM_EPS = 1e-5  # OlmoHybridGatedDeltaNet's o_norm: FLA's FusedRMSNormGated default, not rms_norm_eps
ATTENTION_LAYER, DELTA_LAYER = "OlmoHybridAttentionDecoderLayer", "OlmoHybridLinearAttentionDecoderLayer"
# The norms as its files name them (OLMo-core's), then as HF's modules do (transformers renames them on load)
ATTENTION_NORM = ("attention_layer_norm.weight", "input_layernorm.weight")
FEEDFORWARD_NORM = ("feedforward_layer_norm.weight", "post_attention_layernorm.weight")


class OlmoHybrid(Llama):
    # gated delta-rule layers among OLMo-3 attention
    name, hf_classes = "olmo_hybrid", (ATTENTION_LAYER, DELTA_LAYER)
    hf_layers = {ATTENTION_LAYER: OLMo2.hf_layer,
                 DELTA_LAYER: HFLayer({**LLAMA_STEPS, "attn": "linear_attn"}, norm=Norm.RMSNORM, hidden="mlp.act_fn")}
    hf_layer = hf_layers[ATTENTION_LAYER]
    marker = "feedforward_layer_norm.weight"  # in both kinds of layer, under OLMo-core's name
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "linear_conv_kernel_dim": 4,
                "linear_allow_neg_eigval": True}  # OlmoHybridConfig's

    def config_fields(self, config):
        """The attention layers' block (a delta-rule layer's differences are its layer_fields)."""
        parameters = config.merged("rope_scaling", "rope_parameters")
        rotary = rope_fields(config) if parameters.number("rope_theta", None) is not None else NOPE_FIELDS
        return {**super().config_fields(config), "placement": Placement.REORDERED, "qk_norm": WHOLE_QK_NORM,
                "norm_gain_float32": True, **rotary}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": self.setting(config, "attention_bias", "boolean")}

    def layer_kinds(self, config: ConfigFile) -> list[str]:
        layers = config.integer("num_hidden_layers")
        kinds = config.layer_types(layers, known=(FULL, LINEAR))
        if kinds is None:
            kinds = [FULL if layer % 4 == 3 else LINEAR for layer in range(layers)]
            if FULL not in kinds:
                kinds[-1] = FULL
        return kinds

    def layer_fields(self, config, layer):
        if config is None or self.layer_kinds(config)[layer] != LINEAR:
            return {}
        return {"placement": Placement.PRE, "token_mixer": self.delta_net_spec(config), "rope_theta": None,
                "rope_scaling": None, "nope": False, "qk_norm": None}

    def delta_net_spec(self, config: ConfigFile) -> GatedDeltaNet:
        """OlmoHybridConfig's widths, defaulted as it defaults them: a key head per attention head of 0.75·d/heads
        dims, as many value heads of twice that."""
        heads = config.integer("num_attention_heads")
        key_heads = config.integer("linear_num_key_heads") or heads
        key_dims = config.integer("linear_key_head_dim") or int(0.75 * config.integer("hidden_size") / key_heads)
        return GatedDeltaNet(key_heads, config.integer("linear_num_value_heads") or heads, key_dims,
                             config.integer("linear_value_head_dim") or 2 * key_dims,
                             self.setting(config, "linear_conv_kernel_dim", "integer"),
                             beta_scale=2.0 if self.setting(config, "linear_allow_neg_eigval", "boolean") else 1.0,
                             norm_eps=DELTA_NORM_EPS)

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, norm=FEEDFORWARD_NORM[0], ffn_in="mlp.gate_proj.weight")

    def parameters(self, read, c):
        d = c.d_model
        if c.token_mixer is None:  # OLMo-3's: the norms after attention and after the MLP
            return {**self.attention(read, c), "norm1.weight": read(FEEDFORWARD_NORM, (d,)), **self.mlp(read, c),
                    "norm2.weight": read("post_feedforward_layernorm.weight", (d,))}
        return {"norm1.weight": read(ATTENTION_NORM, (d,)), **self.delta_net(read, c),
                "norm2.weight": read(FEEDFORWARD_NORM, (d,)), **self.mlp(read, c)}

    @staticmethod
    def delta_net(read, c) -> dict:
        """The projections apart, grouped by key head as the gated delta net's module reads them (per key head its
        q, its k, its value heads' v and gate; its value heads' b and a)."""
        spec, d = c.token_mixer, c.d_model
        keys, values = spec.key_heads * spec.key_dims, spec.value_heads * spec.value_dims
        q, k = read("linear_attn.q_proj.weight", (keys, d)), read("linear_attn.k_proj.weight", (keys, d))
        v, z = read("linear_attn.v_proj.weight", (values, d)), read("linear_attn.g_proj.weight", (values, d))
        b = read("linear_attn.b_proj.weight", (spec.value_heads, d))
        a = read("linear_attn.a_proj.weight", (spec.value_heads, d))
        return {"attn.in_proj_qkvz.weight": grouped_by_key_head(spec, d, q, k, v, z),
                "attn.in_proj_ba.weight": grouped_by_key_head(spec, d, b, a),
                "attn.conv.weight": _convolution(read, keys, values, spec.kernel),
                "attn.dt_bias": read("linear_attn.dt_bias", (spec.value_heads,)),
                "attn.A_log": read("linear_attn.A_log", (spec.value_heads,)),
                "attn.norm.weight": read("linear_attn.o_norm.weight", (spec.value_dims,)),
                **linear(read, "linear_attn.o_proj", "attn.out_proj", d, values, False)}

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm is not Norm.RMSNORM:
            raise UsageError("olmo_hybrid weights need --norm rmsnorm and --ffn swiglu")


def _convolution(read, keys: int, values: int, kernel: int) -> torch.Tensor:
    """The depthwise filters of [q, k, v], in that order. OLMo-core's files keep three (q_conv1d, k_conv1d,
    v_conv1d), which HF concatenates on load; HF's own save_pretrained splits the concatenation back into three
    near-equal chunks (torch.chunk's sizes, not q's, k's and v's), which concatenate to the same filters. Either split
    is read, or HF's one conv1d."""
    total = 2 * keys + values
    try:
        return read("linear_attn.conv1d.weight", (total, 1, kernel))
    except WeightsError:
        pass
    chunk = -(-total // 3)
    splits = [(keys, keys, values), (chunk, chunk, total - 2 * chunk)]
    for widths in splits:
        try:
            return torch.cat([read(f"linear_attn.{part}_conv1d.weight", (width, 1, kernel))
                              for part, width in zip("qkv", widths)])
        except WeightsError:
            if widths == splits[-1]:
                raise
