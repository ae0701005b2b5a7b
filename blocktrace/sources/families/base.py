"""What every checkpoint family provides: where its layers are, its config, its parameter map.

A family reads HuggingFace's own key layout and config.json. It turns the config into
BlockConfig fields (`config_fields`), each layer's tensors into blocktrace's TransformerBlock
state (`parameters`), and token ids into the first block's input (`embed`). A tensor of a
layer that `parameters` does not read is an error (see sources.loader): a checkpoint that
holds more than blocktrace computes is refused, never traced as if it did not.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from blocktrace.phrases import phrase
from blocktrace.config import BlockConfig, QKNorm, QKSpan, RopeScaling
from blocktrace.errors import WeightsError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.configfile import ConfigFile
from blocktrace.vocab import Choice, FFNKind, Norm, RopeKind, RouterKind
from blocktrace.wiring import PARALLEL, PRE, Wiring

Reader = Callable[..., torch.Tensor]  # (name or names inside the layer, expected shape) -> tensor


class LossKind(Choice):
    NEXT_TOKEN = "next_token"  # causal LMs: predict token t+1 from tokens ≤ t
    MASKED = "masked"  # BERT's masked-LM head: predict masked tokens from both sides


class NoLoss(Exception):
    """The checkpoint has no way to its model's loss; the message says why."""


@dataclass(frozen=True)
class HeadSpec:
    """Where a checkpoint keeps what turns the last block's output into logits."""

    kind: LossKind
    weight: str  # key of the [V, d] output projection (a separate head, or the tied embedding)
    norm_weight: Optional[str] = None  # the final norm; None where the stream is already normalised (Post-LN)
    norm_bias: Optional[str] = None
    norm: Norm = Norm.LAYERNORM
    eps: float = 1e-5
    norm_offset: float = 0.0  # Gemma: the final norm's gain is (1 + w) too
    bias: Optional[str] = None  # a bias on the logits (BERT's MLM head)
    softcap: Optional[float] = None  # Gemma-2: logits become cap·tanh(logits / cap)
    logit_scale: float = 1.0  # logits × this, before any cap (Cohere's logit_scale; Granite's 1 / logits_scaling)
    transform: Optional[tuple[str, str, str, str]] = None  # BERT: dense weight, bias, LayerNorm weight, bias
    transform_activation: Optional[FFNKind] = None
    tied: bool = False  # the projection is the input embedding


def head_weight(checkpoint: Checkpoint, info: "ModelInfo", separate: str, tied: str) -> tuple:
    """(key, tied) of the output projection: a separate head if the file has one, else the input
    embedding where the model ties them (config.json's tie_word_embeddings, or the family's default)."""
    if separate in checkpoint:
        return separate, False
    if info.family.ties(info.config) and tied in checkpoint:
        return tied, True
    raise NoLoss(phrase("the checkpoint has no output head ({head}) and does not tie it to the embedding: no loss",
                        head=separate))


@dataclass(frozen=True)
class HFLayer:
    """How HuggingFace's decoder layer of a family names its steps, for tracing that layer as it is (--module,
    the Watch, HF's own models): tracing.steps reads these, so a family declares its layer here and nowhere else."""

    steps: dict[str, str]  # step name -> submodule path: every sublayer and norm of the wiring; the sums are found
    wiring: Wiring = PRE
    norm: Norm = Norm.LAYERNORM
    hidden: Optional[str] = None  # the FFN activation module, for the dead-unit checks
    weights: Optional[str] = None  # the module whose output tuple holds the attention weights, when not attn's
    router: Optional[str] = None  # a mixture of experts' router (HF's TopKRouter: logits first, top_k)
    router_kind: RouterKind = RouterKind.SOFTMAX  # how that router's logits become probabilities
    router_logits_at: int = 0  # where the logits are in the router's output tuple (Llama-4's: after its scores)
    parallel_flag: Optional[str] = None  # the layer's attribute that, when true, makes its residual parallel
    parallel_wiring: Wiring = PARALLEL  # the wiring it then has (GPT-NeoX's two norms; StableLM's one)
    residual_multiplier: Optional[str] = None  # the layer's attribute that scales each sublayer's output in its
    # residual add (Granite's x + m·f(x))
    # (a submodule path, why): a layer holding that module (not None) cannot be traced as it is, and is refused so
    untraceable: Optional[tuple[str, str]] = None


@dataclass(frozen=True)
class ModelInfo:
    """What a checkpoint says about the whole model, beyond one block's config."""

    family: "Family"
    prefix: str  # e.g. "" as GPT2Model saves, "transformer." as GPT2LMHeadModel saves
    n_layers: int
    n_positions: Optional[int]
    vocab_size: Optional[int]
    config: Optional[ConfigFile]  # config.json (or the model's arguments stored in a training checkpoint)
    notes: tuple[str, ...] = ()  # how the checkpoint was read, and every default assumed

    @property
    def family_name(self) -> str:
        return self.family.name

    @property
    def has_config_file(self) -> bool:
        return self.config is not None

    def layer_prefix(self, layer: int) -> str:
        return f"{self.prefix}{self.family.layers_path}.{layer}."


class Family:
    """One checkpoint family; subclasses set the class attributes and the mapping."""

    name: str
    described: str  # for the list of supported layouts: only the families told apart by their keys, and nanoGPT
    model_types: tuple[str, ...]  # config.json model_type values this family reads: its name unless it says others
    layers_path: str  # e.g. "h" for GPT-2: keys are {prefix}{layers_path}.{k}.{...}
    marker: str  # a key inside every layer, used to detect the layout from the keys alone
    prefixes: tuple[str, ...]
    embedding_key: str
    ignored: tuple[str, ...] = ()  # layer tensors that are buffers, not parameters (old mask caches)
    needs_config = False  # whether the weights alone cannot say what the block computes
    head_key: Optional[str] = "lm_head.weight"  # a separate output head, outside the prefix
    tie_default = False  # transformers' default tie_word_embeddings for the family
    # config.json keys behind each BlockConfig field, so a bad value is reported as the file's key
    config_keys: dict[str, str] = {}
    # the fields of nested specs (DeepSeek's latent attention) as config.json names them, for messages
    nested_keys: dict[str, str] = {}
    hf_classes: tuple[str, ...] = ()  # the class names of HF's decoder layer for this family
    hf_layer: Optional[HFLayer] = None  # how that layer names its steps
    hf_layers: dict = {}  # class name → its HFLayer, where the family's layers are of several classes (OLMo-Hybrid)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in vars(cls) and "model_types" not in vars(cls):
            cls.model_types = (cls.name,)

    @property
    def pattern(self) -> re.Pattern:
        prefixes = "|".join(re.escape(p) for p in self.prefixes if p)
        return re.compile(rf"^({prefixes})?{re.escape(self.layers_path)}\.(\d+)\.{re.escape(self.marker)}$")

    def config_fields(self, config: ConfigFile) -> dict:
        raise NotImplementedError

    def shape_fields(self, checkpoint: Checkpoint, base: str) -> dict:
        """Fields read off the tensors, for a checkpoint without config.json."""
        raise NotImplementedError

    def parameters(self, read: Reader, config: BlockConfig) -> dict:
        raise NotImplementedError

    token_types = False  # whether the embeddings add a token type (segment) row: BERT
    # A table of learned positions (GPT-2, BERT) ends at n_positions; RoPE has no such end: past the trained context
    # it extrapolates, or its scaling (dynamic, longrope) takes over, as in HF.
    learned_positions = False

    def embed(self, checkpoint: Checkpoint, info: ModelInfo, ids: list[int], dtype,
              token_types: Optional[list[int]] = None) -> torch.Tensor:
        return checkpoint.get(f"{info.prefix}{self.embedding_key}", dtype, rows=ids)

    def check(self, config: BlockConfig) -> None:
        """Refuse a rewiring these parameters cannot fill."""

    def head(self, checkpoint: Checkpoint, info: ModelInfo) -> HeadSpec:
        """The final norm and output projection, for the model's own loss; NoLoss says why there is none."""
        raise NoLoss(phrase("blocktrace does not know {family}'s output head", family=self.name))

    def variant(self, checkpoint: Checkpoint, prefix: str) -> "Family":
        """The family these keys and shapes really are (one key layout, two ways of storing its weights)."""
        return self

    def ties(self, config: Optional[ConfigFile]) -> bool:
        return config.boolean("tie_word_embeddings", self.tie_default) if config is not None else self.tie_default

    def layer_fields(self, config: Optional[ConfigFile], layer: int) -> dict:
        """Fields that differ from layer to layer (which layers use a sliding window)."""
        return {}

    # config.json keys this family reads, with HF's defaults for them (tests check each against HF's config
    # class): a missing key takes the family's own default, and a note says so.
    defaults: dict[str, object] = {}

    def setting(self, config: ConfigFile, key: str, kind: str = "number", **checks):
        """config.json's `key` read as `kind` (a ConfigFile reader); HF's default for this family when the key is
        missing; None when it is null (HF's "none": no window, no cap)."""
        if key in config and config.raw(key) is None:
            return None
        return getattr(config, kind)(key, self.defaults[key], **checks)

    def required(self, config: ConfigFile, key: str, needed_by: str, kind: str = "number", **checks):
        """`setting`, where null has no meaning: what `needed_by` computes depends on the value and HF cannot run
        it null either, so no default stands in for it (refused with the key and the file)."""
        value = self.setting(config, key, kind, **checks)
        if value is None:
            raise WeightsError(f"{config.path}: {key} is null; {needed_by} by it: give a value "
                               f"({self.defaults[key]} is HF's default)")
        return value

    def notes(self, config: Optional[ConfigFile]) -> list[str]:
        """What the reader should know about how this checkpoint was read: every default assumed."""
        if config is None:
            return [f"no config.json: {self.name} defaults assumed where the weights are silent (norm eps, activation)"]
        return [f"config.json has no {key}: {self.name}'s default {self.defaults[key]} assumed (HF's)"
                for key in self.top_level_defaults(config) if key not in config]

    def top_level_defaults(self, config: ConfigFile):
        """The keys of `defaults` this config.json would hold at its top level (all of them, but where a family
        nests some elsewhere)."""
        return self.defaults


def refuse_quantised(config: ConfigFile) -> None:
    if config.raw("quantization_config") is not None:
        method = config.mapping("quantization_config").string("quant_method", "unknown")
        raise WeightsError(f"{config.path}: quantization_config ({method}): quantised weights are not supported; "
                           "trace the unquantised checkpoint")


def size(checkpoint: Checkpoint, key: str, axis: int) -> int:
    """One dimension of a tensor, read from the header; a tensor with too few dimensions is refused."""
    shape = checkpoint.shape(key)
    if len(shape) <= axis:
        raise WeightsError(f"tensor {key!r} has shape {list(shape)}: expected at least {axis + 1} dimensions")
    return shape[axis]


def linear(read: Reader, source: str, target: str, out: int, inp: int, bias: bool, transpose=False) -> dict:
    """nn.Linear state from a checkpoint's linear layer (transpose: a Conv1D stored [in, out])."""
    weight = read(f"{source}.weight", (inp, out) if transpose else (out, inp))
    state = {f"{target}.weight": weight.t() if transpose else weight}
    if bias:
        state[f"{target}.bias"] = read(f"{source}.bias", (out,))
    return state


def rmsnorm_shape(checkpoint: Checkpoint, base: str, *, norm: str = "input_layernorm.weight",
                  ffn_in: Optional[str] = None, fused: int = 1, ffn: FFNKind = FFNKind.SWIGLU) -> dict:
    """An RMSNorm layer's fields off its tensors: d_model from a norm's gain and, where `ffn_in` names the FFN's input
    projection, d_ff from its rows (`fused` projections stacked in it: a gate_up_proj holds two)."""
    width = {"d_ff": size(checkpoint, base + ffn_in, 0) // fused} if ffn_in is not None else {}
    return {"d_model": size(checkpoint, base + norm, 0), **width, "ffn": ffn, "norm": Norm.RMSNORM}


GATED_NAMES = ("gate_proj", "up_proj", "down_proj")  # LlamaMLP's gate, up and down projections


def gated_mlp(read: Reader, source: str, target: str, hidden: int, d: int, bias: bool = False,
              names: tuple[str, str, str] = GATED_NAMES) -> dict:
    """A gated FFN's three linear layers (HF's LlamaMLP and every expert written like it): the gate and up
    projections d → hidden and the down projection hidden → d, from `source`'s `names` to `target`'s gate, up and
    down."""
    gate, up, down = names
    return {**linear(read, f"{source}.{gate}", f"{target}.gate", hidden, d, bias),
            **linear(read, f"{source}.{up}", f"{target}.up", hidden, d, bias),
            **linear(read, f"{source}.{down}", f"{target}.down", d, hidden, bias)}


# HF's names (transformers.activations.ACT2FN) of the ungated activations blocktrace implements.
UNGATED_ACTIVATIONS = {"gelu": FFNKind.GELU, "gelu_python": FFNKind.GELU, "gelu_new": FFNKind.GELU_TANH,
                       "gelu_fast": FFNKind.GELU_TANH, "gelu_pytorch_tanh": FFNKind.GELU_TANH, "relu": FFNKind.RELU,
                       "relu2": FFNKind.RELU2}


def activation(config: ConfigFile, key: str, default: str, table: dict[str, FFNKind] = UNGATED_ACTIVATIONS) -> FFNKind:
    name = config.string(key, default)
    if name not in table:
        raise WeightsError(f"{config.path}: {key} {name!r} is not supported; supported: {', '.join(table)}")
    return table[name]


def refuse_unless(config: ConfigFile, key: str, allowed: tuple, why: str) -> None:
    """A config value that changes the computation in a way blocktrace does not implement."""
    value = config.raw(key)
    if key in config and value not in allowed:
        raise WeightsError(f"{config.path}: {key} = {value!r} {why}, which blocktrace does not implement "
                           "(refused rather than traced as a different model)")


def rope_fields(config: ConfigFile, *, theta_key: str = "rope_theta", fraction_key: str = "partial_rotary_factor",
                default_fraction: float = 1.0, parameters: Optional[ConfigFile] = None,
                original_default: Optional[int] = None, default_theta: float = 10000.0) -> dict:
    """RoPE's theta, scaling and rotated share of each head, from rope_parameters (transformers 5;
    `parameters`: one layer type's, where they differ by layer) or the older top-level keys
    (rope_theta, rope_scaling; GPT-NeoX's rotary_emb_base and rotary_pct)."""
    if parameters is None:  # transformers 5 folds an old file's rope_scaling into rope_parameters
        parameters = config.merged("rope_scaling", "rope_parameters")
    theta = parameters.number("rope_theta", None, positive=True) or config.number(theta_key, default_theta, positive=True)
    fraction = parameters.number("partial_rotary_factor", None, positive=True) \
        or config.number(fraction_key, default_fraction, positive=True)
    return {"rope_theta": theta, "rope_scaling": rope_scaling(config, parameters, original_default),
            "rotary_fraction": fraction}


def rope_scaling(config: ConfigFile, parameters: ConfigFile, original_default: Optional[int]) -> Optional[RopeScaling]:
    """The RoPE type's parameters, read and defaulted as transformers' modeling_rope_utils reads them."""
    kind = parameters.string("rope_type") or parameters.string("type") or "default"
    if kind == "default":
        return None
    if kind not in RopeKind.values():
        raise WeightsError(f"{config.path}: rope type {kind!r} is not supported; supported: default, "
                           f"{', '.join(RopeKind.values())}")
    kind = RopeKind(kind)
    maximum = config.integer("max_position_embeddings")
    if kind is RopeKind.LINEAR:
        return RopeScaling(kind, _required(parameters, "factor"))
    if kind is RopeKind.DYNAMIC:  # HF grows the base past max_position_embeddings, not the original context
        return RopeScaling(kind, _required(parameters, "factor"), original_positions=_required_maximum(config, maximum))
    # HF gives a top-level original_max_position_embeddings (Phi-3's) priority over rope_parameters'.
    original = config.integer("original_max_position_embeddings") or \
        parameters.integer("original_max_position_embeddings") or original_default or \
        _required_maximum(config, maximum)
    if kind is RopeKind.LLAMA3:
        return RopeScaling(kind, _required(parameters, "factor"), original, _required(parameters, "low_freq_factor"),
                           _required(parameters, "high_freq_factor"))
    if kind is RopeKind.YARN:
        return _yarn(config, parameters, original)
    return _longrope(config, parameters, original, maximum)


def _yarn(config: ConfigFile, parameters: ConfigFile, original: int) -> RopeScaling:
    """YaRN's parameters with HF's defaults (beta_fast 32, beta_slow 1, truncate true)."""
    factor = _required(parameters, "factor")
    theta = parameters.number("rope_theta", None) or config.number("rope_theta", None)
    if theta is not None and theta <= 1:  # its correction range divides by log(rope_theta)
        raise (parameters if parameters.number("rope_theta", None) else config).bad(
            "rope_theta", "above 1 for YaRN (its correction range divides by log(rope_theta))", theta)
    return RopeScaling(RopeKind.YARN, factor, original,
                       beta_fast=parameters.number("beta_fast", None, positive=True) or 32.0,
                       beta_slow=parameters.number("beta_slow", None, positive=True) or 1.0,
                       truncate=parameters.boolean("truncate", True),
                       attention_factor=_yarn_attention_factor(parameters, factor))


def _longrope(config: ConfigFile, parameters: ConfigFile, original: int, maximum: Optional[int]) -> RopeScaling:
    """Phi-3's longrope: its short and long factors, its factor and attention factor as HF defaults them."""
    if original < 2:  # longrope's attention factor divides by log(original_max_position_embeddings)
        raise WeightsError(f"{config.path}: original_max_position_embeddings must be at least 2 for longrope "
                           f"(its attention factor divides by its log), not {original}")
    factor = parameters.number("factor", None, positive=True) or _required_maximum(config, maximum) / original
    attention = parameters.number("attention_factor", None, positive=True)  # longrope's, as HF (Phi-3) defaults it
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeScaling(RopeKind.LONGROPE, factor, original, short_factor=_factors(parameters, "short_factor"),
                       long_factor=_factors(parameters, "long_factor"), attention_factor=attention)


def yarn_mscale(factor: float, weight: float) -> float:
    """YaRN's mscale (HF's yarn_get_mscale): 0.1·weight·ln(factor) + 1, or 1 where the context is not stretched."""
    return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0


def _yarn_attention_factor(parameters: ConfigFile, factor: float) -> float:
    """YaRN's cos/sin scale: given, or 0.1·ln(factor) + 1 (the paper's), or DeepSeek's ratio of two mscales."""
    given = parameters.number("attention_factor", None, positive=True)
    if given is not None:
        return given

    def mscale(weight: float) -> float:
        return yarn_mscale(factor, weight)

    top, bottom = parameters.number("mscale", None), parameters.number("mscale_all_dim", None)
    if not (top and bottom):
        return mscale(1.0)
    ratio = mscale(top) / mscale(bottom) if mscale(bottom) != 0 else math.inf
    if not (math.isfinite(ratio) and ratio > 0):
        raise parameters.bad("mscale_all_dim", f"a weight that keeps YaRN's attention factor mscale(mscale) / "
                             f"mscale(mscale_all_dim) positive and finite at factor {factor:g}", bottom)
    return float(ratio)


def _required(parameters: ConfigFile, key: str) -> float:
    value = parameters.number(key, None, positive=True)
    if value is None:
        raise parameters.bad(key, "a positive number (this rope type needs it)", None)
    return value


def _required_maximum(config: ConfigFile, maximum: Optional[int]) -> int:
    if maximum is None:
        raise WeightsError(f"{config.path}: this rope type needs max_position_embeddings (the context it scales from)")
    return maximum


def _factors(parameters: ConfigFile, key: str) -> tuple[float, ...]:
    values = parameters.raw(key)
    if not isinstance(values, list) or not values or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in values):
        raise parameters.bad(key, "a list of positive numbers (longrope's factor per frequency)", values)
    return tuple(float(v) for v in values)


WHOLE_QK_NORM = QKNorm(QKSpan.ALL_HEADS)  # OLMo-2's: q (and k) of all heads normalised at once, before the split
NOPE_FIELDS = {"rope_theta": None, "rope_scaling": None, "nope": True}  # a layer of a RoPE model left unrotated


def rotates(config: ConfigFile, layer: int, interval: int, empty_is_none: bool = False) -> bool:
    """Whether a layer rotates q and k: no_rope_layers[layer] (1: RoPE, 0: NoPE), or, where the file gives none, every
    layer but each `interval`-th, as SmolLM3's and Llama-4's config classes fill it (Llama-4's takes an empty list as
    none: `empty_is_none`)."""
    layers = config.integer("num_hidden_layers")
    given = config.raw("no_rope_layers")
    if given is None or (empty_is_none and given == []):
        return (layer + 1) % interval != 0
    if not isinstance(given, list) or len(given) != layers or any(type(v) is not int or v not in (0, 1)
                                                                  for v in given):
        raise config.bad("no_rope_layers", f"a list of {layers} values, 1 (RoPE) or 0 (none), one per layer", given)
    return bool(given[layer])
