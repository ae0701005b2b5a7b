"""Llama-4's text model (`llama4_text`; Llama's key names, the FFN under `feed_forward`):

- RoPE layers (`no_rope_layers` 1; default all but every `no_rope_layer_interval`-th, 4) turn
  adjacent pairs (HF's complex rotation), then divide each head's q and k by their RMS
  (`use_qk_norm`: no gain, eps rms_norm_eps), and attend within chunks of `attention_chunk_size`
  tokens (the layers `layer_types` marks chunked; by default the RoPE layers);
- NoPE layers attend over the whole causal context, their queries sharpened with the position
  (`attn_temperature_tuning`: × 1 + `attn_scale`·ln(1 + ⌊(i + 1)/`floor_scale`⌋));
- a mixture of experts on `moe_layers` (default every `interleave_moe_layer_step`-th from the
  step's own): a router whose top-k logits' sigmoids scale the chosen experts' input, experts
  stored fused (`feed_forward.experts.gate_up_proj` [E, d, 2f], gate first; `down_proj` [E, f, d]),
  and an ungated shared expert; dense layers have `intermediate_size_mlp`.

The multimodal `llama4` checkpoints (keys under `language_model.`) are refused as another model
type: save the text model alone (Llama4ForCausalLM) to trace it.
"""

from __future__ import annotations

from blocktrace.config import QKNorm, QueryTemperature
from blocktrace.sources.configfile import LAYER_TYPES, ConfigFile
from blocktrace.sources.families.base import NOPE_FIELDS, HFLayer, gated_mlp, rope_fields, rotates
from blocktrace.sources.families.llama import Llama
from blocktrace.sources.families.moe import MixtureFamily
from blocktrace.vocab import Norm, RouterKind

CHUNKED = "chunked_attention"
STEPS = {"norm1": "input_layernorm", "attn": "self_attn", "norm2": "post_attention_layernorm", "ffn": "feed_forward"}


L2_QK_NORM = QKNorm(after_rope=True, gain=False)  # Llama4TextL2Norm: q / RMS(q) per head, after RoPE, no weight


class Llama4(MixtureFamily, Llama):
    # chunked and NoPE layers, sigmoid router
    name, hf_classes = "llama4_text", ("Llama4TextDecoderLayer",)
    hf_layer = HFLayer(STEPS, norm=Norm.RMSNORM, router="feed_forward.router", router_kind=RouterKind.SIGMOID_TOPK,
                       router_logits_at=1)
    defaults = {"rms_norm_eps": 1e-5, "hidden_act": "silu", "head_dim": 128, "num_local_experts": 16,
                "num_experts_per_tok": 1, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
                "interleave_moe_layer_step": 1, "use_qk_norm": True, "no_rope_layer_interval": 4,
                "attention_chunk_size": 8192, "attn_temperature_tuning": True, "floor_scale": 8192,
                "attn_scale": 0.1}
    default_theta = 500000.0  # Llama4TextConfig's, when neither rope_parameters nor rope_theta gives one
    config_keys = {**Llama.config_keys, "n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok",
                   "attention_chunk": "attention_chunk_size"}

    def config_fields(self, config):
        heads = config.integer("num_attention_heads")
        width = self.setting(config, "intermediate_size", "integer")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads,
                "kv_heads": config.integer("num_key_value_heads") or heads,
                "head_size": self.setting(config, "head_dim", "integer"), "norm": Norm.RMSNORM,
                "eps": self.setting(config, "rms_norm_eps", positive=True), "ffn": self.activation(config),
                "bias": False, "attn_bias": config.boolean("attention_bias", False), "rope_interleaved": True,
                **rope_fields(config, default_theta=self.default_theta),
                "n_experts": self.setting(config, "num_local_experts", "integer"), "d_ff": width,
                "experts_per_token": self.setting(config, "num_experts_per_tok", "integer"),
                "shared_expert_d_ff": width, "shared_expert_gated": False, "router": RouterKind.SIGMOID_TOPK,
                "renormalise_top_k": False}

    def rotates(self, config: ConfigFile, layer: int) -> bool:
        return rotates(config, layer, self.setting(config, "no_rope_layer_interval", "integer"), empty_is_none=True)

    def chunked(self, config: ConfigFile, layer: int) -> bool:
        """layer_types' word for the layer, or Llama4TextConfig's default: the RoPE layers, when chunks are set."""
        types = config.layer_types(config.integer("num_hidden_layers"), (*LAYER_TYPES, CHUNKED))
        if types is not None:
            if "sliding_attention" in types:
                raise config.bad("layer_types", "full_attention or chunked_attention (Llama-4 has no sliding layers)",
                                 types)
            return types[layer] == CHUNKED
        # Llama4TextConfig's own rule without layer_types: the rotating layers are chunked when a chunk size is set
        return self.rotates(config, layer) and self.setting(config, "attention_chunk_size", "integer") is not None

    def sparse(self, config: ConfigFile, layer: int) -> bool:
        layers, step = config.integer("num_hidden_layers"), self.setting(config, "interleave_moe_layer_step", "integer")
        given = config.raw("moe_layers")
        if given is None:
            return layer in range(step - 1, layers, step)
        if not isinstance(given, list) or any(type(v) is not int or not 0 <= v < layers for v in given):
            raise config.bad("moe_layers", f"a list of layer indices below {layers}", given)
        return layer in given

    def layer_fields(self, config, layer):
        if config is None:
            return {}
        attention = {"attention_chunk": self.required(config, "attention_chunk_size", f"layer {layer} attends "
                                                      "within chunks, sized", "integer")
                     if self.chunked(config, layer) else None}
        if self.rotates(config, layer):
            attention["qk_norm"] = L2_QK_NORM if self.setting(config, "use_qk_norm", "boolean") else None
        else:
            attention.update(NOPE_FIELDS)
            if self.setting(config, "attn_temperature_tuning", "boolean"):
                attention["temperature"] = QueryTemperature(self.setting(config, "floor_scale", "integer"),
                                                            self.setting(config, "attn_scale"))
        ffn = {} if self.sparse(config, layer) else {
            "experts": None, "d_ff": self.setting(config, "intermediate_size_mlp", "integer")}
        return {**attention, **ffn}

    @staticmethod
    def ffn(read, c) -> dict:
        """The feed_forward of a layer: dense, or the router, the fused experts and the shared expert
        (Llama.parameters reads it after the norms and the attention)."""
        d, f = c.d_model, c.d_ff
        if c.experts is None:
            return gated_mlp(read, "feed_forward", "ffn", f, d)
        e = c.experts.n_experts
        gate_up, down = read("feed_forward.experts.gate_up_proj", (e, d, 2 * f)), \
            read("feed_forward.experts.down_proj", (e, f, d))
        state = {"ffn.router.weight": read("feed_forward.router.weight", (e, d)),
                 **gated_mlp(read, "feed_forward.shared_expert", "ffn.shared_expert", f, d)}
        for k in range(e):  # HF computes x @ gate_up_proj[k] and takes the gate from the first half of the columns
            state.update({f"ffn.experts.{k}.gate.weight": gate_up[k][:, :f].t().contiguous(),
                          f"ffn.experts.{k}.up.weight": gate_up[k][:, f:].t().contiguous(),
                          f"ffn.experts.{k}.down.weight": down[k].t().contiguous()})
        return state

    def notes(self, config):
        notes = super().notes(config)
        if config is not None:
            layers = range(config.integer("num_hidden_layers"))
            unrotated = [k for k in layers if not self.rotates(config, k)]
            unrotated_text = ", ".join(map(str, unrotated)) or "none"
            notes.append(f"layers without RoPE (NoPE, full causal attention): {unrotated_text}"
                         "; the router's probabilities in the routing statistics are softmax(logits), what HF's "
                         "load-balance loss reads, while the experts are weighed by the sigmoids of the chosen logits")
        return notes

    def top_level_defaults(self, config):
        return [key for key in self.defaults if key != "no_rope_layer_interval" or not config.raw("no_rope_layers")]
