"""Llama (`layers.{k}.…`; `model.` prefix as LlamaForCausalLM saves it): Pre-RMSNorm, SwiGLU,
RoPE, grouped-query attention."""

from __future__ import annotations

from blocktrace.errors import UsageError, WeightsError
from blocktrace.sources.families.base import Family, linear, rope, size
from blocktrace.vocab import FFNKind, Norm


class Llama(Family):
    name, described, model_types = "llama", "llama (layers.{k}.*, optionally model.)", ("llama",)
    layers_path, marker, prefixes = "layers", "input_layernorm.weight", ("", "model.")
    embedding_key = "embed_tokens.weight"
    ignored = ("self_attn.rotary_emb.inv_freq",)  # a computed buffer some files hold
    config_keys = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "d_ff": "intermediate_size",
                   "eps": "rms_norm_eps", "kv_heads": "num_key_value_heads", "head_size": "head_dim",
                   "rope_theta": "rope_theta"}

    def config_fields(self, config):
        if config.string("hidden_act", "silu") != "silu":
            raise WeightsError(f"{config.path}: hidden_act {config.raw('hidden_act')!r} is not supported for Llama "
                               "(only silu: SwiGLU)")
        attention_bias, mlp_bias = config.boolean("attention_bias", False), config.boolean("mlp_bias", False)
        if attention_bias != mlp_bias:
            raise WeightsError(f"{config.path}: attention_bias and mlp_bias differ, which blocktrace does not support")
        theta, scaling = rope(config)
        heads = config.integer("num_attention_heads")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "d_ff": config.integer("intermediate_size"),
                "eps": config.number("rms_norm_eps", 1e-6, positive=True), "ffn": FFNKind.SWIGLU, "norm": Norm.RMSNORM,
                "bias": attention_bias, "kv_heads": config.integer("num_key_value_heads") or heads,
                "head_size": config.integer("head_dim"), "rope_theta": theta, "rope_scaling": scaling}

    def shape_fields(self, checkpoint, base):
        return {"d_model": size(checkpoint, base + "input_layernorm.weight", 0),
                "d_ff": size(checkpoint, base + "mlp.gate_proj.weight", 0), "eps": 1e-6, "ffn": FFNKind.SWIGLU,
                "norm": Norm.RMSNORM, "bias": False, "rope_theta": 10000.0}

    def complete(self, fields, checkpoint, base):
        """Without config.json, the key/value heads follow from k_proj's rows."""
        if fields.get("kv_heads") is None and fields.get("n_heads"):
            head_dim = fields.get("head_size") or fields["d_model"] // fields["n_heads"]
            fields["kv_heads"] = size(checkpoint, base + "self_attn.k_proj.weight", 0) // head_dim
        return fields

    def parameters(self, read, c):
        d, f, hd = c.d_model, c.d_ff, c.head_dim
        q, kv = c.n_heads * hd, c.n_kv_heads * hd
        return {"norm1.weight": read("input_layernorm.weight", (d,)),
                **linear(read, "self_attn.q_proj", "attn.q_proj", q, d, c.bias),
                **linear(read, "self_attn.k_proj", "attn.k_proj", kv, d, c.bias),
                **linear(read, "self_attn.v_proj", "attn.v_proj", kv, d, c.bias),
                **linear(read, "self_attn.o_proj", "attn.out_proj", d, q, c.bias),
                "norm2.weight": read("post_attention_layernorm.weight", (d,)),
                **linear(read, "mlp.gate_proj", "ffn.gate", f, d, c.bias),
                **linear(read, "mlp.up_proj", "ffn.up", f, d, c.bias),
                **linear(read, "mlp.down_proj", "ffn.down", d, f, c.bias)}

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm is not Norm.RMSNORM:
            raise UsageError("Llama weights need --norm rmsnorm and --ffn swiglu")
