"""Granite-4 (IBM, 2025; HF's GraniteMoeHybrid): a hybrid of Mamba-2 layers and attention layers, with Granite's four
multipliers (embedding, attention, residual, logits: granite.py). Every layer is Pre-RMSNorm (input_layernorm,
post_attention_layernorm); its token mixer is either
- Mamba-2 (config.Mamba2: `mamba.in_proj`, `conv1d`, `dt_bias`, `A_log`, `D`, `norm`, `out_proj`), or
- attention, q·k scaled by `attention_multiplier`, rotated by RoPE only where `position_embedding_type` is "rope"
  (HF's default: none, so no position is encoded at all).
`layer_types` (or the older `layers_block_type`) says which: "linear_attention" or "mamba" for Mamba-2, "full_attention"
or "attention" for attention, Mamba-2 everywhere without it, as GraniteMoeHybridConfig reads them. The FFN is
`shared_mlp` (a SwiGLU of `shared_intermediate_size`, gate and up stacked in `input_linear`), plus, where
`num_local_experts` > 0, experts of `intermediate_size` (`block_sparse_moe.input_linear` [E, 2f, d],
`output_linear` [E, d, f]) routed by `block_sparse_moe.router.layer`: the softmax of the top-k logits, which is
softmax then top-k renormalised."""

from __future__ import annotations

import math
from typing import Optional

from blocktrace.config import Mamba2
from blocktrace.errors import WeightsError
from blocktrace.phrases import phrase
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import HFLayer, refuse_quantised, rmsnorm_shape, rope_fields
from blocktrace.sources.families.granite import Granite
from blocktrace.vocab import Norm

MAMBA_KINDS, ATTENTION_KINDS = ("linear_attention", "mamba"), ("full_attention", "attention")
GRANITE_HYBRID_STEPS = {"norm1": "input_layernorm", "attn": "self_attn|mamba", "norm2": "post_attention_layernorm",
                        "ffn": "shared_mlp"}


class GraniteMoeHybrid(Granite):
    # Mamba-2 and attention layers, Granite's multipliers, experts
    name, hf_classes = "granitemoehybrid", ("GraniteMoeHybridDecoderLayer",)
    # With experts HF sums them and shared_mlp in the layer's own forward: no one module is the ffn step to hook
    hf_layer = HFLayer(GRANITE_HYBRID_STEPS, norm=Norm.RMSNORM, residual_multiplier="residual_multiplier",
                       untraceable=("block_sparse_moe", "its FFN is block_sparse_moe + shared_mlp, summed in the "
                                    "layer's forward, so no module's output is the ffn step"))
    # GraniteMoeHybridConfig's defaults
    defaults = {**Granite.defaults, "num_local_experts": 8, "num_experts_per_tok": 2, "shared_intermediate_size": 1024,
                "position_embedding_type": None, "mamba_n_heads": 128, "mamba_n_groups": 1, "mamba_d_state": 256,
                "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
                "mamba_conv_bias": True, "mamba_proj_bias": False, "attention_bias": False}

    def config_fields(self, config):
        refuse_quantised(config)
        heads = config.integer("num_attention_heads")
        rope = self.setting(config, "position_embedding_type", "string") if \
            config.raw("position_embedding_type") is not None else None
        if rope not in (None, "rope", "nope"):
            raise WeightsError(f"{config.path}: position_embedding_type {rope!r} is not supported for {self.name} "
                               "(rope, or none)")
        experts = self.setting(config, "num_local_experts", "integer", positive=False)
        shared = self.setting(config, "shared_intermediate_size", "integer")
        ffn = {"n_experts": experts, "d_ff": config.integer("intermediate_size"), "shared_expert_d_ff": shared,
               "shared_expert_gated": False, "renormalise_top_k": True,
               "experts_per_token": self.setting(config, "num_experts_per_tok", "integer")} if experts else \
            {"experts": None, "d_ff": shared}
        positions = rope_fields(config) if rope == "rope" else {"rope_theta": None}
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "norm": Norm.RMSNORM,
                "eps": self.setting(config, "rms_norm_eps", positive=True), "ffn": self.activation(config),
                "kv_heads": config.integer("num_key_value_heads") or heads, "head_size": config.integer("head_dim"),
                "bias": False, "attn_bias": self.setting(config, "attention_bias", "boolean"),
                "attn_scale": self.setting(config, "attention_multiplier", positive=True),
                "residual_multiplier": self.setting(config, "residual_multiplier", positive=True), **positions, **ffn}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base)

    def layer_kinds(self, config: ConfigFile) -> list[str]:
        """Each layer's mixer, as GraniteMoeHybridConfig reads layer_types (or layers_block_type): Mamba-2 where
        absent."""
        layers = config.integer("num_hidden_layers")
        key = "layer_types" if "layer_types" in config else "layers_block_type"
        given = config.raw(key)
        if given is None:
            return [MAMBA_KINDS[0]] * layers
        known = MAMBA_KINDS + ATTENTION_KINDS
        if not isinstance(given, list) or len(given) != layers or any(kind not in known for kind in given):
            raise config.bad(key, f"a list of {layers} layer kinds among {', '.join(known)}", given)
        return [MAMBA_KINDS[0] if kind in MAMBA_KINDS else ATTENTION_KINDS[0] for kind in given]

    def mamba(self, config: ConfigFile) -> Mamba2:
        heads = self.setting(config, "mamba_n_heads", "integer")
        inner = self.setting(config, "mamba_expand", "integer") * config.integer("hidden_size")
        given = config.raw("mamba_d_head")  # "auto" (HF's default): the inner width shared among the heads
        head_dims = inner // heads if given in (None, "auto") else config.integer("mamba_d_head")
        if heads * head_dims != inner:
            raise WeightsError(f"{config.path}: mamba_n_heads {heads} × mamba_d_head {head_dims} must be "
                               f"mamba_expand × hidden_size = {inner}, as GraniteMoeHybridConfig requires")
        return Mamba2(heads, head_dims, self.setting(config, "mamba_d_state", "integer"),
                      self.setting(config, "mamba_n_groups", "integer"), self.setting(config, "mamba_d_conv", "integer"),
                      self.setting(config, "mamba_conv_bias", "boolean"),
                      self.setting(config, "mamba_proj_bias", "boolean"),
                      self.setting(config, "mamba_chunk_size", "integer"), self.step_limit(config))

    @staticmethod
    def step_limit(config: ConfigFile) -> tuple[float, float]:
        """time_step_limit as saved: two numbers, an infinite one written as Infinity or as transformers 5 encodes
        it ({"__float__": "Infinity"})."""
        given = config.raw("time_step_limit")
        if given is None:
            return 0.0, math.inf
        values = [float(v["__float__"]) if isinstance(v, dict) and "__float__" in v else v for v in given] \
            if isinstance(given, list) else None
        if values is None or len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                         for v in values):
            raise config.bad("time_step_limit", "two numbers (the step size's lowest and highest)", given)
        return float(values[0]), float(values[1])

    def layer_fields(self, config, layer):
        if config is None or self.layer_kinds(config)[layer] not in MAMBA_KINDS:
            return {}
        # the attention layers' settings mean nothing to Mamba-2: not said of it
        return {"token_mixer": self.mamba(config), "rope_theta": None, "rope_scaling": None, "attn_scale": None}

    def mixer(self, read, c) -> dict:
        if c.token_mixer is None:
            return self.attention(read, c)
        spec, d = c.token_mixer, c.d_model
        conv = spec.inner + 2 * spec.groups * spec.state_dims
        state = {"attn.in_proj.weight": read("mamba.in_proj.weight", (spec.inner + conv + spec.heads, d)),
                 "attn.conv.weight": read("mamba.conv1d.weight", (conv, 1, spec.kernel)),
                 "attn.dt_bias": read("mamba.dt_bias", (spec.heads,)), "attn.A_log": read("mamba.A_log", (spec.heads,)),
                 "attn.D": read("mamba.D", (spec.heads,)), "attn.norm.weight": read("mamba.norm.weight", (spec.inner,)),
                 "attn.out_proj.weight": read("mamba.out_proj.weight", (d, spec.inner))}
        if spec.conv_bias:
            state["attn.conv.bias"] = read("mamba.conv1d.bias", (conv,))
        if spec.bias:
            state.update({"attn.in_proj.bias": read("mamba.in_proj.bias", (spec.inner + conv + spec.heads,)),
                          "attn.out_proj.bias": read("mamba.out_proj.bias", (d,))})
        return state

    @staticmethod
    def ffn(read, c) -> dict:
        """shared_mlp (gate and up stacked in input_linear), and the experts where the layer has them."""
        d = c.d_model
        shared = c.experts.shared_expert_d_ff if c.experts is not None else c.d_ff
        gate_up = read("shared_mlp.input_linear.weight", (2 * shared, d))
        target = "ffn.shared_expert" if c.experts is not None else "ffn"
        state = {f"{target}.gate.weight": gate_up[:shared], f"{target}.up.weight": gate_up[shared:],
                 f"{target}.down.weight": read("shared_mlp.output_linear.weight", (d, shared))}
        if c.experts is None:
            return state
        e, f = c.experts.n_experts, c.d_ff
        experts_in = read("block_sparse_moe.input_linear.weight", (e, 2 * f, d))
        experts_out = read("block_sparse_moe.output_linear.weight", (e, d, f))
        state["ffn.router.weight"] = read("block_sparse_moe.router.layer.weight", (e, d))
        for k in range(e):
            state.update({f"ffn.experts.{k}.gate.weight": experts_in[k, :f], f"ffn.experts.{k}.up.weight":
                          experts_in[k, f:], f"ffn.experts.{k}.down.weight": experts_out[k]})
        return state

    def notes(self, config: Optional[ConfigFile]):
        notes = super().notes(config)
        if config is not None:
            mamba = [str(k) for k, kind in enumerate(self.layer_kinds(config)) if kind in MAMBA_KINDS]
            notes.append(phrase("Mamba-2 layers: {layers}", layers=", ".join(mamba) or "none"))
        return notes
