"""Block configuration: one frozen dataclass and the enums for its fixed choices.

This module must not import torch: the CLI reads it to build `--help` and option choices,
and `blocktrace --help` has to answer without paying for `import torch`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar, Optional, Union

from blocktrace.errors import ConfigError
from blocktrace.vocab import STEP_NAMES, FFNKind, MixerKind, Norm, Parallel, Placement, QKSpan, RopeKind, RouterKind
from blocktrace.wiring import Wiring, wiring_of

__all__ = ["BlockConfig", "Experts", "GatedDeltaNet", "GLUClamp", "QKNorm", "QKSpan", "QueryTemperature", "LatentWidths", "Mamba2", "ShortConvolution", "TokenMixer", "RopeScaling", "STEP_NAMES", "FFNKind", "Norm", "Parallel", "Placement", "RopeKind",
           "RouterKind"]


# The softmax_biased router's floor under the chosen probabilities' sum (ERNIE-4.5's moe_norm_min, HF's default; the
# family refuses others)
BIASED_ROUTER_NORM_MIN = 1e-12


def _as_enum(enum_cls, value, field_name):
    try:
        return enum_cls(value)
    except ValueError:
        valid = ", ".join(member.value for member in enum_cls)
        raise ConfigError(f"{field_name} must be one of {valid}, not {value!r}", field_name) from None


class Piece:
    """A part of a block with settings of its own (a frozen dataclass): `of` takes it, or the dict to_dict wrote of
    it, or None."""

    @classmethod
    def of(cls, value):
        return cls(**value) if isinstance(value, dict) else value


@dataclass(frozen=True)
class RopeScaling:
    """RoPE stretched past the context a model was trained on, with HF's parameters for each kind
    (transformers' modeling_rope_utils; model.rope computes the frequencies from these)."""

    kind: RopeKind
    factor: float = 1.0
    # The context the model was trained on: past it the frequencies change (dynamic, longrope); llama3 and yarn
    # place their frequency bands by it. HF's original_max_position_embeddings (dynamic: max_position_embeddings).
    original_positions: Optional[int] = None
    low_freq_factor: float = 1.0  # llama3: wavelengths above original/low are divided by the factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below original/high are kept
    beta_fast: float = 32.0  # yarn: rotations within the context above which a frequency is kept
    beta_slow: float = 1.0  # yarn: rotations below which a frequency is interpolated
    truncate: bool = True  # yarn: the band's edges rounded to whole dims
    short_factor: tuple[float, ...] = ()  # longrope: one factor per frequency, within the original context
    long_factor: tuple[float, ...] = ()  # longrope: the same, past it
    attention_factor: float = 1.0  # multiplies cos and sin (yarn, longrope): sharper attention over a long context

    def __post_init__(self):
        set_field = object.__setattr__
        set_field(self, "kind", _as_enum(RopeKind, self.kind, "rope_scaling.kind"))
        set_field(self, "short_factor", tuple(self.short_factor))
        set_field(self, "long_factor", tuple(self.long_factor))
        if not self.factor > 0 or not self.attention_factor > 0:
            raise ConfigError(f"rope scaling factors must be positive (factor {self.factor}, attention factor "
                              f"{self.attention_factor})", "rope_scaling")
        if self.kind is not RopeKind.LINEAR and not (isinstance(self.original_positions, int)
                                                     and self.original_positions > 0):
            raise ConfigError(f"{self.kind} RoPE needs the original context length, a positive integer, not "
                              f"{self.original_positions!r}", "rope_scaling")
        # Equal factors leave the smoothed band empty (Llama-4-Scout's 1.0 and 1.0): HF computes that, and so do we
        if self.kind is RopeKind.LLAMA3 and not self.high_freq_factor >= self.low_freq_factor > 0:
            raise ConfigError(f"llama3 RoPE needs high_freq_factor >= low_freq_factor > 0 (got {self.high_freq_factor} "
                              f"and {self.low_freq_factor})", "rope_scaling")

    def check_dims(self, dims: int) -> None:
        """What the rotated dims allow: longrope has a factor per frequency, dynamic's exponent is dims/(dims-2)."""
        if self.kind is RopeKind.LONGROPE and not len(self.short_factor) == len(self.long_factor) == dims // 2:
            raise ConfigError(f"longrope needs {dims // 2} short and long factors (one per frequency of {dims} "
                              f"rotated dims), not {len(self.short_factor)} and {len(self.long_factor)}",
                              "rope_scaling")
        if self.kind is RopeKind.DYNAMIC and dims <= 2:
            raise ConfigError("dynamic RoPE needs more than 2 rotated dims (its base grows as ^dims/(dims-2))",
                              "rope_scaling")

    def __str__(self) -> str:
        shown = f"{self.kind}" + (f"×{self.factor:g}" if self.kind is not RopeKind.LONGROPE else "")
        if self.original_positions is not None:
            shown += f" from {self.original_positions}"
        return shown + (f" cos·sin×{self.attention_factor:.4g}" if self.attention_factor != 1.0 else "")

    @classmethod
    def of(cls, value) -> Optional["RopeScaling"]:
        """A linear factor as older traces store it, a dict as to_dict writes it, or the dataclass itself."""
        if value is None or isinstance(value, RopeScaling):
            return value
        if isinstance(value, dict):
            known = {field.name for field in dataclasses.fields(cls)}
            return cls(**{key: item for key, item in value.items() if key in known})
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"rope_scaling must be a positive factor, not {value!r}", "rope_scaling")
        return None if value == 1 else cls(RopeKind.LINEAR, float(value))


@dataclass(frozen=True)
class LatentWidths(Piece):
    """The widths of multi-head latent attention (DeepSeek-V2, 2024; HF's DeepseekV2/V3Attention; the module is
    model.layers.LatentAttention): keys and values come from one compressed latent per token (kv_a_proj, RMSNorm,
    then kv_b_proj per head), queries from their own optional latent; each head's query and key are `nope_dims`
    unrotated dims then `rope_dims` rotated ones, the rotated key shared by all heads; values are `value_dims` wide."""

    kv_rank: int  # kv_lora_rank: the latent keys and values are made from
    nope_dims: int  # qk_nope_head_dim
    rope_dims: int  # qk_rope_head_dim
    value_dims: int  # v_head_dim
    q_rank: Optional[int] = None  # q_lora_rank; None: the queries are projected from x directly
    latent_eps: float = 1e-6  # the eps of the two latents' RMSNorms (HF builds them with its default, not rms_norm_eps)

    def __post_init__(self):
        for name in ("kv_rank", "nope_dims", "rope_dims", "value_dims", "q_rank"):
            value = getattr(self, name)
            if value is None and name == "q_rank":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"latent attention's {name} must be a positive integer, not {value!r}", "latent")
        if self.rope_dims % 2:
            raise ConfigError(f"RoPE rotates pairs of dims: latent attention's rope_dims must be even, not "
                              f"{self.rope_dims}", "latent")

    @property
    def head_dims(self) -> int:
        """The width of each head's query and key."""
        return self.nope_dims + self.rope_dims

    def __str__(self) -> str:
        query = f"q latent {self.q_rank}, " if self.q_rank is not None else ""
        return f"{query}kv latent {self.kv_rank}, q·k {self.nope_dims}+{self.rope_dims} rope, v {self.value_dims}"


@dataclass(frozen=True)
class ShortConvolution:
    """A token mixer in place of attention: LFM2's gated short convolution (Liquid AI, 2025; HF's Lfm2ShortConv; the
    module is model.short_conv.ShortConvolution). One projection makes three d-wide streams per token, B, C and x;
    B ⊙ x passes a causal depthwise convolution over the last `kernel` tokens (each channel its own filter), and C
    gates what comes out: out_proj(C ⊙ conv(B ⊙ x)). No token sees a later one; padded tokens are zeroed first."""

    kernel: int = 3  # conv_L_cache: the tokens each output reads, itself and the kernel − 1 before it
    bias: bool = False  # conv_bias: biases on the two projections and the convolution

    def __post_init__(self):
        if isinstance(self.kernel, bool) or not isinstance(self.kernel, int) or self.kernel < 1:
            raise ConfigError(f"a short convolution's kernel must be a positive integer, not {self.kernel!r}",
                              "token_mixer")
        if not isinstance(self.bias, bool):
            raise ConfigError(f"a short convolution's bias must be true or false, not {self.bias!r}", "token_mixer")

    def __str__(self) -> str:
        return f"short convolution over {self.kernel} tokens" + (", biased" if self.bias else "")

    mixer: ClassVar[MixerKind] = MixerKind.SHORT_CONV


@dataclass(frozen=True)
class GatedDeltaNet:
    """A token mixer in place of attention: the gated delta rule (Yang, Kautz & Hatamizadeh, "Gated Delta Networks",
    ICLR 2025; HF's Qwen3NextGatedDeltaNet; the module is model.gated_delta.GatedDeltaNet). Each value head keeps a
    [key_dims × value_dims] state S, decayed by exp(g) and corrected toward each token's value at rate β:
    S ← exp(g)·S + β·k(v − Sᵀk)ᵀ, read by the token's query (q, k L2-normalised, q scaled by key_dims^-½). q, k and v
    pass a causal depthwise convolution over the last `kernel` tokens and SiLU first; the output is RMS-normalised
    per head and gated by SiLU(z). No token sees a later one; padded tokens are zeroed first."""

    key_heads: int  # linear_num_key_heads: the q and k heads, each serving value_heads / key_heads value heads
    value_heads: int  # linear_num_value_heads: one state, one β and one decay per value head
    key_dims: int  # linear_key_head_dim
    value_dims: int  # linear_value_head_dim
    kernel: int = 4  # linear_conv_kernel_dim: the tokens the convolution reads, itself and the kernel − 1 before it
    beta_scale: float = 1.0  # β = beta_scale · sigmoid(b): OLMo-Hybrid's 2 (negative eigenvalues allowed), else 1
    norm_eps: Optional[float] = None  # the output norm's eps (OLMo-Hybrid's fixed 1e-5); None: the block's eps

    def __post_init__(self):
        for name in ("key_heads", "value_heads", "key_dims", "value_dims", "kernel"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"a gated delta net's {name} must be a positive integer, not {value!r}",
                                  "token_mixer")
        for name, value in (("beta_scale", self.beta_scale), ("norm_eps", self.norm_eps)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < float("inf")):
                raise ConfigError(f"a gated delta net's {name} must be a positive number, not {value!r}",
                                  "token_mixer")
        if self.value_heads % self.key_heads:
            raise ConfigError(f"a gated delta net's {self.value_heads} value heads must divide evenly among its "
                              f"{self.key_heads} key heads", "token_mixer")

    def __str__(self) -> str:
        scaled = f", β × {self.beta_scale:g}" if self.beta_scale != 1 else ""
        return (f"gated delta rule, {self.key_heads} q·k heads of {self.key_dims}, {self.value_heads} value heads of "
                f"{self.value_dims}, convolution over {self.kernel} tokens{scaled}")

    mixer: ClassVar[MixerKind] = MixerKind.GATED_DELTA


@dataclass(frozen=True)
class Mamba2:
    """A token mixer in place of attention: Mamba-2's selective state space (Dao & Gu, "Transformers are SSMs", ICML
    2024; HF's GraniteMoeHybridMambaLayer; the module is model.mamba2.Mamba2). One projection gives the gate z, the
    stream [x, B, C] and a step size per head; [x, B, C] passes a causal depthwise convolution over the last `kernel`
    tokens and SiLU. Each head's [head_dims × state_dims] state decays by exp(Δ·A) (A = −exp(A_log) < 0, Δ =
    softplus(dt + dt_bias) clamped to `step_limit`) and takes Δ·x Bᵀ at each token; the token reads it with C, plus
    D·x. The output is × SiLU(z), RMS-normalised per group, then projected out. No token sees a later one; padded
    tokens are zeroed before and after the convolution."""

    heads: int  # mamba_n_heads
    head_dims: int  # mamba_d_head: heads × head_dims is the inner width (mamba_expand × d_model)
    state_dims: int  # mamba_d_state: N, the width of B and C
    groups: int = 1  # mamba_n_groups: B and C are shared by heads / groups heads; the gated norm's groups
    kernel: int = 4  # mamba_d_conv
    conv_bias: bool = True  # mamba_conv_bias
    bias: bool = False  # mamba_proj_bias: biases on in_proj and out_proj
    chunk: int = 256  # mamba_chunk_size: tokens per chunk of the scan (changes rounding only)
    step_limit: tuple[float, float] = (0.0, float("inf"))  # time_step_limit: Δ clamped into it

    def __post_init__(self):
        # null: the JSON of an unbounded limit (a --json document writes inf so, and lists it under non_finite)
        object.__setattr__(self, "step_limit", tuple(float("inf") if v is None else float(v) for v in self.step_limit))
        for name in ("heads", "head_dims", "state_dims", "groups", "kernel", "chunk"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"a Mamba-2 mixer's {name} must be a positive integer, not {value!r}", "token_mixer")
        if self.heads % self.groups:
            raise ConfigError(f"a Mamba-2 mixer's {self.heads} heads must divide evenly among its {self.groups} "
                              "groups", "token_mixer")
        low, high = self.step_limit
        if len(self.step_limit) != 2 or not 0 <= low <= high:
            raise ConfigError(f"a Mamba-2 mixer's step_limit must be (low, high) with 0 ≤ low ≤ high, not "
                              f"{self.step_limit!r}", "token_mixer")

    @property
    def inner(self) -> int:
        return self.heads * self.head_dims

    def __str__(self) -> str:
        return (f"Mamba-2, {self.heads} heads of {self.head_dims}, state {self.state_dims}, {self.groups} group"
                f"{'s' if self.groups > 1 else ''}, convolution over {self.kernel} tokens")

    mixer: ClassVar[MixerKind] = MixerKind.MAMBA2


@dataclass(frozen=True)
class Experts(Piece):
    """The feed-forward as a mixture of experts (the module is model.moe.MixtureOfExperts): a router sends each token
    to `experts_per_token` of `n_experts` gated FFNs, each d_ff wide, and sums their outputs by the router's weights;
    a shared expert every token passes may join them. The field names are the settings' names in every message and
    in a family's description of its file (sources/families), so that an error is said in the file's keys."""

    n_experts: int
    experts_per_token: int = 2
    renormalise_top_k: bool = True  # the chosen experts' probabilities rescaled to sum to 1 (Qwen's norm_topk_prob)
    shared_expert_d_ff: Optional[int] = None  # Qwen2-MoE: an expert every token passes, gated by sigmoid(w·x)
    shared_expert_gated: bool = True  # the shared expert's sigmoid gate (Qwen2-MoE); DeepSeek's has none
    router: RouterKind = RouterKind.SOFTMAX  # how the router's logits become each token's experts and weights
    expert_groups: Optional[int] = None  # DeepSeek: the experts split into this many groups (n_group)
    groups_per_token: Optional[int] = None  # DeepSeek: a token's experts come from its best groups only (topk_group)
    routed_scaling: float = 1.0  # DeepSeek: the routed experts' weights multiplied by this (routed_scaling_factor)
    choice_bias: bool = False  # DeepSeek-V3: a bias per expert added to the scores for the choice only
    router_bias: bool = False  # a bias on the router's logits (gpt-oss)

    def __post_init__(self):
        object.__setattr__(self, "router", _as_enum(RouterKind, self.router, "router"))
        for name in ("n_experts", "experts_per_token", "shared_expert_d_ff"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ConfigError(f"{name} must be a positive integer, not {value!r}", name)
        if self.experts_per_token > self.n_experts:
            raise ConfigError(f"each token cannot go to {self.experts_per_token} of {self.n_experts} experts",
                              "experts_per_token")
        self._validate_groups()

    def _validate_groups(self) -> None:
        biased = self.router is RouterKind.SOFTMAX_BIASED
        if biased and not self.choice_bias:
            raise ConfigError("the softmax_biased router (ERNIE-4.5's) chooses by p + bias: it needs choice_bias",
                              "choice_bias")
        if not self.router.grouped:
            if self.expert_groups is not None or self.groups_per_token is not None or (self.choice_bias and not biased):
                raise ConfigError("expert groups and a choice bias belong to DeepSeek's routers (a choice bias also to "
                                  "softmax_biased): set router", "router")
            return
        groups, kept = self.expert_groups, self.groups_per_token
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (groups, kept)) or \
                self.n_experts % groups or kept > groups:
            raise ConfigError(f"a grouped router needs expert_groups dividing the {self.n_experts} experts and "
                              f"groups_per_token ≤ expert_groups, not {groups!r} and {kept!r}", "expert_groups")
        if self.experts_per_token > kept * (self.n_experts // groups):
            raise ConfigError(f"{self.experts_per_token} experts per token cannot come from {kept} groups of "
                              f"{self.n_experts // groups}", "groups_per_token")
        if self.router is RouterKind.SIGMOID_GROUPED and self.n_experts // groups < 2:
            raise ConfigError("DeepSeek-V3's router scores a group by its two best experts: a group needs two",
                              "expert_groups")

    def __str__(self) -> str:
        said = f"top-{self.experts_per_token} of {self.n_experts}" + (", renormalised" if self.renormalise_top_k else "")
        if self.shared_expert_d_ff is not None:
            said += f", shared {self.shared_expert_d_ff} {'gated' if self.shared_expert_gated else 'ungated'}"
        unusual = [f"{field.name}={_plain(getattr(self, field.name))}" for field in dataclasses.fields(self)
                   if field.name in ROUTER_SETTINGS and getattr(self, field.name) != field.default]
        return said + "".join(f" {setting}" for setting in unusual)


EXPERT_FIELDS = tuple(field.name for field in dataclasses.fields(Experts))
# Said in an Experts' str only where not their default: how the router chooses
ROUTER_SETTINGS = ("router", "expert_groups", "groups_per_token", "routed_scaling", "choice_bias", "router_bias")


def gathered(settings: dict, current: Optional[Experts] = None) -> dict:
    """`settings` with the expert settings a family writes one by one (n_experts, router, …) gathered into one
    `experts` piece, over `current` where some are given: n_experts None makes the layer dense (its other expert
    settings, resets, are dropped); a setting without any experts to set is refused, naming it."""
    flat = {key: settings[key] for key in EXPERT_FIELDS if key in settings}
    if not flat:
        return settings
    rest = {key: value for key, value in settings.items() if key not in flat}
    if "n_experts" in flat and flat["n_experts"] is None:
        stray = [key for key in ("shared_expert_d_ff",) if flat.get(key) is not None]
        if stray:
            raise ConfigError("a shared expert belongs to a mixture of experts: set n_experts", "n_experts")
        return {**rest, "experts": None}
    base = dataclasses.asdict(current) if current is not None else {}
    if "n_experts" not in {**base, **flat}:
        raise ConfigError(f"{', '.join(flat)} belong to a mixture of experts: set n_experts", "n_experts")
    return {**rest, "experts": Experts(**{**base, **flat})}


def _positive_number(value, name: str, field: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ConfigError(f"{name} must be a positive number, not {value!r}", field)


@dataclass(frozen=True)
class QueryTemperature(Piece):
    """Llama-4's NoPE layers sharpen later queries (HF's Llama4TextAttention with attn_temperature_tuning): each
    query multiplied by 1 + scale·ln(1 + ⌊(position + 1)/floor⌋), its floor_scale and attn_scale."""

    floor: int
    scale: float = 0.1

    def __post_init__(self):
        if isinstance(self.floor, bool) or not isinstance(self.floor, int) or self.floor < 1:
            raise ConfigError(f"the query temperature's floor must be a positive integer, not {self.floor!r}",
                              "temperature")
        # any finite scale: HF computes every one (before it was a piece, the scale was not checked at all)
        if isinstance(self.scale, bool) or not isinstance(self.scale, (int, float)) or not math.isfinite(self.scale):
            raise ConfigError(f"the query temperature's scale must be a finite number, not {self.scale!r}",
                              "temperature")

    def __str__(self) -> str:
        return f"1 + {self.scale:g}·ln(1 + ⌊(i + 1)/{self.floor}⌋)"


@dataclass(frozen=True)
class GLUClamp(Piece):
    """gpt-oss's clamped SwiGLU (ffn swiglu_clamped; HF's GptOssExperts): the gate clamped above at `limit`, the up
    projection to ±`limit`, the gate's sigmoid(α·g); its swiglu_limit and swiglu_alpha."""

    limit: float = 7.0
    alpha: float = 1.702

    def __post_init__(self):
        _positive_number(self.limit, "the clamped GLU's limit", "glu_clamp")
        _positive_number(self.alpha, "the clamped GLU's alpha", "glu_clamp")

    def __str__(self) -> str:
        return f"limit {self.limit:g}, alpha {self.alpha:g}"


@dataclass(frozen=True)
class AttentionParts(Piece):
    """What a few families add to softmax(q·kᵀ·scale + mask)·v, each off by default: Gemma-2's cap on the scores,
    Llama-4's chunks and query temperature, gpt-oss's sinks. A family writes them one by one (attn_softcap,
    attention_chunk, temperature, attn_sinks: ATTENTION_PART_KEYS), gathered into this piece."""

    softcap: Optional[float] = None  # scores become cap·tanh(s/cap) before the mask (Gemma-2)
    chunk: Optional[int] = None  # the tokens split into chunks of C: a query sees only its own chunk (Llama-4)
    temperature: Optional[QueryTemperature] = None  # Llama-4's NoPE layers: later queries sharpened
    sinks: bool = False  # a learned logit per head that joins every softmax and takes weight from the keys (gpt-oss)

    def __post_init__(self):
        object.__setattr__(self, "temperature", QueryTemperature.of(self.temperature))
        if self.softcap is not None:
            _positive_number(self.softcap, "attn_softcap", "attn_softcap")
        if self.chunk is not None and (isinstance(self.chunk, bool) or not isinstance(self.chunk, int)
                                       or self.chunk < 1):
            raise ConfigError(f"attention_chunk {self.chunk!r} needs a positive width", "attention_chunk")
        if not isinstance(self.sinks, bool):
            raise ConfigError(f"attn_sinks must be true or false, not {self.sinks!r}", "attn_sinks")
        if self.temperature is not None and not isinstance(self.temperature, QueryTemperature):
            raise ConfigError(f"temperature must be a query temperature, not {self.temperature!r}", "temperature")

    def __str__(self) -> str:
        parts = [f"softcap {self.softcap:g}" if self.softcap is not None else "",
                 f"chunks of {self.chunk}" if self.chunk is not None else "",
                 f"query temperature {self.temperature}" if self.temperature is not None else "",
                 "sinks" if self.sinks else ""]
        return ", ".join(part for part in parts if part)


NO_ATTENTION_PARTS = AttentionParts()
# the block settings a family writes one by one, and the AttentionParts field each is gathered into
ATTENTION_PART_KEYS = {"attn_softcap": "softcap", "attention_chunk": "chunk", "temperature": "temperature",
                       "attn_sinks": "sinks"}


def gathered_attention(settings: dict, current: Optional[AttentionParts] = None) -> dict:
    """`settings` with the attention parts written one by one gathered into one `attention` piece, over `current`
    (None where every part is off)."""
    flat = {ATTENTION_PART_KEYS[key]: settings[key] for key in ATTENTION_PART_KEYS if key in settings}
    if not flat:
        return settings
    rest = {key: value for key, value in settings.items() if key not in ATTENTION_PART_KEYS}
    base = {field.name: getattr(current, field.name) for field in dataclasses.fields(AttentionParts)} \
        if current is not None else {}
    parts = AttentionParts(**{**base, **flat})
    return {**rest, "attention": None if parts == NO_ATTENTION_PARTS else parts}


@dataclass(frozen=True)
class QKNorm(Piece):
    """An RMS norm on the queries and the keys on their way to the scores (Dehghani et al. 2023): over each head
    (Qwen3) or all heads at once, before the split (OLMo-2); before RoPE, or after it (Hunyuan's query/key_layernorm,
    Llama-4's); with a learned gain, or none (Llama-4's L2 norm, q / RMS(q))."""

    span: QKSpan = QKSpan.HEAD
    after_rope: bool = False
    gain: bool = True

    def __post_init__(self):
        object.__setattr__(self, "span", _as_enum(QKSpan, self.span, "qk_norm"))
        for name in ("after_rope", "gain"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"the QK-norm's {name} must be true or false, not {getattr(self, name)!r}",
                                  "qk_norm")
        if self.after_rope and self.span is QKSpan.ALL_HEADS:
            raise ConfigError("a QK-norm over all heads reads the projection before the split into heads, so before "
                              "RoPE: after_rope needs span head", "qk_norm")

    @classmethod
    def of(cls, value):
        """The piece, its dict, None, or a bool: True is the common one (per head, before RoPE, a gain: Qwen3's)."""
        if isinstance(value, bool):
            return cls() if value else None
        if value is None or isinstance(value, cls):
            return value
        try:
            return cls(**value)
        except TypeError:
            raise ConfigError(f"qk_norm must be true, false or a QKNorm (span, after_rope, gain), not {value!r}",
                              "qk_norm") from None

    def __str__(self) -> str:
        span = "over all heads" if self.span is QKSpan.ALL_HEADS else "per head"
        return (f"RMSNorm {span}, {'after' if self.after_rope else 'before'} RoPE"
                + ("" if self.gain else ", no gain"))


TokenMixer = Union[ShortConvolution, GatedDeltaNet, Mamba2]
TOKEN_MIXERS = {spec.mixer: spec for spec in (ShortConvolution, GatedDeltaNet, Mamba2)}


def parallel_of(value, one_norm: bool = False) -> Parallel:
    """The parallel residual's setting: a Parallel, its string, or a bool (True: two norms, GPT-NeoX's
    use_parallel_residual); `one_norm`, an older trace's flag for Cohere's one norm."""
    if isinstance(value, bool):
        return (Parallel.ONE_NORM if one_norm else Parallel.TWO_NORMS) if value else Parallel.OFF
    return _as_enum(Parallel, value, "parallel_residual")


def token_mixer_of(value) -> Optional[TokenMixer]:
    """A mixer spec, or the dict to_dict writes of one (its kind under `mixer`; a trace written before there were
    two kinds holds a short convolution's fields alone)."""
    if not isinstance(value, dict):
        return value
    fields = dict(value)
    kind = fields.pop("mixer", MixerKind.SHORT_CONV.value)
    try:
        return TOKEN_MIXERS[MixerKind(kind)](**fields)
    except (ValueError, TypeError) as error:
        raise ConfigError(f"token_mixer {value!r} is no mixer blocktrace knows ({', '.join(MixerKind.values())}): "
                          f"{error}", "token_mixer") from None


@dataclass(frozen=True)
class BlockConfig:
    d_model: int = 16  # width of the residual stream (hidden size)
    n_heads: int = 4  # attention heads; d_model must divide evenly among them
    d_ff: Optional[int] = None  # FFN hidden width; None means 4·d_model, as in GPT-2
    norm: Norm = Norm.LAYERNORM  # which normalisation norm1/norm2 use
    ffn: FFNKind = FFNKind.GELU_TANH  # FFN nonlinearity; GPT-2 uses the tanh GELU
    placement: Placement = Placement.PRE  # where the norms sit relative to the residual adds
    causal: bool = True  # decoder-style mask: a token sees only itself and earlier tokens
    eps: float = 1e-5  # added to the variance inside the norm's square root
    bias: bool = True  # biases on every linear layer (and LayerNorm's shift)
    n_layers: int = 1  # blocks in the stack: DeepNorm's α = (2N)^¼ and β = (8N)^-¼ depend on it
    kv_heads: Optional[int] = None  # grouped-query attention (Llama): key/value heads; None: n_heads
    head_size: Optional[int] = None  # per-head width when not d_model / n_heads (Llama's head_dim)
    rope_theta: Optional[float] = None  # rotary position embeddings' base (Llama); None: no RoPE
    rope_scaling: Optional[RopeScaling] = None  # RoPE stretched past the trained context; None: plain RoPE
    rotary_fraction: float = 1.0  # share of each head's dims that RoPE rotates (GPT-NeoX's rotary_pct)
    rope_interleaved: bool = False  # RoPE turns adjacent pairs (x0, x1), (x2, x3)… (Cohere), not the two halves (Llama)
    nope: bool = False  # a layer of a RoPE model that leaves q and k unrotated (SmolLM3's, EXAONE-4's NoPE layers)
    attn_bias: Optional[bool] = None  # biases of q, k, v and the output projection; None: as `bias`
    qkv_bias: Optional[bool] = None  # biases of q, k and v only (Qwen2); None: as attn_bias
    qk_norm: Optional[QKNorm] = None  # RMS norms on q and k on their way to the scores; True: Qwen3's (QKNorm())
    norm_offset: float = 0.0  # RMSNorm gain is (offset + w), computed in float32 (Gemma: 1)
    norm_gain_float32: bool = False  # RMSNorm multiplies its gain in float32, then casts (OLMo-2); else after (Llama)
    attn_scale: Optional[float] = None  # multiplies q·k; None: 1/√head_dim (Gemma-2: query_pre_attn_scalar^-½)
    sliding_window: Optional[int] = None  # a query sees only the last W keys (itself included)
    attention: Optional[AttentionParts] = None  # a few families' own parts of the attention (caps, chunks, sinks)
    # attn and ffn side by side, both reading x (GPT-NeoX: two norms; Cohere: one); True: two norms
    parallel_residual: Parallel = Parallel.OFF
    residual_multiplier: float = 1.0  # multiplies each sublayer's output in its residual add (Granite): x + m·f(x)
    experts: Optional[Experts] = None  # a mixture of experts in place of the FFN (Mixtral, Qwen-MoE, DeepSeek, …)
    glu_clamp: Optional[GLUClamp] = None  # ffn swiglu_clamped's clamp (gpt-oss's); None there: GLUClamp()'s
    latent: Optional[LatentWidths] = None  # DeepSeek's multi-head latent attention in place of q/k/v projections
    # Qwen3-Next's gated attention: each head's output multiplied by sigmoid(gate_proj(x)) before out_proj
    attn_output_gate: bool = False
    # a token mixer in place of attention (LFM2's short convolution, a gated delta net); None: attention, as every
    # other field says
    token_mixer: Optional[TokenMixer] = None

    def __post_init__(self):
        set_field = object.__setattr__  # frozen: normalise fields once, here
        set_field(self, "norm", _as_enum(Norm, self.norm, "norm"))
        set_field(self, "ffn", _as_enum(FFNKind, self.ffn, "ffn"))
        set_field(self, "placement", _as_enum(Placement, self.placement, "placement"))
        set_field(self, "parallel_residual", parallel_of(self.parallel_residual))
        set_field(self, "rope_scaling", RopeScaling.of(self.rope_scaling))
        set_field(self, "experts", Experts.of(self.experts))
        set_field(self, "latent", LatentWidths.of(self.latent))
        set_field(self, "qk_norm", QKNorm.of(self.qk_norm))
        set_field(self, "attention", AttentionParts.of(self.attention))
        set_field(self, "glu_clamp", GLUClamp.of(self.glu_clamp))
        if self.ffn is FFNKind.SWIGLU_CLAMPED and self.glu_clamp is None:
            set_field(self, "glu_clamp", GLUClamp())
        set_field(self, "token_mixer", token_mixer_of(self.token_mixer))
        if self.d_ff is None and isinstance(self.d_model, int):
            set_field(self, "d_ff", 4 * self.d_model)
        self.validate()

    def validate(self) -> None:
        self._validate_sizes()
        if not self.eps > 0:
            raise ConfigError(f"eps must be positive, not {self.eps!r}", "eps")
        self._validate_attention()
        self._validate_experts()
        self._validate_norms()
        if self.latent is not None:
            self._validate_latent()
        self._validate_mixer()
        self._validate_numbers()
        self._validate_wiring()

    def _validate_sizes(self) -> None:
        """Widths and counts positive integers; heads that divide the model and pair up for RoPE."""
        for name in ("d_model", "n_heads", "d_ff", "n_layers", "kv_heads", "head_size"):
            value = getattr(self, name)
            if value is None and name in ("kv_heads", "head_size"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, not {value!r}", name)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"heads {self.n_heads} are not divisible by key/value heads {self.n_kv_heads}", "kv_heads")
        if self.rope_theta is not None and self.rope_theta <= 0:
            raise ConfigError(f"rotary embeddings need a positive theta, not {self.rope_theta}", "rope_theta")
        if self.rope_theta is not None and self.head_dim % 2:  # the fault is the head size, not theta
            raise ConfigError(f"rotary embeddings rotate pairs of dimensions: the head size must be even, not "
                              f"{self.head_dim}", "head_size" if self.head_size is not None else "heads")
        if self.head_size is None and self.d_model % self.n_heads:
            raise ConfigError(f"d_model {self.d_model} is not divisible by heads {self.n_heads}: "
                              f"pick heads among {_divisors(self.d_model)}", "n_heads")

    def _validate_norms(self) -> None:
        """Gemma's (offset + w) gain is RMSNorm's."""
        if self.norm_offset and self.norm is not Norm.RMSNORM:
            raise ConfigError("a norm gain of (offset + w), Gemma's, is RMSNorm's: a LayerNorm would not share it",
                              "norm")

    def _validate_mixer(self) -> None:
        """A token mixer replaces causal attention; the output gate and NoPE are attention's own."""
        if self.token_mixer is not None and (not self.causal or self.latent is not None):
            raise ConfigError(f"the {self.token_mixer.mixer} token mixer is causal and replaces attention: it "
                              "needs causal and no latent attention", "token_mixer")
        if self.attn_output_gate and (self.token_mixer is not None or self.latent is not None):
            raise ConfigError("attn_output_gate gates attention's heads: a token mixer or latent attention has none "
                              "of its own", "attn_output_gate")
        if self.nope and self.rope_theta is not None:
            raise ConfigError("a NoPE layer has no rotary embedding: nope needs rope_theta None", "nope")

    def _validate_numbers(self) -> None:
        """The multiplier a positive finite number; a clamp only where the FFN clamps."""
        _positive_number(self.residual_multiplier, "residual_multiplier", "residual_multiplier")
        if self.glu_clamp is not None and self.ffn is not FFNKind.SWIGLU_CLAMPED:
            raise ConfigError(f"glu_clamp is ffn swiglu_clamped's: --ffn {self.ffn} clamps nothing", "glu_clamp")

    def _validate_wiring(self) -> None:
        if self.parallel_residual is not Parallel.OFF and self.placement is not Placement.PRE:
            raise ConfigError("a parallel residual reads both branches from the stream before the norms: it needs "
                              "Pre-LN wiring", "placement")

    def _validate_latent(self) -> None:
        """Latent attention's heads: each as wide as its unrotated and rotated dims, each its own key (no grouping),
        RoPE on the rotated dims only (no QK-norm, window or sinks: no model combines them with it)."""
        if self.head_dim != self.latent.head_dims or self.n_kv_heads != self.n_heads:
            raise ConfigError(f"latent attention needs head_size {self.latent.head_dims} (nope + rope dims) and a key "
                              f"per head, not {self.head_dim} and {self.n_kv_heads} key heads", "latent")
        if self.rope_theta is None or self.qk_norm or self.attention_parts.sinks or self.rotary_fraction != 1.0:
            raise ConfigError("latent attention rotates its rope dims with RoPE and has no QK-norm, sinks or partial "
                              "rotary of its own", "latent")

    def _validate_attention(self) -> None:
        if not 0 < self.rotary_fraction <= 1 or (self.rope_theta is not None and self.rotary_dims % 2):
            raise ConfigError(f"rotary_fraction {self.rotary_fraction} must rotate an even number of each head's "
                              f"{self.head_dim} dims", "rotary_fraction")
        if self.rope_theta is not None and self.rope_scaling is not None:
            self.rope_scaling.check_dims(self.rotary_dims)
        if self.attn_scale is not None and not self.attn_scale > 0:
            raise ConfigError(f"attn_scale must be positive, not {self.attn_scale!r}", "attn_scale")
        for name, value in (("sliding_window", self.sliding_window), ("attention_chunk", self.attention_parts.chunk)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1
                                      or not self.causal):
                raise ConfigError(f"{name} {value!r} needs a positive width and causal attention", name)

    def _validate_experts(self) -> None:
        if self.experts is not None and not self.ffn.gated:
            raise ConfigError("blocktrace's experts are gated FFNs (SwiGLU, as Mixtral's, Qwen's and OLMoE's): "
                              f"--ffn {self.ffn} has no gate", "ffn")

    @property
    def attention_parts(self) -> AttentionParts:
        """The attention's added parts; none (NO_ATTENTION_PARTS) where the block has none."""
        return self.attention or NO_ATTENTION_PARTS

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.n_heads

    @property
    def rotary_dims(self) -> int:
        """The leading dims of each head that RoPE rotates (all of them but for partial rotary)."""
        if self.latent is not None:
            return self.latent.rope_dims
        return int(self.head_dim * self.rotary_fraction)

    @property
    def attention_bias(self) -> bool:
        return self.bias if self.attn_bias is None else self.attn_bias

    @property
    def projection_bias(self) -> bool:
        """Biases of q, k and v."""
        return self.attention_bias if self.qkv_bias is None else self.qkv_bias

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    @property
    def wiring(self) -> Wiring:
        """Which step reads which (blocktrace.wiring)."""
        return wiring_of(self.placement, self.parallel_residual)

    @property
    def sandwich(self) -> bool:
        return self.placement is Placement.SANDWICH

    @property
    def post_norm(self) -> bool:
        """Post-LN and DeepNorm normalise the stream after each residual add; the others never do."""
        return self.wiring.stream_normalised

    @property
    def residual_scale(self) -> float:
        """α multiplying the stream in each residual add: (2N)^¼ for DeepNorm, else 1."""
        return (2 * self.n_layers) ** 0.25 if self.placement is Placement.DEEPNORM else 1.0

    @property
    def deepnorm_beta(self) -> float:
        """β scaling the initial FFN, V and O weights under DeepNorm: (8N)^-¼."""
        return (8 * self.n_layers) ** -0.25

    def replace(self, **changes) -> "BlockConfig":
        return dataclasses.replace(self, **changes)

    def replace_settings(self, settings: dict) -> "BlockConfig":
        """replace, with a family's settings as it writes them: its expert settings and attention parts one by one
        (gathered)."""
        return self.replace(**gathered_attention(gathered(settings, self.experts), self.attention))

    def to_dict(self) -> dict:
        """Plain JSON-ready values (enums as their strings)."""
        plain = {field.name: _plain(getattr(self, field.name)) for field in dataclasses.fields(self)}
        if self.token_mixer is not None:  # its kind, so that from_dict builds the same spec
            plain["token_mixer"]["mixer"] = self.token_mixer.mixer.value
        return plain

    @classmethod
    def from_dict(cls, data: dict) -> "BlockConfig":
        """The config to_dict wrote; a trace written before the experts were one piece holds their settings one by
        one (n_experts, router, …), one written before the attention's parts were one piece its attn_softcap,
        attention_chunk, temperature and attn_sinks: gathered, not dropped (dropped, an MoE block would be read back
        as dense)."""
        data = gathered(data) if "experts" not in data else data
        data = _pieces_of_older_traces(data)
        data = gathered_attention(data) if "attention" not in data else data
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


def _pieces_of_older_traces(data: dict) -> dict:
    """A trace written before the QK-norm, the query temperature, the GLU clamp and the parallel residual's norms
    were pieces holds their settings one by one: gathered (the temperature's floor given, the clamp's with the clamped FFN), else dropped."""
    data = dict(data)
    if "one_norm" in data:
        data["parallel_residual"] = parallel_of(data.get("parallel_residual", False), data.pop("one_norm"))
    whole, after_rope, l2 = (data.pop(name, False) for name in ("qk_norm_whole", "qk_norm_after_rope", "qk_l2_norm"))
    if data.get("qk_norm") is True or l2:  # Llama-4's L2 norm was its own flag: after RoPE, no gain
        data["qk_norm"] = QKNorm(QKSpan.ALL_HEADS if whole else QKSpan.HEAD, after_rope or l2, gain=not l2)
    floor, scale = data.pop("temperature_floor", None), data.pop("temperature_scale", None)
    if floor is not None and "temperature" not in data:
        data["temperature"] = QueryTemperature(floor, *([] if scale is None else [scale]))
    limit, alpha = data.pop("glu_limit", None), data.pop("glu_alpha", None)
    if data.get("ffn") == FFNKind.SWIGLU_CLAMPED.value and "glu_clamp" not in data:
        data["glu_clamp"] = GLUClamp(**{key: value for key, value in (("limit", limit), ("alpha", alpha))
                                        if value is not None})
    return data


def _plain(value):
    if isinstance(value, Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {field.name: _plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return list(value) if isinstance(value, tuple) else value


HINTED_HEADS = 128  # the head counts a divisor hint lists: enough for any real model, bounded for any width


def _divisors(n: int) -> str:
    """The head counts up to HINTED_HEADS that divide n (bounded: n may be any integer a user typed)."""
    found = [str(k) for k in range(1, min(n, HINTED_HEADS) + 1) if n % k == 0]
    return ", ".join(found) + (f" (the divisors up to {HINTED_HEADS})" if n > HINTED_HEADS else "")
