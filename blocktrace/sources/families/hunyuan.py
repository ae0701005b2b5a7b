"""Hunyuan dense (Tencent, 2025; HF's HunYuanDenseV1): Llama's keys and block with a per-head QK-norm after RoPE, not
before it (`self_attn.query_layernorm`, `self_attn.key_layernorm`, gains as Llama's RMSNorm), biases on the four
attention projections with `attention_bias`. Its files label their RoPE "dynamic" with a fixed `alpha`: HF reads that
as NTK-aware scaling of the base alone, theta · alpha^(d/(d − 2)) with d the head's dims, frequencies that do not
depend on the input's length; so does this file (a note gives the base), and a "dynamic" without alpha is HF's
dynamic scaling."""

from __future__ import annotations

from blocktrace.phrases import phrase
from blocktrace.sources.families.base import HFLayer, refuse_quantised, rope_fields
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.vocab import Norm


class HunyuanDense(Llama):
    name, described, model_types = "hunyuan_v1_dense", "hunyuan_v1_dense (Llama keys, QK-norm after RoPE)", \
        ("hunyuan_v1_dense",)
    hf_classes = ("HunYuanDenseV1DecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, hidden="mlp.act_fn")
    defaults = {**Llama.defaults, "rms_norm_eps": 1e-5}  # HunYuanDenseV1Config's

    def config_fields(self, config):
        refuse_quantised(config)
        fields = {**super().config_fields(config), "qk_norm": True, "qk_norm_after_rope": True}
        alpha = self.ntk_alpha(config)
        if alpha is not None:
            fields.update(rope_theta=self.alpha_theta(config, fields, alpha), rope_scaling=None)
        return fields

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}

    @staticmethod
    def ntk_alpha(config):
        parameters = config.merged("rope_scaling", "rope_parameters")
        kind = parameters.string("rope_type") or parameters.string("type")
        return parameters.number("alpha", None, positive=True) if kind == "dynamic" else None

    @staticmethod
    def alpha_theta(config, fields: dict, alpha: float) -> float:
        """HF's compute_ntk_alpha_rope_parameters: the base stretched by alpha^(d/(d − 2)), in Python floats."""
        dims = fields["head_size"] or fields["d_model"] // fields["n_heads"]
        theta = rope_fields(config)["rope_theta"]
        return theta * alpha ** (dims / (dims - 2))

    def attention(self, read, c) -> dict:
        hd = c.head_dim
        return {**Llama.projections(read, c), "attn.q_norm.weight": read("self_attn.query_layernorm.weight", (hd,)),
                "attn.k_norm.weight": read("self_attn.key_layernorm.weight", (hd,))}

    def notes(self, config):
        notes = super().notes(config)
        if config is not None and self.ntk_alpha(config) is not None:
            fields = super().config_fields(config)
            notes.append(phrase("RoPE 'dynamic' with alpha {alpha:g} read as HF reads it: a fixed base of {theta:.6g}",
                                alpha=self.ntk_alpha(config), theta=self.alpha_theta(config, fields,
                                                                                     self.ntk_alpha(config))))
        return notes
