"""Gemma and Gemma-2 (Llama's keys): RMSNorm scaled by (1 + w), computed in float32; GeGLU
(gate through GPT-2's tanh GELU); embeddings multiplied by √d_model.

Gemma-2 adds "sandwich" norms — four per layer: before and after attention, before and after
the FFN — attention logits soft-capped to cap·tanh(s/cap), a query scale of
query_pre_attn_scalar^-½, and a sliding window on the layers layer_types marks (every other
layer by default).
"""

from __future__ import annotations

from blocktrace.errors import UsageError, WeightsError
from blocktrace.sources.families.llama import SLIDING, Llama, refuse_bidirectional
from blocktrace.vocab import FFNKind, Norm, Placement

# HF reads Gemma's legacy hidden_act "gelu" as the tanh approximation it was meant to be.
GATE_ACTIVATIONS = {"gelu_pytorch_tanh": FFNKind.GEGLU, "gelu_new": FFNKind.GEGLU, "gelu": FFNKind.GEGLU}


class Gemma(Llama):
    name, described, model_types = "gemma", "gemma (Llama keys, (1+w) RMSNorm, GeGLU)", ("gemma",)
    activation_key = "hidden_act"
    activations = GATE_ACTIVATIONS
    defaults = {**Llama.defaults, "hidden_act": "gelu_pytorch_tanh"}
    tie_default = True

    def norm_offset(self):
        return 1.0

    def config_fields(self, config):
        refuse_bidirectional(config)
        return {**super().config_fields(config), "norm_offset": 1.0}

    def activation(self, config):
        activation = self.setting(config, self.activation_key, "string")
        if activation not in self.activations:
            raise WeightsError(f"{config.path}: {self.activation_key} {activation!r} is not supported for "
                               f"{self.name}; supported: {', '.join(self.activations)}")
        return self.activations[activation]

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}

    def embed(self, checkpoint, info, ids, dtype, token_types=None):
        """Gemma scales the embedding by √d_model, in the embedding's own dtype."""
        import torch

        x = super().embed(checkpoint, info, ids, dtype)
        return x * torch.tensor(x.shape[-1] ** 0.5).to(x.dtype)

    def check(self, config):
        if not config.ffn.gated or config.norm is not Norm.RMSNORM:
            raise UsageError(f"{self.name} weights need --norm rmsnorm and a gated FFN")


# Gemma-2 takes hidden_activation as it is: "gelu" is the exact GELU there (only Gemma-1's config rewrites it).
GEMMA2_GATE_ACTIVATIONS = {**GATE_ACTIVATIONS, "gelu": FFNKind.GEGLU_EXACT}


class Gemma2(Gemma):
    name, described, model_types = "gemma2", "gemma2 (Llama keys, four norms per layer)", ("gemma2",)
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

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        types = config.raw("layer_types")
        sliding = types[layer] == SLIDING if isinstance(types, list) and layer < len(types) else layer % 2 == 0
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
