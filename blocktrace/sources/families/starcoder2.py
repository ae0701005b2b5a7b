"""StarCoder2 (Llama's key names, GPT-2's kind of block): Pre-LayerNorm with shifts, a two-matrix MLP
(c_fc, tanh-GELU, c_proj), biases on every linear layer, RoPE, grouped-query attention, and one
sliding window over every layer when config.json sets it. HF's Starcoder2DecoderLayer is traced
as it is through `hf_layer`. A family is this one file: the package finds it (families/__init__)."""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import HeadSpec, HFLayer, LossKind, activation, head_weight, linear, \
    refuse_unless, rope_fields, size
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.vocab import Norm, Placement


class Starcoder2(Llama):
    # Llama keys, LayerNorm, c_fc/c_proj MLP, biases
    name = "starcoder2"
    hf_classes, hf_layer = ("Starcoder2DecoderLayer",), HFLayer(LLAMA_STEPS, hidden="mlp.act")
    defaults = {"norm_epsilon": 1e-5, "hidden_act": "gelu_pytorch_tanh", "num_key_value_heads": 2,
                "sliding_window": None}
    tie_default = True
    config_keys = {**Llama.config_keys, "eps": "norm_epsilon"}

    def config_fields(self, config):
        # HF's LayerNorms keep their shift whatever use_bias says; blocktrace's bias switch removes both.
        refuse_unless(config, "use_bias", (None, True), "drops the linear biases but keeps LayerNorm's shift")
        return {"d_model": config.integer("hidden_size"), "n_heads": config.integer("num_attention_heads"),
                "d_ff": config.integer("intermediate_size"), "head_size": config.integer("head_dim"),
                "eps": self.setting(config, "norm_epsilon", positive=True), "norm": Norm.LAYERNORM, "bias": True,
                "ffn": activation(config, "hidden_act", self.defaults["hidden_act"]),
                "kv_heads": self.setting(config, "num_key_value_heads", "integer"), **rope_fields(config)}

    def shape_fields(self, checkpoint, base):
        return {"d_model": size(checkpoint, base + "input_layernorm.weight", 0),
                "d_ff": size(checkpoint, base + "mlp.c_fc.weight", 0)}

    def parameters(self, read, c):
        d, f = c.d_model, c.d_ff
        norms = {f"{step}.{kind}": read(f"{source}.{kind}", (d,)) for step, source in
                 (("norm1", "input_layernorm"), ("norm2", "post_attention_layernorm")) for kind in ("weight", "bias")}
        return {**norms, **self.attention(read, c), **linear(read, "mlp.c_fc", "ffn.fc", f, d, True),
                **linear(read, "mlp.c_proj", "ffn.proj", d, f, True)}

    def layer_fields(self, config, layer):
        return {"sliding_window": self.setting(config, "sliding_window", "integer") if config is not None else None}

    def head(self, checkpoint, info):
        """The final LayerNorm (with its shift), then lm_head or the tied embedding."""
        weight, tied = head_weight(checkpoint, info, "lm_head.weight", f"{info.prefix}{self.embedding_key}")
        return HeadSpec(LossKind.NEXT_TOKEN, weight, f"{info.prefix}norm.weight", f"{info.prefix}norm.bias",
                        eps=self.setting(info.config, "norm_epsilon", positive=True), tied=tied)

    def check(self, config):
        if not config.ffn.plain or config.norm is not Norm.LAYERNORM or config.placement is not Placement.PRE:
            raise UsageError("starcoder2 weights need --norm layernorm, a non-gated --ffn and Pre-LN wiring")
