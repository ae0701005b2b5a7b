"""Mixture-of-experts families (Llama's attention keys; the FFN is a router and its experts):

- Mixtral: `block_sparse_moe.gate` and `block_sparse_moe.experts.{e}.w1/w3/w2` (gate, up, down);
  top-2 of 8 by default, the chosen probabilities always renormalised; Mistral's attention.
- Qwen2-MoE: `mlp.gate`, `mlp.experts.{e}.gate_proj/up_proj/down_proj`, plus a shared expert
  (`mlp.shared_expert`) gated by sigmoid(`mlp.shared_expert_gate`·x); q/k/v biases; layers that
  `mlp_only_layers` or `decoder_sparse_step` leave dense have one FFN of `intermediate_size`.
- Qwen3-MoE: Qwen3's attention (QK-norm per head), Qwen2-MoE's experts without a shared one.
- OLMoE: OLMo's QK-norm over all heads, Pre-LN, `mlp.experts`; `clip_qkv` is refused.

Renormalising the top-k probabilities follows `norm_topk_prob` (Qwen, OLMoE; HF's default:
false). HF's loss adds router_aux_loss_coef × the load-balance loss when `output_router_logits`
is set; blocktrace's loss is the language-model loss, and each layer's load-balance loss is
reported with its routing (a note says so).
"""

from __future__ import annotations

from blocktrace.errors import WeightsError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import (GATED_NAMES, WHOLE_QK_NORM, gated_mlp, HFLayer, refuse_unless,
                                              rmsnorm_shape)
from blocktrace.sources.families.llama import LLAMA_STEPS, Llama, Mistral, Qwen2, Qwen3, qwen_window
from blocktrace.vocab import Norm


def expert_mlps(read, c, path: str = "mlp.experts", names: tuple[str, str, str] = GATED_NAMES) -> dict:
    """Every routed expert's gated MLP ({path}.{e} → ffn.experts.{e}), each d_ff wide."""
    experts = (gated_mlp(read, f"{path}.{e}", f"ffn.experts.{e}", c.d_ff, c.d_model, names=names)
               for e in range(c.experts.n_experts))
    return {key: tensor for expert in experts for key, tensor in expert.items()}


def shared_mlp(read, c, path: str = "mlp.shared_experts") -> dict:
    """The shared expert every token passes through (one gated MLP), where the layer has one."""
    width = c.experts.shared_expert_d_ff
    return {} if width is None else gated_mlp(read, path, "ffn.shared_expert", width, c.d_model)


class MixtureFamily:
    """What the MoE families share: reading the router and the experts, and which layers are sparse."""

    moe_path = "mlp"  # where the router and experts live inside a layer
    router_name = "gate"  # the router's linear layer inside it
    expert_names = GATED_NAMES  # each expert's gate, up and down projections
    expert_width_key = "moe_intermediate_size"
    always_renormalise = False  # Mixtral has no norm_topk_prob: it always renormalises
    # The FFN step is the whole sparse block: router, experts, shared expert.
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, router="mlp.gate")
    defaults: dict

    def moe_fields(self, config: ConfigFile) -> dict:
        return {"n_experts": self.expert_count(config), "d_ff": self.setting(config, self.expert_width_key, "integer"),
                "experts_per_token": self.setting(config, "num_experts_per_tok", "integer"),
                "renormalise_top_k": self.always_renormalise or self.setting(config, "norm_topk_prob", "boolean")}

    @staticmethod
    def expert_count(config: ConfigFile) -> int:
        """num_experts or num_local_experts: HF's configs take either name (one is an alias of the other)."""
        count = config.integer("num_experts") or config.integer("num_local_experts")
        if count is None:
            raise WeightsError(f"{config.path} does not say how many experts a layer has (num_experts or "
                               "num_local_experts)")
        return count

    def sparse(self, config: ConfigFile, layer: int) -> bool:
        """Qwen's rule: a layer is sparse unless mlp_only_layers lists it or decoder_sparse_step skips it."""
        dense = config.raw("mlp_only_layers") or []
        if not isinstance(dense, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                                  for i in dense):
            raise config.bad("mlp_only_layers", "a list of layer indices (integers ≥ 0)", dense)
        step = config.integer("decoder_sparse_step", 1)
        return layer not in dense and (layer + 1) % step == 0

    def dense_fields(self, config: ConfigFile, layer: int) -> dict:
        if config is None or self.sparse(config, layer):
            return {}
        return {"experts": None, "d_ff": config.integer("intermediate_size")}

    def ffn(self, read, c) -> dict:
        if c.experts is None:  # a dense layer of a mostly sparse model
            return Llama.mlp(read, c)
        router = read(f"{self.moe_path}.{self.router_name}.weight", (c.experts.n_experts, c.d_model))
        return {"ffn.router.weight": router, **expert_mlps(read, c, f"{self.moe_path}.experts", self.expert_names)}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base)

    def notes(self, config):
        notes = super().notes(config)
        if config is not None and config.boolean("output_router_logits", False):
            notes.append("output_router_logits is set: HF adds router_aux_loss_coef × the load-balance loss to its "
                         "loss; blocktrace's loss is the language-model loss alone, and each layer's load-balance "
                         "loss is in its routing")
        return notes


class Mixtral(MixtureFamily, Mistral):
    # Llama keys, block_sparse_moe experts
    name, hf_classes = "mixtral", ("MixtralDecoderLayer",)
    defaults = {**Llama.defaults, "rms_norm_eps": 1e-5, "sliding_window": None, "num_experts_per_tok": 2,
                "intermediate_size": 14336}
    moe_path, expert_names = "block_sparse_moe", ("w1", "w3", "w2")
    expert_width_key, always_renormalise = "intermediate_size", True

    def config_fields(self, config):
        return {**super().config_fields(config), **self.moe_fields(config)}

    def layer_fields(self, config, layer):
        window = self.setting(config, "sliding_window", "integer") if config is not None else None
        return {"sliding_window": window}


class Qwen2MoE(MixtureFamily, Qwen2):
    # Llama keys, experts and a shared expert
    name, hf_classes = "qwen2_moe", ("Qwen2MoeDecoderLayer",)
    defaults = {**Llama.defaults, "qkv_bias": True, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                "norm_topk_prob": False}

    def config_fields(self, config):
        return {**super().config_fields(config), **self.moe_fields(config),
                "shared_expert_d_ff": config.integer("shared_expert_intermediate_size")}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False, "qkv_bias": self.setting(config, "qkv_bias", "boolean")}

    def layer_fields(self, config, layer):
        return {**qwen_window(config, layer, every_other_below_max_window_layers), **self.dense_fields(config, layer)}

    def parameters(self, read, c):
        d, state = c.d_model, super().parameters(read, c)
        if c.experts is not None and c.experts.shared_expert_d_ff is not None:  # not on a dense layer
            state.update({**shared_mlp(read, c, "mlp.shared_expert"),
                          "ffn.shared_gate.weight": read("mlp.shared_expert_gate.weight", (1, d))})
        return state


class Qwen3MoE(MixtureFamily, Qwen3):
    # Qwen3 keys, experts
    name, hf_classes = "qwen3_moe", ("Qwen3MoeDecoderLayer",)
    defaults = {**Llama.defaults, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "norm_topk_prob": False}

    def config_fields(self, config):
        return {**super().config_fields(config), **self.moe_fields(config)}

    def layer_fields(self, config, layer):
        """Qwen3MoeConfig has no layer_types and no max_window_layers: with use_sliding_window on, HF's model
        windows every layer (a layer_types key in the file is ignored there, and here)."""
        window = config.integer("sliding_window") if config is not None and \
            config.boolean("use_sliding_window", False) else None
        return {"sliding_window": window, **self.dense_fields(config, layer)}


def every_other_below_max_window_layers(config, layer: int) -> bool:
    """Qwen2MoeConfig's rule without layer_types: the even layers below max_window_layers slide."""
    return layer % 2 == 0 and layer < config.integer("max_window_layers", 28, positive=False)


class OLMoE(MixtureFamily, Llama):
    # Llama keys, QK-norm over all heads, experts
    name, hf_classes = "olmoe", ("OlmoeDecoderLayer",)
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "silu", "num_experts_per_tok": 8, "intermediate_size": 2048,
                "norm_topk_prob": False}
    expert_width_key = "intermediate_size"

    def config_fields(self, config):
        refuse_unless(config, "clip_qkv", (None,), "clamps q, k and v")
        return {**super().config_fields(config), **self.moe_fields(config), "qk_norm": WHOLE_QK_NORM}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}
