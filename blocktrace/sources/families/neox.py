"""GPT-NeoX / Pythia (`layers.{k}.…`; `gpt_neox.` prefix as GPTNeoXForCausalLM saves it).

LayerNorm with bias; q, k and v fused in `attention.query_key_value` and interleaved per head
([head, q|k|v, head_dim] on the output side); rotary embeddings on the first `rotary_pct` of
each head's dims only; GELU MLP; and by default a parallel residual, x + attn(ln1(x)) +
mlp(ln2(x)), in which both branches read the same stream.
"""

from __future__ import annotations

from blocktrace.errors import UsageError
from blocktrace.sources.families.base import (Family, HeadSpec, HFLayer, LossKind, activation, head_weight, linear,
                                              rope_fields, size)
from blocktrace.vocab import Norm, Placement


class GPTNeoX(Family):
    name, described = "gpt_neox", "gpt_neox (layers.{k}.attention.query_key_value.*)"
    hf_classes = ("GPTNeoXLayer",)
    # the sublayers' outputs as the residual adds take them: after the layer's own dropouts (hidden_dropout), which
    # sit outside the attention and MLP modules; the attention's weights are read off the attention module
    hf_layer = HFLayer({"norm1": "input_layernorm", "attn": "post_attention_dropout",
                        "norm2": "post_attention_layernorm", "ffn": "post_mlp_dropout"}, hidden="mlp.act",
                       weights="attention", parallel_flag="use_parallel_residual")
    layers_path, marker, prefixes = "layers", "attention.query_key_value.weight", ("", "gpt_neox.")
    embedding_key = "embed_in.weight"
    ignored = ("attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq")  # buffers of old files
    needs_config = True  # the rotary share, RoPE theta and residual wiring are not in the weights
    config_keys = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "d_ff": "intermediate_size",
                   "eps": "layer_norm_eps", "rotary_fraction": "rotary_pct"}

    def config_fields(self, config):
        return {"d_model": config.integer("hidden_size"), "n_heads": config.integer("num_attention_heads"),
                "d_ff": config.integer("intermediate_size"), "eps": config.number("layer_norm_eps", 1e-5, positive=True),
                "ffn": activation(config, "hidden_act", "gelu"), "norm": Norm.LAYERNORM, "bias": True,
                "attn_bias": config.boolean("attention_bias", True),
                "parallel_residual": config.boolean("use_parallel_residual", True),
                **rope_fields(config, theta_key="rotary_emb_base", fraction_key="rotary_pct", default_fraction=0.25)}

    def shape_fields(self, checkpoint, base):
        return {"d_model": size(checkpoint, base + "input_layernorm.weight", 0),
                "d_ff": size(checkpoint, base + "mlp.dense_h_to_4h.weight", 0)}

    def parameters(self, read, c):
        d, f, hd = c.d_model, c.d_ff, c.head_dim
        qkv = read("attention.query_key_value.weight", (3 * d, d)).view(c.n_heads, 3, hd, d)
        state = {"norm1.weight": read("input_layernorm.weight", (d,)), "norm1.bias": read("input_layernorm.bias", (d,)),
                 "norm2.weight": read("post_attention_layernorm.weight", (d,)),
                 "norm2.bias": read("post_attention_layernorm.bias", (d,)),
                 **linear(read, "attention.dense", "attn.out_proj", d, d, c.attention_bias),
                 **linear(read, "mlp.dense_h_to_4h", "ffn.fc", f, d, True),
                 **linear(read, "mlp.dense_4h_to_h", "ffn.proj", d, f, True)}
        bias = read("attention.query_key_value.bias", (3 * d,)).view(c.n_heads, 3, hd) if c.attention_bias else None
        for index, name in enumerate(("q_proj", "k_proj", "v_proj")):  # per head: [q | k | v]
            state[f"attn.{name}.weight"] = qkv[:, index].reshape(d, d)
            if bias is not None:
                state[f"attn.{name}.bias"] = bias[:, index].reshape(d)
        return state

    def head(self, checkpoint, info):
        """final_layer_norm, then embed_out (GPT-NeoX does not tie it by default)."""
        weight, tied = head_weight(checkpoint, info, "embed_out.weight", f"{info.prefix}{self.embedding_key}")
        return HeadSpec(LossKind.NEXT_TOKEN, weight, f"{info.prefix}final_layer_norm.weight",
                        f"{info.prefix}final_layer_norm.bias",
                        eps=info.config.number("layer_norm_eps", 1e-5, positive=True), tied=tied)

    def check(self, config):
        if not config.ffn.plain or config.norm is not Norm.LAYERNORM or config.placement is not Placement.PRE:
            raise UsageError("GPT-NeoX weights need --norm layernorm, a non-gated --ffn and Pre-LN wiring")
