"""Llama and the families that share its keys (`layers.{k}.…`, `model.` prefix as the causal-LM
classes save them): Pre-RMSNorm, SwiGLU, RoPE, grouped-query attention.

The keys are alike; the computation is not. What each adds, read from its config.json:
- Mistral: a sliding window over the last `sliding_window` keys, in every layer.
- Qwen2: biases on q, k and v (none on the output projection); optional sliding windows.
- Qwen3: RMSNorm on each head's q and k before RoPE (QK-norm); an explicit head_dim.
"""

from __future__ import annotations

from typing import Callable, Optional

from blocktrace.errors import UsageError, WeightsError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import (Family, gated_mlp, head_weight, HeadSpec, HFLayer, linear, LossKind,
                                              refuse_unless, rmsnorm_shape, rope_fields)
from blocktrace.vocab import FFNKind, Norm, QKSpan

SLIDING = "sliding_attention"
LLAMA_STEPS = {"norm1": "input_layernorm", "attn": "self_attn", "norm2": "post_attention_layernorm", "ffn": "mlp"}


class Llama(Family):
    name, described = "llama", "llama (layers.{k}.*, optionally model.)"
    hf_classes = ("LlamaDecoderLayer",)
    hf_layer = HFLayer(LLAMA_STEPS, norm=Norm.RMSNORM, hidden="mlp.act_fn")
    defaults = {"rms_norm_eps": 1e-6, "hidden_act": "silu"}
    layers_path, marker, prefixes = "layers", "input_layernorm.weight", ("", "model.")
    embedding_key = "embed_tokens.weight"
    activation_key, activations = "hidden_act", {"silu": FFNKind.SWIGLU}  # the config's activation: the FFN it names
    ignored = ("self_attn.rotary_emb.inv_freq",)  # a computed buffer some files hold
    needs_config = True  # the keys are shared by families that compute differently: see the module docstring
    config_keys = {"d_model": "hidden_size", "n_heads": "num_attention_heads", "d_ff": "intermediate_size",
                   "eps": "rms_norm_eps", "kv_heads": "num_key_value_heads", "head_size": "head_dim",
                   "rope_theta": "rope_theta", "rotary_fraction": "partial_rotary_factor",
                   "sliding_window": "sliding_window"}

    def config_fields(self, config):
        heads = config.integer("num_attention_heads")
        return {"d_model": config.integer("hidden_size"), "n_heads": heads, "d_ff": config.integer("intermediate_size"),
                "eps": self.setting(config, "rms_norm_eps", positive=True), "ffn": self.activation(config),
                "norm": Norm.RMSNORM, "kv_heads": config.integer("num_key_value_heads") or heads,
                "head_size": config.integer("head_dim"), **self.bias_fields(config), **rope_fields(config)}

    def activation(self, config: ConfigFile) -> FFNKind:
        """The FFN the config's activation names, among those the family's HF MLP computes (`activations`)."""
        activation = self.setting(config, self.activation_key, "string")
        if activation not in self.activations:
            raise WeightsError(f"{config.path}: {self.activation_key} {activation!r} is not supported for "
                               f"{self.name}; supported: {', '.join(self.activations)}")
        return self.activations[activation]

    def bias_fields(self, config: ConfigFile) -> dict:
        return {"bias": config.boolean("mlp_bias", False), "attn_bias": config.boolean("attention_bias", False)}

    def shape_fields(self, checkpoint, base):
        return rmsnorm_shape(checkpoint, base, ffn_in="mlp.gate_proj.weight")

    def parameters(self, read, c):
        return {"norm1.weight": read("input_layernorm.weight", (c.d_model,)), **self.mixer(read, c),
                "norm2.weight": read("post_attention_layernorm.weight", (c.d_model,)), **self.ffn(read, c)}

    # The token mixer's and the feed-forward's tensors: a family whose layer differs in one of them says only that
    def mixer(self, read, c) -> dict:
        return self.attention(read, c)

    def ffn(self, read, c) -> dict:
        return self.mlp(read, c)

    @staticmethod
    def attention(read, c) -> dict:
        hd = c.head_dim
        q, kv = c.n_heads * hd, c.n_kv_heads * hd
        state = Llama.projections(read, c)
        if c.qk_norm is not None and c.qk_norm.gain:  # per head (Qwen3), or across all heads (OLMo-2)
            whole = c.qk_norm.span is QKSpan.ALL_HEADS
            state["attn.q_norm.weight"] = read("self_attn.q_norm.weight", (q if whole else hd,))
            state["attn.k_norm.weight"] = read("self_attn.k_norm.weight", (kv if whole else hd,))
        return state

    @staticmethod
    def projections(read, c) -> dict:
        """The four attention projections q, k, v and o under Llama's names."""
        d, hd = c.d_model, c.head_dim
        q, kv = c.n_heads * hd, c.n_kv_heads * hd
        return {**linear(read, "self_attn.q_proj", "attn.q_proj", q, d, c.projection_bias),
                **linear(read, "self_attn.k_proj", "attn.k_proj", kv, d, c.projection_bias),
                **linear(read, "self_attn.v_proj", "attn.v_proj", kv, d, c.projection_bias),
                **linear(read, "self_attn.o_proj", "attn.out_proj", d, q, c.attention_bias)}

    @staticmethod
    def mlp(read, c) -> dict:
        d, f = c.d_model, c.d_ff
        return gated_mlp(read, "mlp", "ffn", f, d, c.bias)

    def head(self, checkpoint, info):
        """The final RMSNorm, then lm_head (or the embedding, where the model ties them)."""
        weight, tied = head_weight(checkpoint, info, "lm_head.weight", f"{info.prefix}{self.embedding_key}")
        config = info.config
        return HeadSpec(LossKind.NEXT_TOKEN, weight, f"{info.prefix}norm.weight", norm=Norm.RMSNORM,
                        eps=self.setting(config, "rms_norm_eps", positive=True), norm_offset=self.norm_offset(),
                        softcap=self.logit_softcap(config), logit_scale=self.logit_scale(config), tied=tied)

    def norm_offset(self) -> float:
        return 0.0

    def sliding(self, config: ConfigFile, layer: int) -> bool:
        """Whether layer_types marks the layer sliding; without them, the family's own HF config class's rule."""
        types = config.layer_types(config.integer("num_hidden_layers"))
        return types[layer] == SLIDING if types is not None else self.sliding_by_default(config, layer)

    def sliding_by_default(self, config: ConfigFile, layer: int) -> bool:
        """The rule a family's HF config class fills layer_types by (none: no layer slides)."""
        return False

    def logit_softcap(self, config) -> Optional[float]:
        return None

    def logit_scale(self, config) -> float:
        return 1.0

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm is not Norm.RMSNORM or config.sandwich:
            raise UsageError(f"{self.name} weights need --norm rmsnorm, --ffn swiglu and no sandwich norms")


class Mistral(Llama):
    # Llama keys, sliding window
    name, hf_classes = "mistral", ("MistralDecoderLayer",)
    defaults = {**Llama.defaults, "sliding_window": 4096}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False}

    def layer_fields(self, config, layer):
        return {"sliding_window": self.setting(config, "sliding_window", "integer") if config is not None else None}


def qwen_window(config: Optional[ConfigFile], layer: int,
                sliding_by_default: Callable[[ConfigFile, int], bool] = None) -> dict:
    """Qwen's sliding window applies where use_sliding_window is on, to the layers layer_types marks sliding or,
    without them, to those the family's own HF config class marks (`sliding_by_default`; Qwen2's and Qwen3's:
    every layer from max_window_layers on)."""
    if config is None or not config.boolean("use_sliding_window", False):
        return {"sliding_window": None}
    window = config.integer("sliding_window")
    types = config.layer_types(config.integer("num_hidden_layers"))
    if types is not None:
        sliding = types[layer] == SLIDING
    else:
        sliding = (sliding_by_default or from_max_window_layers)(config, layer)
    return {"sliding_window": window if sliding else None}


def every_other_layer(config: ConfigFile, layer: int) -> bool:
    """Gemma2Config's and GptOssConfig's rule: every other layer slides, from the first."""
    return layer % 2 == 0


def from_max_window_layers(config: ConfigFile, layer: int) -> bool:
    """Qwen2Config's and Qwen3Config's rule: the layers from max_window_layers on slide."""
    return layer >= config.integer("max_window_layers", 28, positive=False)


class Qwen2(Llama):
    # Llama keys, q/k/v biases
    name, hf_classes = "qwen2", ("Qwen2DecoderLayer",)

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": False, "qkv_bias": True}

    def layer_fields(self, config, layer):
        return qwen_window(config, layer)


class Qwen3(Qwen2):
    # Llama keys, QK-norm
    name, hf_classes = "qwen3", ("Qwen3DecoderLayer",)

    def config_fields(self, config):
        return {**super().config_fields(config), "qk_norm": True}

    def bias_fields(self, config):
        return {"bias": False, "attn_bias": config.boolean("attention_bias", False)}


def refuse_bidirectional(config: ConfigFile) -> None:
    refuse_unless(config, "use_bidirectional_attention", (None, False), "makes the decoder bidirectional")
