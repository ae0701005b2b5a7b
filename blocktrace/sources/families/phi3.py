"""Phi-3 (Llama's layer names, fused projections): q, k and v stacked in `self_attn.qkv_proj`
([q; k; v] on the output side), the SwiGLU gate and up stacked in `mlp.gate_up_proj`
([gate; up]); RMSNorm; optional partial rotary (Phi-4-mini's top-level partial_rotary_factor, as
transformers 5's save_pretrained writes it too, or inside rope_parameters) and sliding window in every
layer."""

from __future__ import annotations

from blocktrace.sources.families.base import HFLayer, linear, rmsnorm_shape
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.vocab import Norm


class Phi3(Llama):
    # Llama layer names, fused qkv_proj and gate_up_proj
    name, hf_classes = "phi3", ("Phi3DecoderLayer",)
    # the sublayers' outputs as the residual adds take them: after the layer's resid_pdrop dropouts, outside the
    # attention and MLP modules; the attention's weights are read off self_attn
    hf_layer = HFLayer({**LLAMA_STEPS, "attn": "resid_attn_dropout", "ffn": "resid_mlp_dropout"}, norm=Norm.RMSNORM,
                       hidden="mlp.activation_fn", weights="self_attn")
    defaults = {**Llama.defaults, "rms_norm_eps": 1e-5}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False}

    def layer_fields(self, config, layer):
        return {"sliding_window": config.integer("sliding_window") if config is not None else None}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, ffn_in="mlp.gate_up_proj.weight", fused=2)

    def parameters(self, read, c):
        d, hd = c.d_model, c.head_dim
        q, kv = c.n_heads * hd, c.n_kv_heads * hd
        qkv = read("self_attn.qkv_proj.weight", (q + 2 * kv, d))
        return {"norm1.weight": read("input_layernorm.weight", (d,)),
                "attn.q_proj.weight": qkv[:q], "attn.k_proj.weight": qkv[q : q + kv], "attn.v_proj.weight": qkv[q + kv:],
                **linear(read, "self_attn.o_proj", "attn.out_proj", d, q, False),
                "norm2.weight": read("post_attention_layernorm.weight", (d,)), **self.mlp(read, c)}

    @staticmethod
    def mlp(read, c) -> dict:
        """SwiGLU's gate and up stacked in one matrix, [gate; up] on the output side."""
        d, f = c.d_model, c.d_ff
        gate_up = read("mlp.gate_up_proj.weight", (2 * f, d))
        return {"ffn.gate.weight": gate_up[:f], "ffn.up.weight": gate_up[f:],
                **linear(read, "mlp.down_proj", "ffn.down", d, f, False)}
