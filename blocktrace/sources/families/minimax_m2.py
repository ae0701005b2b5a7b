"""MiniMax-M2 (MiniMax, 2025; HF's MiniMaxM2): Mixtral's keys (`block_sparse_moe.gate`, `experts.{e}.w1/w3/w2`) with
a choice bias per expert (`block_sparse_moe.e_score_correction_bias`): each token's experts are its top
`num_experts_per_tok` sigmoid scores plus the bias, weighted by the unbiased scores renormalised — DeepSeek-V3's
router with one group of experts (`router=sigmoid_grouped`, 1 of 1 groups). Its attention is grouped-query with a
QK-norm over all heads at once, before the split (`self_attn.q_norm` [H·hd], `k_norm` [KV·hd]), and RoPE on the first
`rotary_dim` of each head's dims (the released files' key; `partial_rotary_factor` where given), theta 5 000 000."""

from __future__ import annotations

from blocktrace.sources.families.base import WHOLE_QK_NORM, HFLayer, rope_fields
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.sources.families.moe import MixtureFamily
from blocktrace.vocab import Norm, RouterKind


class MiniMaxM2(MixtureFamily, Llama):
    # Mixtral keys, biased sigmoid router
    name, hf_classes = "minimax_m2", ("MiniMaxM2DecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, router="block_sparse_moe.gate",
                       router_kind=RouterKind.SIGMOID_GROUPED)
    defaults = {**Llama.defaults, "num_experts_per_tok": 8, "intermediate_size": 1536, "head_dim": 128}
    moe_path, expert_names = "block_sparse_moe", ("w1", "w3", "w2")
    expert_width_key, always_renormalise = "intermediate_size", True

    def config_fields(self, config):
        head_dim = self.setting(config, "head_dim", "integer")
        rotary_dim = config.integer("rotary_dim")
        fraction = rotary_dim / head_dim if rotary_dim is not None else 1.0
        return {**super().config_fields(config), "head_size": head_dim, "qk_norm": WHOLE_QK_NORM,
                **rope_fields(config, default_fraction=fraction, default_theta=5_000_000.0), **self.moe_fields(config),
                "router": RouterKind.SIGMOID_GROUPED, "choice_bias": True, "expert_groups": 1, "groups_per_token": 1}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False}

    def ffn(self, read, c):
        return {**super().ffn(read, c),
                "ffn.choice_bias": read(f"{self.moe_path}.e_score_correction_bias", (c.experts.n_experts,))}
