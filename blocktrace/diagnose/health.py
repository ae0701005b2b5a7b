"""Health checks: named findings with cited thresholds and a likely cause, read off the traces.

Each check looks at what the tracer recorded (step statistics, the attention summary and,
with `checks=True`, the per-step probes and the measured behaviour), at the gradients of
--grad, and for a checkpoint at the model's own loss and its weights. Every check is judged
on both sides: an ERROR means broken or diverging, and a healthy trained model should raise
none, nor any WARNING. Signals that trained models show in health — massive activations,
sharp positional heads, large updates in early layers, dead ReLU units up to the levels
reported in trained OPT — are INFO: context for a diagnosis, never a verdict on their own.
docs/check.md lists every check, its threshold, source, level and cause.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from blocktrace.phrases import phrase
from blocktrace.diagnose.checks import Cause, Finding, Flag, Scope, check, detectors, finding
from blocktrace.diagnose.loss import SHIFT_MIN_POSITIONS
from blocktrace.diagnose.audit import STUCK_TOGETHER
from blocktrace.diagnose.weights import tensor_kind
from blocktrace.tracing.behaviour import NormKind
from blocktrace.tracing.probes import MASSIVE_ABS
from blocktrace.vocab import Level


# Thresholds, each defined once and cited in CHECKS.
LOGIT_WARNING, LOGIT_ERROR = 100.0, 1e4  # Wortsman et al. 2023
# a logit past LOGIT_WARNING judged as growing where it is at least this multiple of the same layer's at the record
# before (or where there is none): one that has settled is a sharp head the model learned, not an instability
LOGIT_GROWING = 1.2
SHARP_ENTROPY = 0.1  # a head below this share of uniform attention's entropy is sharp
POSITIONAL = 0.5  # a sharp head putting this much weight on one position (first, self, previous) is positional
DEAD_INFO, DEAD_ERROR = 0.7, 0.95  # Voita et al. 2023: > 70% dead units in healthy trained OPT layers
DEAD_MIN_TOKENS = 64  # with fewer tokens a unit can look dead by chance
RESIDUAL_MISMATCH = 1e-3
UPDATE_SMALL, UPDATE_LARGE = 1e-3, 10.0
MASSIVE_RATIO = 1000.0
STREAM_GROWTH_ERROR = 100.0  # ‖x‖²/d growth past Xiong et al.'s 1 + 3l/2 bound, ×
UNIT_STREAM = 1.0  # ‖x‖²/d of the stream Xiong et al.'s bound starts from: growth is measured from at least this
WEIGHT_GAIN_ERROR = 10.0  # std·√fan_in of a weight matrix: ≈ 0.5–1.5 at the usual inits
SIBLING_RATIO, MIN_SIBLINGS = 10.0, 3  # a matrix an order of magnitude off the same matrix of the other layers
FLOAT16_MAX = 65504.0
LOSS_MARGIN = 0.5  # nats above log V: worse than predicting every token equally likely
COPIED = math.log(2)  # a loss at the input token below this puts most of the mass on it: copying learned
LOG_Z_ERROR = 1e3
GRADIENT_RATIO = 1e3
COLLAPSE_WARNING, COLLAPSE_ERROR = 0.5, 0.9  # share of the way from a balanced router (k) to all tokens on k (E)
MIN_SLOTS_PER_EXPERT = 12  # below this many token slots per expert, an unbalanced or empty expert can be chance
ROUTER_LOGIT_WARNING = 64.0  # bf16 rounds a logit this large to a step of 0.5

@dataclass
class ModelEvidence:
    """What a whole-model check adds to the traces: the loss, the weights, how the model is stored."""

    loss: Optional[object] = None  # diagnose.loss.LossReport
    weights: list[dict] = field(default_factory=list)  # per traced layer: matrix -> {std, norm, fan_in}
    first_layer: int = 0
    n_layers: int = 1
    stored_dtype: str = "F32"
    config: Optional[object] = None  # the checkpoint's BlockConfig
    step: Optional[int] = None  # the training step the checkpoint holds, when its name or trainer_state says
    # per optimizer group and parameter dtype (a Watch given its optimizer): {"dtype", "eps", "eps_in_dtype"}
    optimizer: list[dict] = field(default_factory=list)
    # the weights of a model being trained (a Watch), not of a checkpoint read back: how they changed is the
    # dynamics' to judge (diagnose.dynamics), with the training's own evidence beside them
    in_training: bool = False


# --- what a traced step shows ----------------------------------------------------------------------

@check(Scope.STEP, "non_finite",
       "any NaN or Inf in a step's output", "IEEE 754; the first step in execution order is the origin",
       "this step produced NaN/Inf; if its inputs were finite, the fault is inside this step — inside a 32-bit "
       "attention, its mask's arithmetic (0 · −inf, a row with every key at −inf): softmax of finite scores is finite",
       Cause.LEARNING_RATE)
def _non_finite(record, layer, evidence) -> list[Finding]:
    stats, finite_inputs = record.stats, record.probe.inputs_finite
    if not (stats.nan or stats.inf):
        return []
    inputs = "" if finite_inputs is None else phrase("; inputs finite: {finite}", finite=finite_inputs)
    detail = phrase("{nan} NaN, {inf} Inf{inputs}", nan=stats.nan, inf=stats.inf, inputs=inputs)
    cause = Cause.PRECISION if evidence.stored_dtype in ("F16", "BF16") else None
    if cause is None and _born_in_attention(record) and _weights_finite(evidence, layer):
        cause = Cause.MASK
    return [finding(Level.ERROR, record.name, layer, stats.nan + stats.inf, detail, cause)]


def _weights_finite(evidence, layer: Optional[int]) -> bool:
    """Whether the layer's weight matrices are finite (True where they were not read): a NaN weight makes a NaN
    step from finite inputs by itself — weights_non_finite's, not the mask's."""
    index = (layer or 0) - evidence.first_layer
    matrices = evidence.weights[index] if 0 <= index < len(evidence.weights) else {}
    return all(math.isfinite(entry["norm"]) for entry in matrices.values())


def _born_in_attention(record) -> bool:
    """A non-finite attention output from finite inputs, computed in 32 bits or more: scores of finite q and k are
    finite there and a softmax of finite scores is too, so only the mask's arithmetic makes it (0 · −inf, a row
    whose every key is −inf). In 16 bits the scores themselves can overflow: precision's."""
    finite = record.probe.inputs_finite
    return record.name == "attn" and bool(finite) and all(finite) and "16" not in str(record.dtype)


@check(Scope.STEP, "precision_overflow",
       f"a float16 checkpoint whose activations exceed float16's largest value, {FLOAT16_MAX:g}",
       "IEEE 754 half precision", "in float16 these values become Inf: the training run overflowed",
       Cause.PRECISION)
def _precision_overflow(record, layer, evidence) -> list[Finding]:
    stats = record.stats
    if stats.nan or stats.inf or evidence.stored_dtype != "F16" or not stats.absmax > FLOAT16_MAX:
        return []  # a non-finite step is non_finite's
    return [finding(Level.ERROR, record.name, layer, stats.absmax,
                    phrase("max |x| {absmax:.4g} > {FLOAT16_MAX:g} in a float16 checkpoint", absmax=stats.absmax,
                           FLOAT16_MAX=FLOAT16_MAX))]


@check(Scope.STEP, "norm_not_normalising",
       "rescaling each token by its own factor in [0.5, 4] changes the norm's output by "
       "more than 1% (relative rms): measured on the module, whatever its class",
       "definition of LayerNorm / RMSNorm: both are invariant to rescaling a token (Ba et al. 2016; "
       "Zhang & Sennrich 2019)",
       "the norm step does not normalise each token: it is missing, replaced, or applied over the wrong axis",
       Cause.NORM)
def _norm_not_normalising(record, layer, evidence) -> list[Finding]:
    norm = record.probe.norm
    if norm is None or norm.kind is not NormKind.NONE:
        return []
    return [finding(Level.ERROR, record.name, layer, norm.scale_error,
                    phrase("rescaling each token changed the output by {scale_error:.3g} (relative rms)",
                           scale_error=norm.scale_error))]


@check(Scope.STEP, "norm_backward_not_its_derivative",
       "the gradient the norm passes back leans along a direction its forward is blind to — the token itself "
       "(both norms) or (1, …, 1) (LayerNorm) — with |cos| above the probe's tolerance (1e-2 in float32): measured "
       "on the module, with two backward passes over 8 probe tokens",
       "invariant: a function unchanged by rescaling its input has a gradient orthogonal to that input (Euler's "
       "theorem for degree-0 homogeneous functions); one unchanged by a shift has a gradient summing to zero "
       "(Ba et al. 2016; Zhang & Sennrich 2019 define the norms by these invariances)",
       "the norm normalises in its forward but its backward is not the forward's derivative: its mean or variance "
       "is detached from the graph (x.mean().detach(), x.var().detach(), .data) or a hand-written backward is "
       "wrong, so every gradient below it is wrong: a cut in the gradient's path (the forward is right)",
       Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("compute the norm's statistics inside the graph (no .detach(), .data or .item() on the mean or "
                     "variance), or use torch.nn.LayerNorm / torch.nn.RMSNorm"))
def _norm_backward_not_its_derivative(record, layer, evidence) -> list[Finding]:
    norm = record.probe.norm
    if norm is None or norm.kind is NormKind.NONE or not norm.backward_broken:
        return []
    return [finding(Level.ERROR, record.name, layer, norm.gradient_error,
                    phrase("the norm's input gradient has |cos| {gradient_error:.3g} with a direction its output "
                           "ignores", gradient_error=norm.gradient_error))]


GAIN_LOW, GAIN_HIGH = 0.1, 10.0  # a norm's effective gain (rms) outside this band is far from its start at 1


def gain_extreme(gain_rms: float) -> bool:
    return not GAIN_LOW <= gain_rms <= GAIN_HIGH


@check(Scope.STEP, "norm_gain_extreme",
       f"rms of the effective gain (g, or 1 + w for Gemma) < {GAIN_LOW:g} or > {GAIN_HIGH:g}, measured on the "
       "module (info: trained models have such gains)", "rule of thumb: gains start at 1",
       "the norm's learned gain has drifted far from 1, rescaling everything downstream", Cause.LEARNING_RATE)
def _norm_gain_extreme(record, layer, evidence) -> list[Finding]:
    norm = record.probe.norm
    if norm is None or norm.kind is NormKind.NONE or norm.gain_rms is None or not gain_extreme(norm.gain_rms):
        return []
    return [finding(Level.INFO, record.name, layer, norm.gain_rms,
                    phrase("rms of the effective gain {gain_rms:.3g}", gain_rms=norm.gain_rms))]


@check(Scope.ATTENTION, "causal_leak",
       "future_weight_sum > 1e-6 in a causal block (the weight on keys after each query's own; with more keys than "
       "queries, the extra keys — memory, a prefix, a cache — come first), or an earlier output moving by more than "
       "1e-4 (relative) when the last token is perturbed", "definition of causal attention",
       "tokens attend to later tokens although the block is causal: the mask is missing or misaligned",
       Cause.MASK)
def _causal_leak(trace, layer) -> list[Finding]:
    """A causal block whose attention weighs later tokens, or whose earlier outputs move when the last
    token changes (measured by perturbation: a user's block is judged by what it does)."""
    attention, causal = trace.attention, trace.step("attn").probe.causal
    if not trace.expected_causal:
        return []
    if attention is not None and attention.future_weight_sum > 1e-6:
        return [finding(Level.ERROR, "attn", layer, attention.future_weight_sum,
                        phrase("future_weight_sum={future_weight_sum:.4g} with a causal mask",
                               future_weight_sum=attention.future_weight_sum))]
    if causal is not None and causal.causal is False:
        return [finding(Level.ERROR, "attn", layer, causal.leak,
                        phrase("perturbing the last token moved earlier outputs by {leak:.3g} (relative rms)",
                               leak=causal.leak))]
    return []


@check(Scope.STEP, "residual_not_added", "‖output − (α·stream + update)‖ > 1e-3 · ‖output‖ at a residual step, "
       "and so in training with dropout before the add: output − α·stream is 0 or c·update element by element, c "
       "above 1 and the zeroed share 1 − 1/c (±0.05)",
       "definition of the residual connection (He et al. 2016); in training with residual dropout (Vaswani et al. "
       "2017, §5.4) it holds as x + D⊙f(x)/(1 − p)",
       "the residual step does not return stream + update: the skip connection is missing or adds the wrong "
       "tensor", Cause.RESIDUAL)
def _residual_not_added(record, layer, evidence) -> list[Finding]:
    mismatch = record.probe.residual_mismatch
    if not (mismatch or 0) > RESIDUAL_MISMATCH:
        return []
    return [finding(Level.ERROR, record.name, layer, mismatch,
                    phrase("‖output − (α·stream + update)‖ / ‖output‖ = {mismatch:.3g}", mismatch=mismatch))]


def _growing(attention) -> bool:
    """Whether the layer's largest logit is still growing: LOGIT_GROWING × the record before's, or no record
    before to compare (a checkpoint judged alone, a Watch's first record)."""
    earlier = attention.earlier_max_logit
    return earlier is None or not earlier > 0 or attention.max_logit >= LOGIT_GROWING * earlier


def _judged_attention(trace):
    """The attention summary when there is enough of it to judge (T ≥ 4 keys), else None."""
    attention = trace.attention
    return attention if attention is not None and attention.shape[-1] >= 4 else None


@check(Scope.ATTENTION, "attention_logit_growth",
       f"largest pre-softmax logit > {LOGIT_WARNING:g} (warning; in a Watch or over checkpoints, only while still "
       f"growing: at least {LOGIT_GROWING:g}× the same layer's at the record before), > {LOGIT_ERROR:g} (error)",
       "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training instabilities "
       "(≈ 4–5 at init; runs with logits above 1e4 diverged)",
       "attention logits have grown large, so the softmax is saturated and its gradient vanishes",
       Cause.LEARNING_RATE)
def _attention_logit_growth(trace, layer) -> list[Finding]:
    attention = _judged_attention(trace)
    logit = attention.max_logit if attention is not None else None
    if logit is None or not logit > LOGIT_WARNING or (logit <= LOGIT_ERROR and not _growing(attention)):
        return []
    level = Level.ERROR if logit > LOGIT_ERROR else Level.WARNING
    return [finding(level, "attn", layer, logit, phrase("largest pre-softmax logit {logit:.4g}", logit=logit))]


@check(Scope.ATTENTION, "attention_scale_wrong",
       "the block's own code multiplies q·kᵀ by a number c above 1 (c = √d_head: multiplied where the definition "
       "divides)",
       "definition (Vaswani et al. 2017): scores are q·kᵀ/√d_head, so unit-variance q and k give scores of "
       "variance 1; published models scale by 1/√d_head (most), 1/d_head (μP, Yang et al. 2022) or 1 (T5, "
       "Raffel et al. 2020): none by more than 1",
       "the attention scores are amplified instead of scaled down: the softmax saturates from the first step, "
       "each query attends to one key, and its gradient vanishes", Cause.ARCHITECTURE, direct=True,
       advice=phrase("divide the scores by √d_head: att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1)) (or "
                     "multiply by 1 / math.sqrt(...)); F.scaled_dot_product_attention does it for you"))
def _attention_scale_wrong(trace, layer) -> list[Finding]:
    attention = trace.attention
    scale = attention.score_scale if attention is not None else None
    if scale is None or not scale > 1:
        return []
    width = attention.head_dim
    multiplied = width is not None and math.isclose(scale, math.sqrt(width), rel_tol=1e-3)
    return [finding(Level.ERROR, "attn", layer, scale,
                    phrase("the scores are q·kᵀ × {scale:.4g}{against}", scale=scale, against=(
                        phrase(" = × √{width}: multiplied by √d_head where the definition divides by it", width=width)
                        if multiplied else phrase(" (the definition: ÷ √{width})", width=width) if width else "")))]


@check(Scope.ATTENTION, "attention_normalised_over_another_axis",
       "the attention's softmax normalises one axis of the scores and the product with v sums its output over "
       "another (a user's attention module, seen while it runs)",
       "definition (Vaswani et al. 2017): each query's weights are a distribution over the keys they weight, "
       "softmax over the keys' axis, the one the product with v sums; normalised over the queries instead, a "
       "position's output depends on every other query's scores (later ones included) and its weights do not sum "
       "to 1",
       "softmax(scores, dim=-2) (or dim=1 of [B, T, T]) where dim=-1 is meant: the weights are normalised over the "
       "queries, not the keys", Cause.ARCHITECTURE, direct=True,
       advice=phrase("normalise the scores over the keys: F.softmax(scores, dim=-1) for scores laid out [..., "
                     "queries, keys]"))
def _attention_normalised_over_another_axis(trace, layer) -> list[Finding]:
    axes = trace.contracted_elsewhere
    if axes is None:
        return []
    return [finding(Level.ERROR, "attn", layer, float(axes[0]), phrase(
        "the softmax normalises axis {normalised} of the scores, and the product with v sums the weights over axis "
        "{summed}", normalised=axes[0], summed=axes[1]))]


def _positional(attention, head: int) -> Optional[str]:
    for name, weights in ((phrase("first-token"), attention.first_weight), (phrase("self"), attention.self_weight),
                          (phrase("previous-token"), attention.previous_weight)):
        if head < len(weights) and weights[head] >= POSITIONAL:
            return name
    return None


def _sharp_heads(attention) -> list[int]:
    return [head for head, h in enumerate(attention.entropy_per_head) if h < SHARP_ENTROPY * attention.uniform_entropy]


@check(Scope.ATTENTION, "attention_entropy_collapse",
       f"at least half of a layer's heads below {SHARP_ENTROPY:g} × the entropy of uniform "
       f"attention, not explained by a positional pattern, with a logit above {LOGIT_WARNING:g} still growing (in a "
       f"Watch or over checkpoints: at least {LOGIT_GROWING:g}× the same layer's at the record before)",
       "Zhai et al. 2023, Stabilizing Transformer Training by Preventing Attention Entropy Collapse",
       "most heads put all their weight on one key while the logits grow: collapse preceded divergence in "
       "their runs", Cause.LEARNING_RATE)
def _attention_entropy_collapse(trace, layer) -> list[Finding]:
    attention = _judged_attention(trace)
    if attention is None or attention.max_logit is None or not attention.max_logit > LOGIT_WARNING \
            or not _growing(attention):
        return []
    unexplained = [head for head in _sharp_heads(attention) if _positional(attention, head) is None]
    heads = len(attention.entropy_per_head)
    if 2 * len(unexplained) < heads:
        return []
    return [finding(Level.ERROR, "attn", layer, len(unexplained) / heads,
                    phrase("{count} of {heads} heads near zero entropy (uniform {uniform_entropy:.3f}), largest logit "
                           "{max_logit:.4g}", count=len(unexplained), heads=heads,
                           uniform_entropy=attention.uniform_entropy, max_logit=attention.max_logit))]


@check(Scope.ATTENTION, "attention_sharp_head",
       f"a head below {SHARP_ENTROPY:g} × the entropy of uniform attention (info)",
       "Zhai et al. 2023: a single sharp head (previous-token, first-token sink) is a learned feature",
       "the head attends to one key; with ≥ 50% of its weight on the first key, itself or the previous token "
       "it is a positional head", Cause.LEARNING_RATE)
def _attention_sharp_head(trace, layer) -> list[Finding]:
    attention = _judged_attention(trace)
    if attention is None:
        return []
    return [finding(Level.INFO, "attn", layer, attention.entropy_per_head[head],
                    phrase("head {head}: entropy {entropy:.3g} (uniform {uniform:.3f}), {kind} head", head=head,
                           entropy=attention.entropy_per_head[head], uniform=attention.uniform_entropy,
                           kind=_positional(attention, head) or phrase("content")))
            for head in _sharp_heads(attention)]


@check(Scope.ATTENTION, "attention_uniform", "a head's mean entropy ≥ 0.98 × that of uniform attention (info, T ≥ 4)",
       "Zhai et al. 2023 (the opposite end); uniform = the mean of log(i+1) per query when causal",
       "the head attends uniformly: it carries no positional or content preference (normal at initialisation)",
       Cause.INITIALISATION)
def _attention_uniform(trace, layer) -> list[Finding]:
    attention = _judged_attention(trace)
    if attention is None:
        return []
    uniform = attention.uniform_entropy
    return [finding(Level.INFO, "attn", layer, entropy,
                    phrase("head {head}: entropy {entropy:.4f} of uniform {uniform:.4f}", head=head, entropy=entropy,
                           uniform=uniform))
            for head, entropy in enumerate(attention.entropy_per_head) if entropy >= 0.98 * uniform]


def _judged_ffn(record):
    """The FFN's activity when enough tokens passed to judge its units (DEAD_MIN_TOKENS), else None."""
    ffn = record.probe.ffn
    return ffn if ffn is not None and ffn.tokens >= DEAD_MIN_TOKENS else None


@check(Scope.STEP, "ffn_dead_units",
       f"fraction of FFN hidden units never active over ≥ {DEAD_MIN_TOKENS} tokens > {DEAD_ERROR:g} (error); "
       f"> {DEAD_INFO:g} (info: seen in healthy trained OPT layers)",
       "Voita et al. 2023, Neurons in Large Language Models: Dead, N-gram, Positional (> 70% dead in trained "
       "OPT layers)", "almost every FFN unit outputs nothing for every token: they get no gradient and are "
       "wasted", Cause.ARCHITECTURE)
def _ffn_dead_units(record, layer, evidence) -> list[Finding]:
    ffn = _judged_ffn(record)
    if ffn is None or not ffn.dead_fraction > DEAD_INFO:
        return []
    level = Level.ERROR if ffn.dead_fraction > DEAD_ERROR else Level.INFO
    return [finding(level, record.name, layer, ffn.dead_fraction,
                    phrase("{dead_fraction:.1%} of {units} hidden units never active over {tokens} tokens",
                           dead_fraction=ffn.dead_fraction, units=ffn.units, tokens=ffn.tokens))]


@check(Scope.STEP, "ffn_saturated", "fraction of FFN hidden activations in the flat region > 0.9 (info)",
       "activation-function definitions (ReLU ≤ 0; GELU/SiLU pre-activation < -4)",
       "almost every hidden activation sits where the activation has ~zero slope", Cause.ARCHITECTURE)
def _ffn_saturated(record, layer, evidence) -> list[Finding]:
    ffn = _judged_ffn(record)
    if ffn is None or not ffn.flat_fraction > 0.9:
        return []
    return [finding(Level.INFO, record.name, layer, ffn.flat_fraction,
                    phrase("{flat_fraction:.1%} of hidden activations in the flat region",
                           flat_fraction=ffn.flat_fraction))]


@check(Scope.STEP, "update_too_small", f"‖update‖ / ‖stream‖ < {UPDATE_SMALL:g} at a sublayer (info)",
       "Liu et al. 2020 (Admin): branch/stream balance", "the sublayer barely changes the stream",
       Cause.INITIALISATION)
def _update_too_small(record, layer, evidence) -> list[Finding]:
    ratio = record.probe.update_ratio
    if ratio is None or not ratio < UPDATE_SMALL:
        return []
    return [finding(Level.INFO, record.name, layer, ratio, phrase("‖update‖/‖stream‖ = {ratio:.3g}", ratio=ratio))]


@check(Scope.STEP, "update_too_large",
       f"‖update‖ / ‖stream‖ > {UPDATE_LARGE:g} at a sublayer (info: the first layers of trained models)",
       "Liu et al. 2020 (Admin)", "the sublayer's update swamps the stream it is added to", Cause.INITIALISATION)
def _update_too_large(record, layer, evidence) -> list[Finding]:
    ratio = record.probe.update_ratio
    if ratio is None or not ratio > UPDATE_LARGE:
        return []
    return [finding(Level.INFO, record.name, layer, ratio, phrase("‖update‖/‖stream‖ = {ratio:.3g}", ratio=ratio))]


@check(Scope.STEP, "massive_activation",
       f"|x| > {MASSIVE_ABS:g} and > {MASSIVE_RATIO:g} × the median |x| of the hidden state (info)",
       "Sun et al. 2024, Massive Activations in Large Language Models",
       "a few features are orders of magnitude above the rest (normal in trained LLMs)", Cause.ARCHITECTURE)
def _massive_activation(record, layer, evidence) -> list[Finding]:
    ratio = record.probe.massive_ratio
    if not (ratio or 0) > MASSIVE_RATIO:
        return []
    return [finding(Level.INFO, record.name, layer, record.stats.absmax,
                    phrase("max |x| {absmax:.4g} = {ratio:.4g} × median |x|", absmax=record.stats.absmax, ratio=ratio))]


# --- the layers together, the model, its gradients ---------------------------------------------------

@check(Scope.STACK, "residual_explosion",
       f"the median token's ‖x‖²/d grows past {STREAM_GROWTH_ERROR:g} × Xiong et al.'s bound (1 + 3l/2, "
       "relative to the first layer's output, or to 1 where that is smaller) across the layers (not where every "
       "update is a norm's output: sandwich, reordered)",
       "Xiong et al. 2020, Lemma 2 (Pre-LN ‖x_l‖²/d ≤ 1 + 3l/2 at init); Wortsman et al. 2023; where each update is "
       "norm(f(x)), the triangle inequality bounds each add's move of ‖x‖/√d by the norm's largest |gain|",
       "the residual stream grows by orders of magnitude from layer to layer: the model is diverging",
       Cause.LEARNING_RATE)
def _residual_explosion(traces, first_layer: int) -> list[Finding]:
    """Growth of the median token's ‖x‖²/d across the traced layers, against Xiong et al.'s bound."""
    if traces and all(t.wiring.updates_normalised for t in traces):
        return []  # the stream grows only as far as the norms' gains allow: theirs to judge, not the stream's
    sizes = [(first_layer + i, t.steps[-1].probe.token_sq_median) for i, t in enumerate(traces)]
    sizes = [(layer, size) for layer, size in sizes if size is not None and math.isfinite(size) and size > 0]
    if len(sizes) < 2:
        return []
    (first, reference), bound_of = sizes[0], lambda layer: 1 + 1.5 * (layer + 1)
    # the lemma's units: sublayers that add ~1 each to ‖x‖²/d; a stream that starts below that (an embedding of std
    # 0.02, a first block that adds little) reaches it without exploding
    reference = max(reference, UNIT_STREAM)
    for layer, size in sizes[1:]:
        growth, bound = size / reference, bound_of(layer) / bound_of(first)
        if growth > STREAM_GROWTH_ERROR * bound:
            return [finding(Level.ERROR, traces[layer - first_layer].steps[-1].name, layer, growth,
                            phrase("the median token's ‖x‖²/d grew {growth:.3g}× from layer {first} to layer {layer} "
                                   "(bound {bound:.3g}×; ‖x‖²/d = {size:.3g} there)", growth=growth, first=first,
                                   layer=layer, bound=bound, size=size))]
    return []


@check(Scope.MODEL, "weight_scale",
       f"the median matrix of a layer has std·√fan_in > {WEIGHT_GAIN_ERROR:g} (a linear map amplifying its input "
       "tenfold; ≈ 0.5–1.5 at the usual inits: N(0, 0.02), Xavier, 1/√d)",
       "Glorot & Bengio 2010; Radford et al. 2019 (GPT-2: N(0, 0.02))",
       "the weights are far larger than any usual initialisation", Cause.INITIALISATION)
def _weight_scale(evidence) -> list[Finding]:
    flags = []
    for index, matrices in enumerate(evidence.weights):
        gains = sorted(entry["std"] * math.sqrt(entry["fan_in"]) for entry in matrices.values() if entry["fan_in"])
        if gains and gains[len(gains) // 2] > WEIGHT_GAIN_ERROR:
            median = gains[len(gains) // 2]
            flags.append(finding(Level.ERROR, None, evidence.first_layer + index, median,
                                 phrase("the median matrix has std·√fan_in = {median:.3g}", median=median)))
    return flags


def _matching_matrices(evidence, matching: Callable[[str, dict], bool]) -> Iterator[tuple[int, list[tuple]]]:
    """Each traced layer (as the model numbers it) whose weight matrices include some that match, with those
    (name, statistics) pairs: the weight checks make one finding per such layer."""
    for index, matrices in enumerate(evidence.weights):
        found = [(name, entry) for name, entry in matrices.items() if matching(name, entry)]
        if found:
            yield evidence.first_layer + index, found


def _first_names(found: list[tuple]) -> str:
    """The first three matrices' names, and … when there are more."""
    return ", ".join(name for name, _ in found[:3]) + (" …" if len(found) > 3 else "")


@check(Scope.MODEL, "weights_constant",
       "a weight matrix of a layer has every sampled entry equal and its norm above 0 (4,096 entries read, strided)",
       "definition: a matrix of one value c maps every input x to c·Σx in every output unit, so the units it feeds are "
       "identical and, beside another such matrix, receive identical gradients forever — the symmetry a random "
       "initialisation exists to break (Goodfellow, Bengio & Courville 2016, §8.4); no published initialisation "
       "fills a matrix with one nonzero value",
       "the layer's units are copies of one another: nn.init.constant_ (or fill_) where normal_ was meant, or a "
       "loader that broadcast one value", Cause.INITIALISATION, direct=True,
       advice=phrase("initialise weight matrices randomly (nn.init.normal_(std=0.02) as GPT-2 does, or the "
                     "family's own init)"))
def _weights_constant(evidence) -> list[Finding]:
    return [finding(Level.ERROR, None, layer, 0.0, phrase("{names}: every sampled entry holds the same value",
                                                          names=_first_names(found)))
            for layer, found in _matching_matrices(evidence, lambda name, entry: entry.get("spread") == 0
                                                   and entry["norm"] > 0)]


def _off_centre(name: str, entry: dict) -> bool:
    return entry.get("spread") != 0 and isinstance(entry.get("mean"), float) and math.isfinite(entry["mean"]) \
        and math.isfinite(entry["std"]) and abs(entry["mean"]) > entry["std"]


@check(Scope.MODEL, "weights_off_centre",
       "a weight matrix of a layer has a mean larger in magnitude than its standard deviation",
       "definition of the published initialisations — normal and truncated normal (GPT-2, BERT, T5), Xavier and "
       "Kaiming uniform (PyTorch's nn.Linear), orthogonal — all centred on 0; a matrix of mean m feeds every unit m·Σx "
       "besides its random part, and training moves a matrix's mean far less than its spread. |mean| > std is a "
       "matrix drawn from a one-signed distribution: torch.rand's U[0, 1) has mean/std = 1.73",
       "the layer starts far from any initialisation a recipe uses: every unit sees the same large positive part of "
       "its input, so attention saturates and units move together — torch.rand where torch.randn was meant, or .abs() "
       "on a normal draw", Cause.INITIALISATION, direct=True,
       advice=phrase("draw weight matrices centred on 0: nn.init.normal_(std=0.02) as GPT-2, or torch.randn scaled "
                     "by 1/√fan_in — not torch.rand, whose values are all positive"))
def _weights_off_centre(evidence) -> list[Finding]:
    return [finding(Level.ERROR, None, layer, abs(entry["mean"]) / entry["std"],
                    phrase("{name}: mean {mean:.3g} against a standard deviation of {std:.3g}",
                           name=name, mean=entry["mean"], std=entry["std"]))
            for layer, [(name, entry), *_] in _matching_matrices(evidence, _off_centre)]


# the narrowest FFN published models use, over the stream's width: Qwen3-Next's experts, 512 for a 2048-wide stream
# (dense FFNs are 8/3·d to 4·d: Llama's SwiGLU, GPT-2's); half of it leaves room for research's finer experts
NARROWEST_FFN = 1 / 8


def _narrow_ffn_input(name: str, entry: dict) -> bool:
    return tensor_kind(name) == "ffn_w1" and bool(entry.get("fan_out")) and \
        entry["fan_out"] < NARROWEST_FFN * entry["fan_in"]


@check(Scope.MODEL, "ffn_too_narrow",
       f"a layer's FFN input matrix (or an expert's) has fewer than {NARROWEST_FFN:g} × the stream's width units",
       "published configs: dense FFNs are 8/3·d (Llama's SwiGLU) to 4·d (GPT-2, Vaswani et al. 2017) wide, "
       "mixture-of-experts' experts no narrower than d/4 (Qwen3-Next: 512 for d = 2048; DeepSeek-V3: 2048 for 7168)",
       "the FFN is a bottleneck no published model has: a width given where a ratio was meant (GPT-2's n_inner=4 "
       "for 4·d), or a config read wrong", Cause.ARCHITECTURE, direct=True,
       advice=phrase("give the FFN its published width: 4·d (GPT-2's n_inner=None), or 8/3·d for a SwiGLU"))
def _ffn_too_narrow(evidence) -> list[Finding]:
    return [finding(Level.WARNING, None, layer, float(entry["fan_out"]),
                    phrase("{name} has {units} units for a {width}-wide stream", name=name, units=entry["fan_out"],
                           width=entry["fan_in"]))
            for layer, [(name, entry), *_] in _matching_matrices(evidence, _narrow_ffn_input)]


@check(Scope.MODEL, "weights_non_finite",
       "a checkpoint's weight matrix holds NaN or Inf (its sum of squares is not finite)",
       "definition: no optimizer step on finite gradients writes NaN into a weight it holds finite; a non-finite "
       "weight makes every output it touches non-finite",
       "the checkpoint's weights themselves are broken: whatever else fails downstream follows from them",
       Cause.WEIGHTS, direct=True,
       advice=phrase("reload the last checkpoint whose weights are finite, and find what wrote the NaN (a diverged "
                     "step saved without a check, a corrupt copy, a conversion that overflowed)"))
def _weights_non_finite(evidence) -> list[Finding]:
    if evidence.in_training:
        return []
    return [finding(Level.ERROR, None, layer, math.nan, phrase("{names} hold NaN or Inf", names=_first_names(found)))
            for layer, found in _matching_matrices(evidence, lambda name, entry: not math.isfinite(entry["norm"]))]


# the loss this far below log V: the model has learned (an initialisation predicts about as well as uniform guessing)
LEARNED_NATS = 1.0


def _trained(evidence) -> bool:
    """Whether the checkpoint holds a trained model: its step past 0, or its loss LEARNED_NATS below log V."""
    if evidence.step is not None:
        return evidence.step > 0
    loss = evidence.loss
    return loss is not None and loss.value is not None and loss.uniform is not None and \
        math.isfinite(loss.value) and loss.value < loss.uniform - LEARNED_NATS


# each matrix kind's zero-saddle partner, both ways (a fused qkv is its own)
SADDLE_PARTNER = {a: b for a, b in STUCK_TOGETHER} | {b: a for a, b in STUCK_TOGETHER}


def _zero_alone(layer: dict) -> Callable[[str, dict], bool]:
    """A matrix exactly 0 whose zero-saddle partner (STUCK_TOGETHER) is not: training would have moved it."""
    zero_kinds = {tensor_kind(name) for name, entry in layer.items() if entry["norm"] == 0}

    def matching(name: str, entry: dict) -> bool:
        kind = tensor_kind(name)
        return entry["norm"] == 0 and SADDLE_PARTNER.get(kind) not in zero_kinds

    return matching


@check(Scope.MODEL, "weights_zero_after_training",
       f"a weight matrix of a trained checkpoint (its step past 0, or its loss {LEARNED_NATS:g} nat below log V) is "
       "exactly 0, where its zero-saddle partner (the FFN's other matrix, the key's query) is not",
       "calculus: a matrix used as y = x·Wᵀ gets the gradient δᵀ·x, nonzero wherever its input and its output's "
       "gradient are, so the first step on it moves it off 0 — zero-initialised output projections (Fixup, "
       "modded-nanogpt) are 0 at step 0 only; both matrices of a pair at 0 give each other no gradient and stay "
       "(the initialisation's fault, weights_zero_stuck in a Watch)",
       "the matrix was zeroed after training: a conversion, a merge or surgery that wrote zeros, a tensor lost on "
       "the way to the file", Cause.WEIGHTS, direct=True,
       advice=phrase("reload the last checkpoint whose matrices are not zero, and find what wrote the zeros (a "
                     "conversion, a merge, a pruning or loading step)"))
def _weights_zero_after_training(evidence) -> list[Finding]:
    if evidence.in_training or not _trained(evidence):
        return []
    flags = []
    for index, layer in enumerate(evidence.weights):
        zero = _zero_alone(layer)
        found = [(name, entry) for name, entry in layer.items() if zero(name, entry)]
        if found:
            flags.append(finding(Level.ERROR, None, evidence.first_layer + index, 0.0,
                                 phrase("{names}: exactly 0 in a trained checkpoint{step}", names=_first_names(found),
                                        step=phrase(" (step {step})", step=evidence.step)
                                        if evidence.step is not None else "")))
    return flags


def _siblings(weights: list[dict]) -> dict[str, list[float]]:
    """Each matrix name of a block, with its std in every traced layer that has it finite."""
    found: dict[str, list[float]] = {}
    for matrices in weights:
        for name, entry in matrices.items():
            if math.isfinite(entry["std"]):
                found.setdefault(name, []).append(entry["std"])
    return found


@check(Scope.MODEL, "weight_outlier",
       f"a checkpoint's weight matrix whose std is > {SIBLING_RATIO:g}× or < 1/{SIBLING_RATIO:g} of the median std "
       f"of the same matrix in the other layers (at least {MIN_SIBLINGS} layers traced)",
       "initialisation draws every layer's matrix of one kind at one scale (GPT-2: N(0, 0.02), its residual "
       "projections at 0.02/√(2L)), and training moves them by far less than an order of magnitude",
       "one layer's weights are unlike all their siblings: scaled, zeroed or overwritten outside the optimizer "
       "(surgery, a bad merge, a loading bug)", Cause.WEIGHTS)
def _weight_outlier(evidence) -> list[Finding]:
    if evidence.in_training or len(evidence.weights) < MIN_SIBLINGS:
        return []
    siblings, flags = _siblings(evidence.weights), []
    for index, matrices in enumerate(evidence.weights):
        for name, entry in matrices.items():
            values = sorted(siblings.get(name, []))
            median = values[len(values) // 2] if len(values) >= MIN_SIBLINGS else 0.0
            std = entry["std"]
            if median > 0 and math.isfinite(std) and not 1 / SIBLING_RATIO <= std / median <= SIBLING_RATIO:
                flags.append(finding(Level.ERROR, None, evidence.first_layer + index, std / median,
                                     phrase("{name}: std {std:.3g}, {factor:.3g}× the median of its {count} siblings "
                                            "({median:.3g})", name=name, std=std, factor=std / median,
                                            count=len(values), median=median)))
                break  # one per layer: its first outlier names it
    return flags


@check(Scope.MODEL, "loss_above_uniform", f"the model's loss > log V + {LOSS_MARGIN:g} nats (V: the vocabulary); over "
       "training, info at a first record above after step 0, an error when it lasts to the next or is not finite; a "
       "finite loss above the mean over rows of each row's largest −log p of the recorded logits (no cross-entropy "
       "of them reaches it: the loss has other terms) is not judged",
       "definition: log V is the loss of predicting every token equally likely",
       "the model predicts worse than an untrained uniform guess: its training failed (a symptom: alone it names "
       "no mechanism)", Cause.UNKNOWN, symptom=True)
def _loss_above_uniform(evidence) -> list[Finding]:
    loss = evidence.loss
    if loss is None or loss.value is None or (math.isfinite(loss.value) and loss.value <= loss.uniform + LOSS_MARGIN):
        return []
    return [finding(Level.ERROR, None, None, loss.value,
                    phrase("loss {loss:.4g} against log V = {uniform:.4g} for uniform guessing", loss=loss.value,
                           uniform=loss.uniform))]


@check(Scope.MODEL, "learned_wrong_shift",
       f"a next-token model's loss with each position labelled by the token two ahead (shift 2) is > "
       f"{LOSS_MARGIN:g} nats below both its loss at shift 1, on the same positions (at least {SHIFT_MIN_POSITIONS}), "
       f"and log V; or its loss at its own token (shift 0) is below both and below log 2 (most of its mass on the "
       f"input token); not at step 0",
       "definition of next-token prediction: position t is trained on token t + 1, so a model trained as it "
       "should be predicts t + 1 better than any other position of the text; a target predicted better than "
       "uniform guessing (log V) was learned, where an untrained or broken model's losses differ by noise. Tied "
       "embeddings make an untrained model prefer its own input token (logit h·e_x with h ≈ e_x: 3.9 against 4.4 "
       "nats at step 0 of a healthy GPT-2), so shift 0 counts only once it holds most of the mass",
       "the model learned another target than the next token: the labels were not shifted (it copies its input) or "
       "were shifted twice (it predicts two ahead)", Cause.DATA, direct=True,
       advice=phrase("build the targets as the token sequence shifted by one, once: targets[t] = ids[t + 1] for a "
                     "model that does not shift, labels = ids for one that does (HF)"))
def _learned_wrong_shift(evidence) -> list[Finding]:
    by_shift = evidence.loss.by_shift if evidence.loss is not None else None
    if not by_shift or not math.isfinite(by_shift[1]) or evidence.step == 0:  # at step 0 nothing was learned
        return []
    best = min(by_shift, key=by_shift.get)
    if best == 1 or not by_shift[best] < min(by_shift[1], evidence.loss.uniform) - LOSS_MARGIN:
        return []
    if best == 0 and not by_shift[0] < COPIED:  # tied embeddings' own preference for the input token: not learned
        return []
    learned = phrase("its own input token (shift 0)") if best == 0 else \
        phrase("the token {best:d} ahead (shift {best:d})", best=best)
    shown = ", ".join(phrase("shift {shift:d} {loss:.4g}", shift=shift, loss=value)
                      for shift, value in sorted(by_shift.items()))
    return [finding(Level.ERROR, None, None, by_shift[best],
                    phrase("the model predicts {learned} better than the next token: loss {shown}", learned=learned,
                           shown=shown))]


@check(Scope.MODEL, "output_logit_drift",
       f"the mean log Z = log Σ exp(logits) of the predictions beyond ±{LOG_Z_ERROR:g}",
       "Wortsman et al. 2023 (output-logit divergence; z-loss 1e-4·log²Z)",
       "the output logits' normaliser has drifted far from 0: the output layer is diverging",
       Cause.LEARNING_RATE)
def _output_logit_drift(evidence) -> list[Finding]:
    loss = evidence.loss
    if loss is None or loss.value is None or loss.log_z_mean is None or not abs(loss.log_z_mean) > LOG_Z_ERROR:
        return []
    return [finding(Level.ERROR, None, None, loss.log_z_mean,
                    phrase("mean log Z = {log_z_mean:.4g}", log_z_mean=loss.log_z_mean))]


@check(Scope.MODEL, "optimizer_eps_underflow",
       "an optimizer's eps rounds to 0 in the dtype of the parameters it updates "
       "(Adam's default 1e-8 is 0 in float16, whose smallest positive value is 6e-8; watch with optimizer=)",
       "IEEE 754 half precision; Micikevicius et al. 2018, Mixed Precision Training (float32 master weights)",
       "Adam divides by √v + eps: with eps 0, an element whose gradients have all been 0 gets 0/0 = NaN at "
       "the next update", Cause.PRECISION)
def _optimizer_eps_underflow(evidence) -> list[Finding]:
    return [finding(Level.ERROR, None, None, group["eps"],
                    phrase("eps {eps:g} is {rounded:g} in {dtype}", eps=group["eps"], rounded=group["eps_in_dtype"],
                           dtype=group["dtype"]))
            for group in evidence.optimizer if group["eps"] > 0 and group["eps_in_dtype"] == 0]


def _collapse(routing) -> Optional[float]:
    """How far the load-balance loss has gone from balanced (0) to every token on the same k experts (1); None
    below MIN_SLOTS_PER_EXPERT token slots per expert, where an unbalanced router can be chance."""
    k, experts = routing.per_token, routing.experts
    if routing.tokens * k < MIN_SLOTS_PER_EXPERT * experts:
        return None
    return (routing.balance_loss - k) / (experts - k) if experts > k else 0.0


@check(Scope.ROUTING, "router_collapse",
       "the load-balance loss E·Σ f·P has gone ≥ 50% (warning), ≥ 90% (error) of the way "
       f"from a balanced router (k) to every token on the same k experts (E), over ≥ {MIN_SLOTS_PER_EXPERT} token "
       "slots per expert",
       "Fedus et al. 2022 (Switch Transformer) and Jiang et al. 2024 (Mixtral): f = share of tokens sent to an "
       "expert, P = its mean router probability, as HF's load_balancing_loss_func computes it",
       "the router sends most tokens to a few experts: the others barely train and the layer's capacity is "
       "wasted", Cause.ROUTING)
def _router_collapse(routing, layer) -> list[Finding]:
    collapse = _collapse(routing)
    if collapse is None or collapse < COLLAPSE_WARNING:
        return []
    level = Level.ERROR if collapse >= COLLAPSE_ERROR else Level.WARNING
    return [finding(level, "ffn", layer, routing.balance_loss,
                    phrase("load-balance loss {balance_loss:.3g} (balanced {per_token}, collapsed {experts}); the "
                           "busiest expert takes {busiest:.0%} of the token slots (uniform {uniform:.0%})",
                           balance_loss=routing.balance_loss, per_token=routing.per_token, experts=routing.experts,
                           busiest=max(routing.load), uniform=1 / routing.experts))]


@check(Scope.ROUTING, "dead_experts",
       f"an expert that receives no token although ≥ {MIN_SLOTS_PER_EXPERT} token slots per expert were routed (info: "
       "a healthy tiny Mixtral trained with the load-balance loss left up to 4 of 8 experts of a layer without a "
       "token of a 2048-token batch, its router near uniform; router_collapse is the verdict)",
       "Fedus et al. 2022; Shazeer et al. 2017 (load balancing); benchmarks/FAILURES.md (mixtral-healthy)",
       "some experts receive no token of this batch: they get no gradient from it", Cause.ROUTING)
def _dead_experts(routing, layer) -> list[Finding]:
    if _collapse(routing) is None or not routing.dead:
        return []
    return [finding(Level.INFO, "ffn", layer, len(routing.dead),
                    phrase("{count} of {experts} experts received no token of {tokens}: experts {experts_listed}",
                           count=len(routing.dead), experts=routing.experts, tokens=routing.tokens,
                           experts_listed=", ".join(map(str, routing.dead[:10]))))]


@check(Scope.ROUTING, "router_choice_repeats",
       "a token sent to the same expert in two of its k slots (any share of the routed tokens)",
       "definition of top-k routing (Shazeer et al. 2017; Fedus et al. 2022; HF's routers: torch.topk over the "
       "experts): the k slots of a token hold k different experts, each once — whatever the router's weights",
       "the experts chosen are not the router's top-k: torch.topk's (values, indices) unpacked the other way round "
       "and the probabilities cast to integers (every slot becomes expert 0), indices read from the wrong tensor — "
       "the dispatch no longer follows the router, which the load-balance loss's probabilities do not show",
       Cause.ROUTING, direct=True,
       advice=phrase("unpack torch.topk as values, indices = torch.topk(probs, k) and dispatch by the indices (never "
                     "cast the values to integers)"))
def _router_choice_repeats(routing, layer) -> list[Finding]:
    if not routing.repeated_choice > 0:
        return []
    return [finding(Level.ERROR, "ffn", layer, routing.repeated_choice,
                    phrase("{share:.0%} of the {tokens} tokens were sent to one expert in two of their {per_token} "
                           "slots", share=routing.repeated_choice, tokens=routing.tokens,
                           per_token=routing.per_token))]


@check(Scope.ROUTING, "router_logit_growth",
       f"largest |router logit| > {ROUTER_LOGIT_WARNING:g} (≈ 1 at initialisation)",
       "Zoph et al. 2022 (ST-MoE): the router z-loss keeps router logits small because bf16 roundoff in large "
       "logits changes the routing; at 64 bf16's step is 0.5, so near-tied experts' probabilities are off by "
       "up to e^0.25 ≈ 1.28×",
       "the router's logits have grown so large that rounding decides between experts", Cause.ROUTING)
def _router_logit_growth(routing, layer) -> list[Finding]:
    if not routing.max_logit > ROUTER_LOGIT_WARNING:
        return []
    return [finding(Level.WARNING, "ffn", layer, routing.max_logit,
                    phrase("largest |router logit| {max_logit:.4g}, router z-loss {z_loss:.4g}",
                           max_logit=routing.max_logit, z_loss=routing.z_loss))]


def _gradient_means(gradients) -> Optional[list[float]]:
    means = [sum(norms.values()) / len(norms) for norms in gradients.step_norms if norms]
    return means if len(means) >= 2 and min(means[0], means[-1]) > 0 else None


def _non_finite_gradient(gradients) -> Optional[tuple[int, str]]:
    return next(((layer, name) for layer, norms in enumerate(gradients.step_norms) for name, value in norms.items()
                 if not math.isfinite(value)), None)


def _gradient_detail(means: list[float], first_layer: int) -> str:
    return phrase("mean ‖∂L/∂step‖ {first:.3g} at layer {first_layer} against {last:.3g} at layer {last_layer}",
                  first=means[0], first_layer=first_layer, last=means[-1], last_layer=first_layer + len(means) - 1)


@check(Scope.GRADIENTS, "gradient_vanishing",
       "the first layer's mean step gradient < 1e-3 × the last layer's (with --grad)",
       "Xiong et al. 2020; Liu et al. 2020", "gradients shrink towards the input: early layers barely learn",
       Cause.WARMUP)
def _gradient_vanishing(gradients, first_layer: int) -> list[Finding]:
    if _non_finite_gradient(gradients) is not None:
        return []  # gradient_exploding's
    means = _gradient_means(gradients)
    if means is None or not means[0] / means[-1] < 1 / GRADIENT_RATIO:
        return []
    return [finding(Level.ERROR, None, first_layer, means[0] / means[-1],
                    _gradient_detail(means, first_layer))]


@check(Scope.GRADIENTS, "gradient_exploding",
       "the first layer's mean step gradient > 1e3 × the last layer's, or any non-finite "
       "gradient (with --grad)", "Xiong et al. 2020 (Post-LN gradients at initialisation)",
       "gradients grow towards the input: training steps will be unstable", Cause.LEARNING_RATE)
def _gradient_exploding(gradients, first_layer: int) -> list[Finding]:
    bad = _non_finite_gradient(gradients)
    if bad is not None and gradients.loss_scaled:  # the scaler skips this step and lowers its scale: context
        return [finding(Level.INFO, bad[1], first_layer + bad[0], float("nan"),
                        phrase("non-finite gradient of a scaled loss: the loss scaler skips this step and lowers its "
                               "scale"))]
    if bad is not None:
        return [finding(Level.ERROR, bad[1], first_layer + bad[0], float("nan"),
                        phrase("non-finite gradient"))]
    means = _gradient_means(gradients)
    if means is None or not means[0] / means[-1] > GRADIENT_RATIO:
        return []
    return [finding(Level.ERROR, None, first_layer, means[0] / means[-1],
                    _gradient_detail(means, first_layer))]


def _asked(scope: Scope, *evidence) -> list[Flag]:
    return [found for detect in detectors(scope) for found in detect(*evidence)]


def evaluate(traces: list, gradients=None, evidence: Optional[ModelEvidence] = None) -> list[Flag]:
    """Every finding of a block (one trace), a stack, or a whole model, in execution order: each check of
    CHECKS asked in its scope, in the order the checks are declared."""
    evidence = evidence or ModelEvidence()
    flags = []
    stacked = len(traces) > 1 or evidence.n_layers > 1
    for index, trace in enumerate(traces):
        layer = evidence.first_layer + index if stacked else None
        for record in trace.steps:
            flags += _asked(Scope.STEP, record, layer, evidence)
            if record.name == "attn":
                flags += _asked(Scope.ATTENTION, trace, layer)
            if record.name == "ffn" and trace.routing is not None:
                flags += _asked(Scope.ROUTING, trace.routing, layer)
    if stacked:
        flags += _asked(Scope.STACK, traces, evidence.first_layer)
    flags += _asked(Scope.MODEL, evidence)
    if gradients is not None and gradients.step_norms:
        flags += _asked(Scope.GRADIENTS, gradients, evidence.first_layer)
    first = next((f for f in flags if f.name == "non_finite"), None)
    if first is not None:  # only the origin matters: later NaNs are its consequences
        flags = [f for f in flags if f.name != "non_finite" or f is first]
    return flags
