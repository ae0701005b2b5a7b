"""Hunyuan dense (Tencent, 2025; HF's HunYuanDenseV1): Llama's keys and block with a per-head QK-norm after RoPE, not
before it (`self_attn.query_layernorm`, `self_attn.key_layernorm`, gains as Llama's RMSNorm), biases on the four
attention projections with `attention_bias`. Its files label their RoPE "dynamic" with a fixed `alpha`: HF reads that
as NTK-aware scaling of the base alone, theta · alpha^(d/(d − 2)) with d the head's dims, frequencies that do not
depend on the input's length; so does this file (a note gives the base), and a "dynamic" without alpha is HF's
dynamic scaling."""

from __future__ import annotations

from blocktrace.config import QKNorm
from blocktrace.phrases import phrase
from blocktrace.sources.families.base import gated_mlp, refuse_quantised, rope_fields
from blocktrace.sources.families.llama import Llama
from blocktrace.sources.families.moe import MixtureFamily


class HunyuanDense(Llama):
    # Llama keys, QK-norm after RoPE
    name, hf_classes = "hunyuan_v1_dense", ("HunYuanDenseV1DecoderLayer",)
    defaults = {**Llama.defaults, "rms_norm_eps": 1e-5}  # HunYuanDenseV1Config's

    def config_fields(self, config):
        refuse_quantised(config)
        fields = {**super().config_fields(config), "qk_norm": QKNorm(after_rope=True)}
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
        alpha = self.ntk_alpha(config) if config is not None else None
        if alpha is not None:
            theta = self.alpha_theta(config, Llama.config_fields(self, config), alpha)
            notes.append(phrase("RoPE 'dynamic' with alpha {alpha:g} read as HF reads it: a fixed base of {theta:.6g}",
                                alpha=alpha, theta=theta))
        return notes


# Keys of Tencent's own Hunyuan-MoE files that HF's HunYuanMoEV1 does not read (it sizes the experts and the shared
# MLP by intermediate_size and always adds one shared MLP): said unread where a file has them
UNREAD_BY_HF_MOE = ("moe_intermediate_size", "num_shared_expert", "use_mixed_mlp_moe")


class HunyuanMoe(MixtureFamily, HunyuanDense):
    """Hunyuan-MoE (HF's HunYuanMoEV1): Hunyuan dense's attention (QK-norm after RoPE) with experts in every layer —
    the router `mlp.gate.wg` (softmax in float32, the top `moe_topk` renormalised), `num_experts` SwiGLU experts and
    one ungated shared MLP (`mlp.shared_mlp`), all of `intermediate_size`, the shared MLP added to the experts' sum."""
    # Hunyuan's attention, experts, a shared MLP
    name, hf_classes = "hunyuan_v1_moe", ("HunYuanMoEV1DecoderLayer",)
    defaults = {**HunyuanDense.defaults, "num_experts": 1, "moe_topk": 1, "intermediate_size": 11008}  # HF's config
    router_name, expert_width_key, always_renormalise = "gate.wg", "intermediate_size", True

    def config_fields(self, config):
        width = self.setting(config, "intermediate_size", "integer")
        return {**super().config_fields(config), "n_experts": self.setting(config, "num_experts", "integer"),
                "experts_per_token": self.top_k(config), "d_ff": width, "renormalise_top_k": True,
                "shared_expert_d_ff": width, "shared_expert_gated": False}

    def top_k(self, config) -> int:
        """moe_topk: one number for every layer (a list per layer is refused: blocktrace reads one here)."""
        return self.setting(config, "moe_topk", "integer")

    def parameters(self, read, c):
        d, f = c.d_model, c.experts.shared_expert_d_ff
        return {**super().parameters(read, c),
                **gated_mlp(read, "mlp.shared_mlp", "ffn.shared_expert", f, d)}

    def notes(self, config):
        unread = [key for key in UNREAD_BY_HF_MOE if config is not None and key in config]
        said = [phrase("{keys} in config.json not read: HF's HunYuanMoEV1 sizes every expert and its one shared MLP "
                       "by intermediate_size", keys=", ".join(unread))] if unread else []
        return super().notes(config) + said
