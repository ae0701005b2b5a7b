"""DeepSeek-V2 and DeepSeek-V3 (Llama's layer names around two pieces of their own):

- multi-head latent attention (MLA: `self_attn.q_a_proj`/`q_a_layernorm`/`q_b_proj` or `q_proj`,
  `kv_a_proj_with_mqa`, `kv_a_layernorm`, `kv_b_proj`, `o_proj`), whose latents' RMSNorms use HF's
  default eps 1e-6, and whose scale is qk_head_dim^-½ times YaRN's mscale(factor, mscale_all_dim)²;
  RoPE on the last qk_rope_head_dim dims of each head, turning adjacent pairs (V2 always, V3 with
  `rope_interleave`, as HF's V3 does it: the same dot products);
- a mixture of experts after `first_k_dense_replace` dense layers: `mlp.gate` (V3's with
  `e_score_correction_bias`), `mlp.experts.{e}.gate_proj/up_proj/down_proj`, and
  `n_shared_experts` × moe_intermediate_size of ungated shared expert (`mlp.shared_experts`).
  V3 routes by sigmoid scores: the bias moves the choice among the `topk_group` groups whose two best
  experts sum highest, the weights are the unbiased scores (renormalised with `norm_topk_prob`), ×
  `routed_scaling_factor`. V2 routes by softmax, greedily or within the groups with the largest
  maximum (`topk_method`), the weights never renormalised (HF ignores its norm_topk_prob), × the factor.

The hub's FP8 V3 files (quantization_config) are refused: trace a bf16 conversion. The multi-token
prediction layer V3 files hold after the last layer (`layers.61`) is not one of the model's layers.
"""

from __future__ import annotations

from blocktrace.config import LatentWidths
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import HFLayer, linear, refuse_unless, rope_fields, yarn_mscale
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama
from blocktrace.sources.families.moe import MixtureFamily, expert_mlps, shared_mlp
from blocktrace.vocab import Norm, RouterKind

LATENT_EPS = 1e-6  # HF builds q_a_layernorm and kv_a_layernorm with DeepseekV2/V3RMSNorm's default eps


class DeepSeekV3(MixtureFamily, Llama):
    choice_bias_key = "mlp.gate.e_score_correction_bias"  # where the file keeps the router's choice bias
    routed_key, shared_key = "n_routed_experts", "n_shared_experts"  # the config's names of the experts' counts
    # latent attention, grouped sigmoid router
    name, hf_classes = "deepseek_v3", ("DeepseekV3DecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, router="mlp.gate", router_kind=RouterKind.SIGMOID_GROUPED)
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "n_routed_experts": 256, "n_shared_experts": 1,
                "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "intermediate_size": 18432,
                "first_k_dense_replace": 3, "n_group": 8, "topk_group": 4, "norm_topk_prob": True,
                "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "v_head_dim": 128, "rope_interleave": True}
    # BlockConfig fields that come from a config.json key of another name, so a bad value is reported as the key
    config_keys = {**Llama.config_keys, "d_ff": "moe_intermediate_size", "n_experts": "n_routed_experts",
                   "experts_per_token": "num_experts_per_tok", "expert_groups": "n_group",
                   "groups_per_token": "topk_group", "routed_scaling": "routed_scaling_factor",
                   "latent": "kv_lora_rank"}
    nested_keys = {"rope_dims": "qk_rope_head_dim", "nope_dims": "qk_nope_head_dim", "value_dims": "v_head_dim",
                   "kv_rank": "kv_lora_rank", "q_rank": "q_lora_rank"}

    def config_fields(self, config):
        heads = config.integer("num_attention_heads")
        kv_heads = config.integer("num_key_value_heads") or heads
        if kv_heads != heads:
            raise config.bad("num_key_value_heads", f"num_attention_heads ({heads}): latent attention gives every "
                             "head its own key and value", kv_heads)
        latent = LatentWidths(kv_rank=self.setting(config, "kv_lora_rank", "integer"),
                              nope_dims=self.setting(config, "qk_nope_head_dim", "integer"),
                              rope_dims=self.setting(config, "qk_rope_head_dim", "integer"),
                              value_dims=self.setting(config, "v_head_dim", "integer"),
                              q_rank=self.setting(config, "q_lora_rank", "integer"), latent_eps=LATENT_EPS)
        rope = rope_fields(config)
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "kv_heads": heads,
                "head_size": latent.head_dims, "latent": latent, "norm": Norm.RMSNORM, "ffn": self.activation(config),
                "eps": self.setting(config, "rms_norm_eps", positive=True), **self.bias_fields(config), **rope,
                "rope_interleaved": self.interleaved(config), "attn_scale": self.scale(config, latent),
                **self.router_fields(config)}

    def interleaved(self, config: ConfigFile) -> bool:
        return self.setting(config, "rope_interleave", "boolean")

    def bias_fields(self, config: ConfigFile) -> dict:
        """Biases on q_a, kv_a and o with attention_bias; none in the MLPs and experts (V2's mlp_bias is refused)."""
        refuse_unless(config, "mlp_bias", (None, False), "puts biases on the dense MLPs and shared experts only")
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}

    @staticmethod
    def scale(config: ConfigFile, latent: LatentWidths) -> float:
        """qk_head_dim^-½, times mscale² where the RoPE is scaled and gives mscale_all_dim (HF's
        yarn_apply_mscale)."""
        parameters = config.merged("rope_scaling", "rope_parameters")
        kind = parameters.string("rope_type") or parameters.string("type") or "default"
        weight = parameters.number("mscale_all_dim", 0)
        mscale = yarn_mscale(parameters.number("factor", 1.0), weight) if kind != "default" and weight else 1.0
        return latent.head_dims ** -0.5 * mscale * mscale

    def router_fields(self, config: ConfigFile) -> dict:
        refuse_unless(config, "scoring_func", (None, "sigmoid"), "scores the experts otherwise than HF's V3 (sigmoid)")
        refuse_unless(config, "topk_method", (None, "noaux_tc"), "chooses the experts otherwise than HF's V3 "
                      "(noaux_tc)")
        return {"router": RouterKind.SIGMOID_GROUPED, "choice_bias": True,
                "expert_groups": self.setting(config, "n_group", "integer"),
                "groups_per_token": self.setting(config, "topk_group", "integer"),
                "renormalise_top_k": self.setting(config, "norm_topk_prob", "boolean"),
                **self.expert_fields(config)}

    def expert_fields(self, config: ConfigFile) -> dict:
        refuse_unless(config, "moe_layer_freq", (None, 1), "makes only some layers after the dense ones sparse")
        shared = self.setting(config, self.shared_key, "integer", positive=False)
        width = self.setting(config, "moe_intermediate_size", "integer")
        return {"n_experts": self.setting(config, self.routed_key, "integer"), "d_ff": width,
                "experts_per_token": self.setting(config, "num_experts_per_tok", "integer"),
                "routed_scaling": self.setting(config, "routed_scaling_factor", positive=True),
                "shared_expert_d_ff": width * shared if shared else None, "shared_expert_gated": False}

    def sparse(self, config: ConfigFile, layer: int) -> bool:
        return layer >= self.setting(config, "first_k_dense_replace", "integer", positive=False)

    def dense_fields(self, config, layer):
        if config is None or self.sparse(config, layer):
            return {}
        return {"experts": None, "d_ff": self.setting(config, "intermediate_size", "integer")}

    def layer_fields(self, config, layer):
        return self.dense_fields(config, layer)

    @staticmethod
    def attention(read, c) -> dict:
        """Latent attention's projections, its two latent norms and its output projection (Llama.parameters
        reads them here, around the norms and the experts)."""
        d, h, latent, bias = c.d_model, c.n_heads, c.latent, c.attention_bias
        state = {}
        if latent.q_rank is None:
            state.update(linear(read, "self_attn.q_proj", "attn.q_proj", h * latent.head_dims, d, False))
        else:
            state.update({**linear(read, "self_attn.q_a_proj", "attn.q_a_proj", latent.q_rank, d, bias),
                          "attn.q_a_norm.weight": read("self_attn.q_a_layernorm.weight", (latent.q_rank,)),
                          **linear(read, "self_attn.q_b_proj", "attn.q_b_proj", h * latent.head_dims, latent.q_rank,
                                   False)})
        return {**state,
                **linear(read, "self_attn.kv_a_proj_with_mqa", "attn.kv_a_proj", latent.kv_rank + latent.rope_dims, d,
                         bias),
                "attn.kv_a_norm.weight": read("self_attn.kv_a_layernorm.weight", (latent.kv_rank,)),
                **linear(read, "self_attn.kv_b_proj", "attn.kv_b_proj", h * (latent.nope_dims + latent.value_dims),
                         latent.kv_rank, False),
                **linear(read, "self_attn.o_proj", "attn.out_proj", d, h * latent.value_dims, bias)}

    def ffn(self, read, c):
        if c.experts is None:
            return Llama.mlp(read, c)
        bias = {"ffn.choice_bias": read(self.choice_bias_key, (c.experts.n_experts,))} if c.experts.choice_bias else {}
        return {"ffn.router.weight": read("mlp.gate.weight", (c.experts.n_experts, c.d_model)), **bias,
                **expert_mlps(read, c), **shared_mlp(read, c)}

    def notes(self, config):
        return [*super().notes(config), "latent attention: q and k are per-head unrotated dims then RoPE'd dims (the "
                "rotated key shared by every head); the sub-steps q_latent and kv_latent are the compressed query "
                "and keys/values"]


class DeepSeekV2(DeepSeekV3):
    # latent attention, grouped softmax router
    name, hf_classes = "deepseek_v2", ("DeepseekV2DecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, router="mlp.gate", router_kind=RouterKind.SOFTMAX_GROUPED)
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu", "n_routed_experts": 64, "n_shared_experts": 2,
                "moe_intermediate_size": 1407, "intermediate_size": 11008, "first_k_dense_replace": 0,
                "n_group": None, "topk_group": None, "topk_method": "greedy", "num_experts_per_tok": None,
                "routed_scaling_factor": 1.0, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
                "qk_nope_head_dim": 128, "v_head_dim": 128}

    def interleaved(self, config: ConfigFile) -> bool:
        return True  # HF's V2 turns adjacent pairs as complex numbers, always

    def router_fields(self, config: ConfigFile) -> dict:
        refuse_unless(config, "scoring_func", (None, "softmax"), "scores the experts otherwise than HF's V2 (softmax)")
        method = self.setting(config, "topk_method", "string")
        if method not in ("greedy", "group_limited_greedy"):
            raise config.bad("topk_method", "greedy or group_limited_greedy (HF's V2)", method)
        if self.setting(config, "num_experts_per_tok", "integer") is None:
            raise config.bad("num_experts_per_tok", "the experts each token goes to (HF's V2 has no default)", None)
        groups = kept = 1  # greedy is the grouped choice over one group of all the experts
        if method == "group_limited_greedy":
            groups, kept = (self.setting(config, key, "integer") for key in ("n_group", "topk_group"))
            if groups is None or kept is None:
                raise config.bad("n_group" if groups is None else "topk_group", "a positive integer for "
                                 "group_limited_greedy", None)
        return {"router": RouterKind.SOFTMAX_GROUPED, "renormalise_top_k": False, "expert_groups": groups,
                "groups_per_token": kept,
                **self.expert_fields(config)}

    def notes(self, config):
        notes = super().notes(config)
        if config is not None and config.boolean("norm_topk_prob", False):
            notes.append("norm_topk_prob is set, but HF's DeepSeek-V2 never renormalises the chosen experts' "
                         "weights: neither does blocktrace")
        return notes
