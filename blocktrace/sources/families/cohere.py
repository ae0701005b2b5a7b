"""Cohere's Command-R (`cohere`) and Command-R7B / Command-A (`cohere2`), on Llama's key names: a parallel block
under one norm — x + attn(LN(x)) + mlp(LN(x)), with a single `input_layernorm`, a LayerNorm without a shift —
SwiGLU, RoPE that turns adjacent pairs (x0, x1), (x2, x3)… rather than the two halves, a tied head by default and
the logits multiplied by `logit_scale`. Cohere-2 adds sliding-window layers (`layer_types`, or one global layer in
every `sliding_window_pattern`, 4) and rotates q and k in those only: its global layers have no RoPE (NoPE)."""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import (NOPE_FIELDS, HeadSpec, HFLayer, LossKind, head_weight, refuse_unless,
                                              rope_fields)
from blocktrace.sources.families.llama import Llama
from blocktrace.vocab import FFNKind, Norm, Parallel
from blocktrace.wiring import PARALLEL_ONE_NORM

COHERE_STEPS = {"norm1": "input_layernorm", "attn": "self_attn", "ffn": "mlp"}


class Cohere(Llama):
    # Llama keys, parallel block under one LayerNorm
    name, hf_classes = "cohere", ("CohereDecoderLayer",)
    hf_layer = HFLayer(COHERE_STEPS, PARALLEL_ONE_NORM, Norm.LAYERNORM, hidden="mlp.act_fn")
    defaults = {"layer_norm_eps": 1e-5, "hidden_act": "silu", "logit_scale": 0.0625, "rope_theta": 500_000.0}
    config_keys = {**Llama.config_keys, "eps": "layer_norm_eps"}
    tie_default = True

    def config_fields(self, config):
        refuse_unless(config, "use_qk_norm", (None, False), "adds a LayerNorm per head on q and k")
        heads = config.integer("num_attention_heads")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "d_ff": config.integer("intermediate_size"),
                "eps": self.setting(config, "layer_norm_eps", positive=True), "ffn": self.activation(config),
                "norm": Norm.LAYERNORM, "bias": False, "attn_bias": config.boolean("attention_bias", False),
                "kv_heads": config.integer("num_key_value_heads") or heads, "head_size": self.head_size(config),
                "parallel_residual": Parallel.ONE_NORM, "rope_interleaved": True,
                **rope_fields(config, default_theta=self.defaults["rope_theta"])}

    def head_size(self, config):
        return config.integer("head_dim")

    def shape_fields(self, checkpoint, base):
        return {**super().shape_fields(checkpoint, base), "norm": Norm.LAYERNORM}

    def parameters(self, read, c):
        return {"norm1.weight": read("input_layernorm.weight", (c.d_model,)), **self.attention(read, c),
                **self.mlp(read, c)}

    def head(self, checkpoint, info):
        """The final LayerNorm (no shift), lm_head or the tied embedding, the logits × logit_scale."""
        weight, tied = head_weight(checkpoint, info, "lm_head.weight", f"{info.prefix}{self.embedding_key}")
        scale = self.required(info.config, "logit_scale", f"{self.name} multiplies its logits", positive=True)
        return HeadSpec(LossKind.NEXT_TOKEN, weight, f"{info.prefix}norm.weight",
                        eps=self.setting(info.config, "layer_norm_eps", positive=True), logit_scale=scale, tied=tied)

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm is not Norm.LAYERNORM or \
                config.parallel_residual is not Parallel.ONE_NORM:
            raise UsageError(f"{self.name} weights need --norm layernorm, --ffn swiglu and the parallel block under "
                             "one norm")

    def top_level_defaults(self, config):
        return [key for key in self.defaults if key != "rope_theta" or config.raw("rope_parameters") is None]


class Cohere2(Cohere):
    # Cohere's block, sliding layers, NoPE global layers
    name, hf_classes = "cohere2", ("Cohere2DecoderLayer",)
    defaults = {**Cohere.defaults, "rope_theta": 10_000.0, "sliding_window": 4096, "sliding_window_pattern": 4}

    def head_size(self, config):
        """Cohere2Config sets head_dim to hidden_size / num_attention_heads whatever the file says."""
        heads, width = config.integer("num_attention_heads"), config.integer("hidden_size")
        given = config.integer("head_dim")
        if given is not None and heads and width and given != width // heads:
            raise config.bad("head_dim", f"hidden_size / num_attention_heads = {width // heads} (Cohere2Config sets "
                             "it so, whatever the file says)", given)
        return None

    def sliding_by_default(self, config, layer: int) -> bool:
        return bool((layer + 1) % config.integer("sliding_window_pattern", self.defaults["sliding_window_pattern"]))

    def layer_fields(self, config, layer):
        """A sliding layer rotates q and k in its window; every other layer (and every layer, where the window is
        null) has no RoPE, as Cohere2Attention rotates only where it has a window."""
        if config is None:
            return {}
        window = self.setting(config, "sliding_window", "integer")
        if window is not None and self.sliding(config, layer):
            return {"sliding_window": window}
        return {"sliding_window": None, **NOPE_FIELDS}
