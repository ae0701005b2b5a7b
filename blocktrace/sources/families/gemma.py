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
    tie_default = True

    def norm_offset(self):
        return 1.0

    def config_fields(self, config):
        refuse_bidirectional(config)
        return {**super().config_fields(config), "norm_offset": 1.0}

    def activation(self, config):
        activation = config.string(self.activation_key, "gelu_pytorch_tanh")
        if activation not in GATE_ACTIVATIONS:
            raise WeightsError(f"{config.path}: {self.activation_key} {activation!r} is not supported for "
                               f"{self.name}; supported: {', '.join(GATE_ACTIVATIONS)}")
        return GATE_ACTIVATIONS[activation]

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


class Gemma2(Gemma):
    name, described, model_types = "gemma2", "gemma2 (Llama keys, four norms per layer)", ("gemma2",)
    activation_key = "hidden_activation"

    def config_fields(self, config):
        scalar = config.number("query_pre_attn_scalar", 256.0, positive=True)
        return {**super().config_fields(config), "placement": Placement.SANDWICH, "attn_scale": scalar ** -0.5,
                "attn_softcap": config.number("attn_logit_softcapping", 50.0, positive=True)}

    def logit_softcap(self, config):
        if "final_logit_softcapping" in config and config.raw("final_logit_softcapping") is None:
            return None
        return config.number("final_logit_softcapping", 30.0, positive=True)

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        types = config.raw("layer_types")
        sliding = types[layer] == SLIDING if isinstance(types, list) and layer < len(types) else layer % 2 == 0
        return {"sliding_window": config.integer("sliding_window", 4096) if sliding else None}

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
