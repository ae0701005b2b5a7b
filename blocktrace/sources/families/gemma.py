"""Gemma and Gemma-2 (Llama's keys): RMSNorm scaled by (1 + w), computed in float32; GeGLU
(gate through GPT-2's tanh GELU); embeddings multiplied by √d_model.

Gemma-2 adds "sandwich" norms — four per layer: before and after attention, before and after
the FFN — attention logits soft-capped to cap·tanh(s/cap), a query scale of
query_pre_attn_scalar^-½, and a sliding window on the layers layer_types marks (every other
layer by default).
"""

from __future__ import annotations

import torch

from blocktrace.errors import UsageError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import HFLayer, rope_fields
from blocktrace.sources.families.llama import SLIDING, Llama, every_other_layer, refuse_bidirectional
from blocktrace.vocab import FFNKind, Norm, Placement
from blocktrace.wiring import SANDWICH

# HF reads Gemma's legacy hidden_act "gelu" as the tanh approximation it was meant to be.
GATE_ACTIVATIONS = {"gelu_pytorch_tanh": FFNKind.GEGLU, "gelu_new": FFNKind.GEGLU, "gelu": FFNKind.GEGLU}


class Gemma(Llama):
    # Llama keys, (1+w) RMSNorm, GeGLU
    name, hf_classes = "gemma", ("GemmaDecoderLayer",)
    activations = GATE_ACTIVATIONS
    defaults = {**Llama.defaults, "hidden_act": "gelu_pytorch_tanh"}
    tie_default = True

    def norm_offset(self):
        return 1.0

    def config_fields(self, config):
        refuse_bidirectional(config)
        return {**super().config_fields(config), "norm_offset": 1.0}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}

    def embed(self, checkpoint, info, ids, dtype, token_types=None):
        """Gemma scales the embedding by √d_model, in the embedding's own dtype."""
        x = super().embed(checkpoint, info, ids, dtype)
        return x * torch.tensor(x.shape[-1] ** 0.5).to(x.dtype)

    def check(self, config):
        if not config.ffn.gated or config.norm is not Norm.RMSNORM:
            raise UsageError(f"{self.name} weights need --norm rmsnorm and a gated FFN")


# Gemma-2 takes hidden_activation as it is: "gelu" is the exact GELU there (only Gemma-1's config rewrites it).
GEMMA2_GATE_ACTIVATIONS = {**GATE_ACTIVATIONS, "gelu": FFNKind.GEGLU_EXACT}


class Gemma2(Gemma):
    # Llama keys, four norms per layer
    name, hf_classes = "gemma2", ("Gemma2DecoderLayer",)
    hf_layer = HFLayer({"norm1": "input_layernorm", "attn": "self_attn", "post_attn_norm": "post_attention_layernorm",
                        "norm2": "pre_feedforward_layernorm", "ffn": "mlp",
                        "post_ffn_norm": "post_feedforward_layernorm"}, SANDWICH, Norm.RMSNORM, hidden="mlp.act_fn")
    activation_key = "hidden_activation"
    activations = GEMMA2_GATE_ACTIVATIONS
    defaults = {"rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256,
                "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096}

    def config_fields(self, config):
        scalar = config.number("query_pre_attn_scalar", self.defaults["query_pre_attn_scalar"], positive=True)
        return {**super().config_fields(config), "placement": Placement.SANDWICH, "attn_scale": scalar ** -0.5,
                "attn_softcap": self.setting(config, "attn_logit_softcapping", positive=True)}

    def logit_softcap(self, config):
        return self.setting(config, "final_logit_softcapping", positive=True)

    sliding_by_default = staticmethod(every_other_layer)

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        sliding = self.sliding(config, layer)
        return {"sliding_window": self.setting(config, "sliding_window", "integer") if sliding else None}

    def parameters(self, read, c):
        d = c.d_model
        return {"norm1.weight": read("input_layernorm.weight", (d,)), **self.attention(read, c),
                "post_attn_norm.weight": read("post_attention_layernorm.weight", (d,)),
                "norm2.weight": read("pre_feedforward_layernorm.weight", (d,)), **self.mlp(read, c),
                "post_ffn_norm.weight": read("post_feedforward_layernorm.weight", (d,))}

    def check(self, config):
        super().check(config)
        if not config.sandwich:
            raise UsageError("gemma2 weights hold four norms per layer: they need the sandwich wiring")


FULL = "full_attention"


class Gemma3(Gemma2):
    """Gemma-3's text model: Gemma-2's four norms, plus (1 + w) RMSNorm on each head's q and k
    before RoPE, and RoPE of its own per layer type: the sliding layers turn at
    rope_local_base_freq (10k) unscaled, the global ones at rope_theta (1M) with the file's
    scaling. Five sliding layers to one global by default (sliding_window_pattern 6)."""

    # text; Gemma-2's keys, QK-norm, RoPE per layer type
    name, hf_classes = "gemma3", ("Gemma3DecoderLayer",)
    model_types = ("gemma3_text",)
    defaults = {**Gemma2.defaults, "attn_logit_softcapping": None, "final_logit_softcapping": None,
                "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0, "sliding_window_pattern": 6}

    def config_fields(self, config):
        return {**super().config_fields(config), "qk_norm": True, "attn_softcap": None, **self.rope(config, FULL)}

    def sliding_by_default(self, config, layer):
        return bool((layer + 1) % self.setting(config, "sliding_window_pattern", "integer"))

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        return {**super().layer_fields(config, layer), **self.rope(config, SLIDING if self.sliding(config, layer)
                                                                   else FULL)}

    def rope(self, config: ConfigFile, layer_type: str) -> dict:
        """rope_parameters by layer type (transformers 5), or the older keys: rope_theta with rope_scaling for
        the global layers, rope_local_base_freq for the sliding ones."""
        nested = config.mapping("rope_parameters")
        if layer_type in nested:
            parameters = nested.mapping(layer_type)
        else:
            parameters = config.mapping("rope_scaling") if layer_type == FULL else ConfigFile(config.path, {})
        theta_key = "rope_theta" if layer_type == FULL else "rope_local_base_freq"
        return rope_fields(config, parameters=parameters, theta_key=theta_key, default_theta=self.defaults[theta_key])

    def top_level_defaults(self, config):
        if config.raw("rope_parameters") is None:
            return self.defaults
        return [key for key in self.defaults if key not in ("rope_theta", "rope_local_base_freq")]  # nested there

    def notes(self, config):
        notes = super().notes(config)
        if config is not None and config.raw("attn_logit_softcapping") is not None:
            notes.append(f"attn_logit_softcapping {config.raw('attn_logit_softcapping')} is not applied: HF's "
                         "Gemma-3 attention never passes it on, and blocktrace computes what HF does")
        return notes
