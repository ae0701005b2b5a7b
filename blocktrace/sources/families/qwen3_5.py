"""Qwen3.5's language model saved alone (Qwen, 2026; HF's Qwen3_5ForCausalLM, model_type qwen3_5_text): Qwen3-Next's
hybrid without experts — gated delta-rule layers and gated attention layers, (1 + w) norms, one SwiGLU of
`intermediate_size` in every layer. Its delta net stores its projections apart (`linear_attn.in_proj_qkv` with q, k
and v each in head order, `in_proj_z`, `in_proj_b`, `in_proj_a`), where Qwen3-Next's groups them by key head: they
are read into that grouping, a permutation of rows (every number the same). Its RoPE is multimodal (mRoPE
sections over time, height and width): a text's positions are one and the same on every axis, which is 1D RoPE, as
computed here (a note says so). The multimodal checkpoints (`qwen3_5`, the language model under a vision model) are
another model type: save the language model alone."""

from __future__ import annotations

from blocktrace.phrases import phrase
from blocktrace.sources.families.base import HFLayer, rope_fields
from blocktrace.sources.families.qwen3_next import QWEN3_NEXT_STEPS, Qwen3Next, grouped_by_key_head
from blocktrace.vocab import Norm


class Qwen3_5Text(Qwen3Next):
    # Qwen3-Next's hybrid, dense
    name, hf_classes = "qwen3_5_text", ("Qwen3_5DecoderLayer",)
    hf_layer = HFLayer(QWEN3_NEXT_STEPS, norm=Norm.RMSNORM, hidden="mlp.act_fn")
    # Qwen3_5TextConfig's defaults
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "head_dim": 256, "attention_bias": False,
                "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
                "linear_num_key_heads": 16, "linear_num_value_heads": 32}

    def config_fields(self, config):
        heads = config.integer("num_attention_heads")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "norm": Norm.RMSNORM,
                "eps": self.setting(config, "rms_norm_eps", positive=True), "ffn": self.activation(config),
                "kv_heads": config.integer("num_key_value_heads") or heads,
                "head_size": self.setting(config, "head_dim", "integer"), "bias": False,
                "attn_bias": self.setting(config, "attention_bias", "boolean"), "qk_norm": True, "norm_offset": 1.0,
                "attn_output_gate": True, **rope_fields(config, default_fraction=0.25), **self.all_dense(config)}

    def sparse(self, config, layer: int) -> bool:
        return False  # Qwen3_5TextConfig has no experts

    @staticmethod
    def delta_projections(read, c) -> dict:
        """The projections read apart, then grouped by key head as Qwen3-Next stores them: per key head its q, its
        k, its value heads' v and z (in_proj_qkvz), its value heads' b and a (in_proj_ba)."""
        spec, d = c.token_mixer, c.d_model
        keys, values = spec.key_heads * spec.key_dims, spec.value_heads * spec.value_dims
        qkv = read("linear_attn.in_proj_qkv.weight", (2 * keys + values, d))
        z = read("linear_attn.in_proj_z.weight", (values, d))
        b = read("linear_attn.in_proj_b.weight", (spec.value_heads, d))
        a = read("linear_attn.in_proj_a.weight", (spec.value_heads, d))
        return {"attn.in_proj_qkvz.weight": grouped_by_key_head(spec, d, qkv[:keys], qkv[keys:2 * keys],
                                                                qkv[2 * keys:], z),
                "attn.in_proj_ba.weight": grouped_by_key_head(spec, d, b, a)}

    def notes(self, config):
        return super().notes(config) + mrope_note(config)


# Qwen3-Next's keys that Qwen3_5MoeTextConfig deletes: every layer has experts, their choice always renormalised
UNREAD_BY_MOE = ("mlp_only_layers", "decoder_sparse_step", "norm_topk_prob")


class Qwen3_5MoeText(Qwen3Next):
    """Qwen3.5-MoE's language model alone: Qwen3-Next's layers with Qwen3.5's delta net, experts in every layer (no
    mlp_only_layers or decoder_sparse_step: Qwen3_5MoeTextConfig removes them), the chosen experts' probabilities
    always renormalised (its router has no norm_topk_prob), Qwen3-Next's gated shared expert."""
    # Qwen3-Next's hybrid, experts
    name, hf_classes = "qwen3_5_moe_text", ("Qwen3_5MoeDecoderLayer",)
    defaults = {key: value for key, value in {**Qwen3Next.defaults, "num_experts": 256,
                                              "num_experts_per_tok": 8}.items() if key != "norm_topk_prob"}
    delta_projections = staticmethod(Qwen3_5Text.delta_projections)
    always_renormalise = True  # its router has no norm_topk_prob

    def config_fields(self, config):
        self.setting(config, "num_experts", "integer")  # a positive integer: every layer has experts
        return super().config_fields(config)

    def sparse(self, config, layer: int) -> bool:
        return True

    def notes(self, config):
        unread = [key for key in UNREAD_BY_MOE if config is not None and key in config]
        said = [phrase("{keys} in config.json not read: Qwen3.5-MoE has no such setting (HF ignores them too)",
                       keys=", ".join(unread))] if unread else []
        return super().notes(config) + mrope_note(config) + said


def mrope_note(config) -> list:
    """A text's positions are one on every axis of Qwen3.5's multimodal RoPE: it is 1D RoPE (said where the file
    has its sections)."""
    if config is None or "mrope_section" not in config.merged("rope_scaling", "rope_parameters").data:
        return []
    return [phrase("mRoPE's sections read for text: every axis at the token's position, which is 1D RoPE")]

