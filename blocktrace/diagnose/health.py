"""Health checks: named flags, with thresholds from the literature, read off a trace.

Each check looks at what the tracer recorded (step statistics, the attention summary and,
with `checks=True`, the per-step probes in `StepRecord.probe`) and, with --grad, at the
gradient report. A flag has a level: "error" (the block is broken or diverging), "warning"
(unusual; often a symptom), or "info". README.md lists every flag, its threshold and source.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from blocktrace.tracing.behaviour import NormKind
from blocktrace.vocab import Level


@dataclass(frozen=True)
class Check:
    name: str
    threshold: str
    source: str
    meaning: str
    remedy: str


CHECKS = {check.name: check for check in [
    Check("non_finite", "any NaN or Inf in a step's output", "IEEE 754; the first step in execution order is the origin",
          "this step produced NaN/Inf; if its inputs were finite, the fault is inside this step",
          "look for a division by ~0, log of ≤ 0, overflow in half precision; lower the learning rate; "
          "add gradient clipping"),
    Check("norm_not_normalising", "rescaling each token by its own factor in [0.5, 4] changes the norm's output by "
          "more than 1% (relative rms): measured on the module, whatever its class",
          "definition of LayerNorm / RMSNorm: both are invariant to rescaling a token (Ba et al. 2016; "
          "Zhang & Sennrich 2019)",
          "the norm step does not normalise each token: it is missing, replaced, or applied over the wrong axis",
          "check that the norm module is in the forward path and normalises the last dimension"),
    Check("norm_gain_extreme", "rms of the effective gain (g, or 1 + w for Gemma) < 0.1 or > 10, measured on the module",
          "rule of thumb: gains start at 1",
          "the norm's learned gain has drifted far from 1, rescaling everything downstream",
          "check weight decay on norm gains (usually excluded) and the learning rate"),
    Check("attention_entropy_collapse", "a head's mean entropy < 0.1 nats (T ≥ 4)",
          "Zhai et al. 2023, Stabilizing Transformer Training by Preventing Attention Entropy Collapse",
          "the head puts almost all weight on one key; collapse preceded divergence in their runs",
          "σReparam or QK-LayerNorm, a lower learning rate, longer warm-up"),
    Check("attention_uniform", "a head's mean entropy ≥ 0.98 × that of uniform attention (T ≥ 4)",
          "Zhai et al. 2023 (the opposite end); uniform = log T per row (log(i+1) when causal)",
          "the head attends uniformly: it carries no positional or content preference (normal at initialisation)",
          "nothing at initialisation; in a trained model, check that q and k get gradients"),
    Check("attention_logit_growth", "largest pre-softmax logit > 100 (warning), > 1e4 (error)",
          "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training instabilities "
          "(≈ 4–5 at init; runs with logits above 1e4 diverged)",
          "attention logits have grown large, so the softmax is saturated and its gradient vanishes",
          "QK-LayerNorm (Dehghani et al. 2023), a lower learning rate, z-loss"),
    Check("causal_leak", "future_weight_sum > 1e-6 in a causal block, or an earlier output moving by more than 1e-4 "
          "(relative) when the last token is perturbed", "definition of causal attention",
          "tokens attend to later tokens although the block is causal: the mask is missing or misaligned",
          "apply the mask to the scores before the softmax, with -inf (or finfo.min) above the diagonal"),
    Check("ffn_dead_units", "fraction of FFN hidden units never active over the batch > 0.5 (warning), > 0.9 (error)",
          "Voita et al. 2023 (secondary report: > 70% dead units in trained OPT layers)",
          "most FFN units output nothing for every token: they get no gradient and are wasted",
          "check the FFN biases and the init; prefer GELU/SwiGLU to ReLU; lower the learning rate"),
    Check("ffn_saturated", "fraction of FFN hidden activations in the flat region > 0.9",
          "activation-function definitions (ReLU ≤ 0; GELU/SiLU pre-activation < -4)",
          "almost every hidden activation sits where the activation has ~zero slope",
          "check the scale of the FFN input and of W1 / its bias"),
    Check("residual_not_added", "‖output − (α·stream + update)‖ > 1e-3 · ‖output‖ at a residual step",
          "definition of the residual connection (He et al. 2016)",
          "the residual step does not return stream + update: the skip connection is missing or adds the wrong tensor",
          "return x + sublayer(norm(x)) (Pre-LN): add the un-normalised stream"),
    Check("update_too_small", "‖update‖ / ‖stream‖ < 1e-3 at a sublayer",
          "Liu et al. 2020 (Admin): branch/stream balance", "the sublayer barely changes the stream: it is ignored",
          "check that the sublayer's output projection is not zero-initialised forever"),
    Check("update_too_large", "‖update‖ / ‖stream‖ > 10 at a sublayer", "Liu et al. 2020 (Admin)",
          "the sublayer's update swamps the stream it is added to",
          "scale the branch down (smaller init of the output projection, DeepNorm, Admin)"),
    Check("massive_activation", "|x| > 100 and > 1000 × the median |x| of the hidden state",
          "Sun et al. 2024, Massive Activations in Large Language Models",
          "a few features are orders of magnitude above the rest (normal in some trained LLMs, a bug at init)",
          "if unexpected: check for a missing norm or an exploding residual stream"),
    Check("gradient_vanishing", "a step's ‖∂L/∂output‖ < 1e-3 × the largest step gradient norm in the stack",
          "Xiong et al. 2020; Liu et al. 2020", "gradients shrink across steps or layers: early layers barely learn",
          "Pre-LN wiring, a warm-up, residual scaling"),
    Check("gradient_exploding", "a step's ‖∂L/∂output‖ > 1e3 × the smallest step gradient norm in the stack, "
          "or any non-finite gradient", "Xiong et al. 2020 (Post-LN gradient growth near the output)",
          "gradients grow across steps or layers: training steps will be unstable",
          "learning-rate warm-up, gradient clipping, Pre-LN or DeepNorm"),
]}


@dataclass(frozen=True)
class Flag:
    name: str
    level: Level
    step: Optional[str]
    layer: Optional[int]
    value: float
    detail: str

    def to_dict(self) -> dict:
        check = CHECKS[self.name]
        return {"name": self.name, "level": self.level.value, "step": self.step, "layer": self.layer,
                "value": self.value, "detail": self.detail, "threshold": check.threshold, "source": check.source,
                "meaning": check.meaning, "remedy": check.remedy}


def _uniform_entropy(t: int, causal: bool) -> float:
    """Mean entropy of uniform attention over the keys each query may see."""
    if causal:
        return sum(math.log(i + 1) for i in range(t)) / t
    return math.log(t)


def _step_flags(record, layer) -> list[Flag]:
    flags = []
    probe = record.probe or {}
    if record.stats.nan or record.stats.inf:
        finite_inputs = probe.get("inputs_finite")
        detail = f"{record.stats.nan} NaN, {record.stats.inf} Inf"
        if finite_inputs is not None:
            detail += f"; inputs finite: {finite_inputs}"
        flags.append(Flag("non_finite", Level.ERROR, record.name, layer, record.stats.nan + record.stats.inf, detail))
    if "norm_kind" in probe:
        if probe["norm_kind"] is NormKind.NONE:
            flags.append(Flag("norm_not_normalising", Level.ERROR, record.name, layer, probe["scale_error"],
                              f"rescaling each token changed the output by {probe['scale_error']:.3g} (relative rms)"))
        gain = probe.get("gain_rms")
        if gain is not None and not 0.1 <= gain <= 10:
            flags.append(Flag("norm_gain_extreme", Level.WARNING, record.name, layer, gain,
                              f"rms of the effective gain {gain:.3g}"))
    if "residual_mismatch" in probe and probe["residual_mismatch"] > 1e-3:
        flags.append(Flag("residual_not_added", Level.ERROR, record.name, layer, probe["residual_mismatch"],
                          f"‖output − (α·stream + update)‖ / ‖output‖ = {probe['residual_mismatch']:.3g}"))
    if "update_ratio" in probe:
        ratio = probe["update_ratio"]
        if ratio < 1e-3:
            flags.append(Flag("update_too_small", Level.WARNING, record.name, layer, ratio, f"‖update‖/‖stream‖ = {ratio:.3g}"))
        elif ratio > 10:
            flags.append(Flag("update_too_large", Level.WARNING, record.name, layer, ratio, f"‖update‖/‖stream‖ = {ratio:.3g}"))
    if probe.get("massive_ratio") is not None and probe["massive_ratio"] > 1000 and record.stats.absmax > 100:
        flags.append(Flag("massive_activation", Level.WARNING, record.name, layer, record.stats.absmax,
                          f"max |x| {record.stats.absmax:.4g} = {probe['massive_ratio']:.4g} × median |x|"))
    if "dead_fraction" in probe:
        dead = probe["dead_fraction"]
        if dead > 0.5:
            flags.append(Flag("ffn_dead_units", Level.ERROR if dead > 0.9 else Level.WARNING, record.name, layer, dead,
                              f"{dead:.1%} of {probe['units']} hidden units never active over {probe['tokens']} tokens"))
        if probe["flat_fraction"] > 0.9:
            flags.append(Flag("ffn_saturated", Level.WARNING, record.name, layer, probe["flat_fraction"],
                              f"{probe['flat_fraction']:.1%} of hidden activations in the flat region"))
    return flags


def _leak_flags(trace, record, layer) -> list[Flag]:
    """A causal block whose attention weighs later tokens, or whose earlier outputs move when the last
    token changes (measured by perturbation: diagnose a user's block whatever its code claims)."""
    attention, probe = trace.attention, record.probe or {}
    if not trace.expected_causal:
        return []
    if attention is not None and attention.future_weight_sum > 1e-6:
        return [Flag("causal_leak", Level.ERROR, "attn", layer, attention.future_weight_sum,
                     f"future_weight_sum={attention.future_weight_sum:.4g} with a causal mask")]
    if probe.get("causal_measured") is False:
        return [Flag("causal_leak", Level.ERROR, "attn", layer, probe["causal_leak"],
                     f"perturbing the last token moved earlier outputs by {probe['causal_leak']:.3g} (relative rms)")]
    return []


def _attention_flags(attention, layer) -> list[Flag]:
    if attention is None:
        return []
    flags = []
    t = attention.shape[-1]
    if attention.max_logit is not None and attention.max_logit > 100:
        level = Level.ERROR if attention.max_logit > 1e4 else Level.WARNING
        flags.append(Flag("attention_logit_growth", level, "attn", layer, attention.max_logit,
                          f"largest pre-softmax logit {attention.max_logit:.4g}"))
    if t >= 4:
        uniform = _uniform_entropy(t, attention.causal)
        for head, entropy in enumerate(attention.entropy_per_head):
            if entropy < 0.1:
                flags.append(Flag("attention_entropy_collapse", Level.WARNING, "attn", layer, entropy,
                                  f"head {head}: entropy {entropy:.4f} nats (uniform {uniform:.4f})"))
            elif entropy >= 0.98 * uniform:
                flags.append(Flag("attention_uniform", Level.INFO, "attn", layer, entropy,
                                  f"head {head}: entropy {entropy:.4f} of uniform {uniform:.4f}"))
    return flags


def _gradient_flags(gradients) -> list[Flag]:
    if gradients is None:
        return []
    norms = [(layer, step, value) for layer, steps in enumerate(gradients.step_norms) for step, value in steps.items()]
    if not norms:
        return []
    flags = []
    bad = [(layer, step) for layer, step, value in norms if not math.isfinite(value)]
    for layer, step in bad[:1]:
        flags.append(Flag("gradient_exploding", Level.ERROR, step, layer, float("nan"), "non-finite gradient"))
    finite = [(layer, step, value) for layer, step, value in norms if math.isfinite(value) and value > 0]
    if finite and not bad:
        largest = max(value for _, _, value in finite)
        smallest = min(value for _, _, value in finite)
        low = min(finite, key=lambda item: item[2])
        if smallest < 1e-3 * largest:
            flags.append(Flag("gradient_vanishing", Level.WARNING, low[1], low[0], smallest,
                              f"‖∂L/∂{low[1]}‖ = {smallest:.3g} vs largest {largest:.3g}"))
        high = max(finite, key=lambda item: item[2])
        if largest > 1e3 * smallest:
            flags.append(Flag("gradient_exploding", Level.WARNING, high[1], high[0], largest,
                              f"‖∂L/∂{high[1]}‖ = {largest:.3g} vs smallest {smallest:.3g}"))
    return flags


def evaluate(traces: list, gradients=None) -> list[Flag]:
    """Every flag of a block (one trace) or a stack (one trace per layer), in execution order."""
    flags = []
    stacked = len(traces) > 1
    for index, trace in enumerate(traces):
        layer = index if stacked else None
        for record in trace.steps:
            flags += _step_flags(record, layer)
            if record.name == "attn":
                flags += _leak_flags(trace, record, layer)
                flags += _attention_flags(trace.attention, layer)
    flags += _gradient_flags(gradients)
    first = next((f for f in flags if f.name == "non_finite"), None)
    if first is not None:  # only the origin matters: later NaNs are its consequences
        flags = [f for f in flags if f.name != "non_finite" or f is first]
    return flags
