"""From findings to a likely cause: a ranked diagnosis with the evidence and advice that fits it.

Each finding carries a cause from a fixed vocabulary. A cause is ranked by the findings behind
it — errors weigh most, warnings less, info nothing on its own — and by what the model is:
a Post-LN model that diverges needs a warm-up first (Xiong et al. 2020); weights that are
already far past any usual initialisation point at the initialisation; definite structural
faults (a missing mask, a residual adding the wrong tensor, a norm that does not normalise, a
float16 overflow) outrank everything, and so does a finding that observes the fault itself (an
invariant of every correct loop broken, a probe of the property): its cause is never re-read
from the context. Findings that only say that training fails (the loss above uniform, a spike)
name no mechanism: alone, their cause is "unknown", never a default (diagnose.checks declares
them so). Advice never suggests what
the model already has.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from blocktrace.phrases import phrase
from blocktrace.diagnose.checks import CHECKS, Cause, Flag, Scope
from blocktrace.vocab import FFNKind, Level

WEIGHT = {Level.ERROR: 10, Level.WARNING: 3, Level.INFO: 0}
DEFINITE = (Cause.MASK, Cause.RESIDUAL, Cause.NORM, Cause.PRECISION)  # a structural fault explains the rest
# At step 0 nothing but the initialisation can be at fault (see _cause_of).
DEFINITE_BONUS = 100
SCALE_BONUS = 20  # weight_scale: the weights are past any init, whatever the learning rate did


@dataclass(frozen=True)
class Context:
    """What is known of the model the findings come from."""

    post_norm: bool = False  # Post-LN or DeepNorm wiring
    activation: Optional[str] = None  # the FFN's (relu, gelu, swiglu, ...)
    step: Optional[int] = None  # the training step of the checkpoint, when known


TRAINING_CAUSES = (Cause.LEARNING_RATE, Cause.WARMUP)


def _cause_of(finding: Flag, context: Context) -> Cause:
    if CHECKS[finding.name].direct:
        return finding.cause  # the fault was observed: neither the step nor the wiring changes what it is
    if finding.cause in (*TRAINING_CAUSES, Cause.UNKNOWN) and context.step == 0:
        return Cause.INITIALISATION  # no update has happened yet: nothing but the initialisation can be at fault
    if finding.cause is Cause.ARCHITECTURE and context.step == 0 and _of_activations(finding):
        return Cause.INITIALISATION  # before any update the activations are what the initialised weights make
    if finding.cause is Cause.LEARNING_RATE and context.post_norm:
        return Cause.WARMUP  # a diverging Post-LN model: the warm-up comes first (Xiong et al. 2020)
    return finding.cause


def _of_activations(finding: Flag) -> bool:
    """A statistic of a traced step's activations (dead or saturated FFN units, a massive activation), not a
    structural fault of the forward (a block skipped)."""
    return any(scope is Scope.STEP for scope, _ in CHECKS[finding.name].detectors)


@dataclass(frozen=True)
class Findings:
    """What the one diagnosis stage concludes: every finding with the cause this context gives it, and the causes
    ranked. `check`, `run`, `track` and the Watch all get theirs from `conclude`, so the same evidence gets the
    same cause and the same advice everywhere; the renderers only show it."""

    flags: list[Flag]
    diagnosis: list[dict]


def conclude(flags: Optional[list[Flag]], context: Context) -> Optional["Findings"]:
    """The diagnosis stage: None when no checks ran."""
    if flags is None:
        return None
    placed = in_context(flags, context)
    return Findings(placed, diagnose(placed, context))


def block_context(trace, step: Optional[int] = None) -> Context:
    """The context of findings about a traced block: its wiring and FFN, and the training step when known."""
    config = trace.config
    return Context(post_norm=trace.wiring.stream_normalised,
                   activation=config.ffn.value if config else None, step=step)


def in_context(flags: Optional[list[Flag]], context: Context) -> Optional[list[Flag]]:
    """Each finding with the cause the diagnosis gives it in this context (at step 0 the initialisation, in a
    Post-LN model the warm-up), so a finding's cause and the diagnosis never disagree."""
    if flags is None:
        return None
    return [dataclasses.replace(finding, cause=_cause_of(finding, context)) for finding in flags]


ADVICE = {
    Cause.LEARNING_RATE: phrase("lower the peak learning rate (a tenth is a first try), keep a warm-up, and clip the "
                                "gradient norm at 1.0"),
    Cause.WARMUP: phrase("add a learning-rate warm-up over the first few hundred steps (Xiong et al. 2020: Post-LN "
                         "needs one), and lower the peak learning rate if it still diverges"),
    Cause.INITIALISATION: phrase("re-initialise the weights at the usual scale — N(0, 0.02) as GPT-2 or std 1/√fan_in "
                                 "— with the residual output projections scaled by 1/√(2·layers)"),
    Cause.ARCHITECTURE: phrase("the FFN's units are dead: use GELU or SwiGLU instead of ReLU, or a lower learning "
                               "rate and FFN biases initialised at 0"),
    Cause.PRECISION: phrase("train in bfloat16 or float32, or keep float16 with a loss scaler (torch.amp.GradScaler) "
                            "and float32 norms and softmax"),
    Cause.MASK: phrase("apply the causal mask to the attention scores before the softmax (is_causal=True, or an "
                       "additive mask of -inf above the diagonal)"),
    Cause.RESIDUAL: phrase("add the un-normalised stream: x = x + sublayer(norm(x)) in Pre-LN, not norm(x) + "
                           "sublayer(...)"),
    Cause.NORM: phrase("make the norm normalise each token over its last dimension, and keep it in the forward path"),
    Cause.DATA: phrase("check the data pipeline: what reaches the model (NaN or Inf, a batch repeated, targets equal "
                       "to the inputs instead of shifted by one)"),
    Cause.OPTIMIZER: phrase("check the optimizer: that optimizer.step() runs after backward(), that it holds every "
                            "parameter of the model, its eps and betas (Adam: 1e-8, 0.9/0.95–0.999) and its weight "
                            "decay (≈ 0.1, off the norms' gains)"),
    Cause.GRADIENT_FLOW: phrase("find where the layer is cut from the loss: a .detach() or torch.no_grad() in the "
                                "forward, requires_grad=False set by mistake, or a hook that zeroes its gradient"),
    Cause.WEIGHTS: phrase("find the code that writes the weights outside the optimizer (loading, surgery, a hook, an "
                          "in-place op on a parameter) and reload the last good checkpoint"),
    Cause.TRAINING_LOOP: phrase("check the training loop's order and modes: optimizer.zero_grad() once per optimizer "
                                "step (before the next backward), optimizer.step() after backward() and before "
                                "zero_grad(), model.train() after every evaluation"),
    Cause.LOSS_FUNCTION: phrase("compute the loss as F.cross_entropy(logits, targets) on raw logits (no softmax "
                                "before it), averaged over the counted tokens (reduction='mean')"),
    Cause.UNKNOWN: phrase("the evidence says that training fails but points at no mechanism: compare the run with a "
                          "healthy one (blocktrace track RUN --against HEALTHY), and watch it with optimizer= given "
                          "so that the loop's invariants are checked"),
    Cause.ROUTING: phrase("train the router with the load-balance loss (Switch/Mixtral: router_aux_loss_coef 0.01 × "
                          "E·Σ f·P; in HF set output_router_logits) and the router z-loss (ST-MoE: 1e-3 × mean "
                          "logsumexp²), give the router a lower learning rate, and keep its logits and softmax in "
                          "float32"),
}


def _advice(cause: Cause, context: Context, findings: list[Flag]) -> str:
    """The cause's advice — or its leading finding's own, where that check says better what to do."""
    leading = next((f for f in findings if not CHECKS[f.name].symptom), findings[0])
    if CHECKS[leading.name].advice is not None:
        return CHECKS[leading.name].advice
    advice = ADVICE[cause]
    if cause is Cause.WARMUP and not context.post_norm:
        advice = phrase("add a learning-rate warm-up over the first few hundred steps, and lower the peak learning "
                        "rate")
    if cause is Cause.ARCHITECTURE and context.activation is not None and not FFNKind(context.activation).zero_below:
        advice = phrase("most FFN units never activate: check the FFN biases and the scale of the FFN input; lower "
                        "the learning rate")
    return advice


def _evidence(findings: list[Flag]) -> str:
    by_name: dict[str, list[Flag]] = {}
    for finding in findings:
        by_name.setdefault(finding.name, []).append(finding)
    parts = []
    for name, hits in by_name.items():
        layers = sorted({f.layer for f in hits if f.layer is not None})
        where = phrase(" at layer{s} {layers}", s="s" if len(layers) > 1 else "", layers=layer_ranges(layers)) \
            if layers else ""
        parts.append(phrase("{name}{where} ({detail})", name=name, where=where, detail=hits[0].detail))
    return "; ".join(parts)


def layer_ranges(numbers: list[int]) -> str:
    spans, start = [], None
    for index, number in enumerate(numbers):
        if start is None:
            start = number
        if index + 1 == len(numbers) or numbers[index + 1] != number + 1:
            spans.append(str(start) if start == number else f"{start}–{number}")
            start = None
    return ", ".join(spans)


def _observed(findings: list[Flag]) -> bool:
    """Whether a serious finding observed the fault itself (CHECKS' `direct`)."""
    return any(CHECKS[f.name].direct and f.level is not Level.INFO for f in findings)


def _score(cause: Cause, findings: list[Flag]) -> int:
    score = sum(WEIGHT[f.level] for f in {f.name: f for f in findings}.values())
    score += DEFINITE_BONUS if cause in DEFINITE or _observed(findings) else 0
    return score + (SCALE_BONUS if any(f.name == "weight_scale" for f in findings) else 0)


def diagnose(flags: list[Flag], context: Context = Context()) -> list[dict]:
    """Causes ranked most likely first, each with its evidence and advice; empty when nothing is wrong. Symptoms
    (a loss above uniform, a spike) join the most likely cause the other findings point to; alone, they name no
    mechanism: their own cause, "unknown" for those that say only that training fails."""
    serious = [f for f in flags if f.level is not Level.INFO]
    grouped: dict[Cause, list[Flag]] = {}
    for finding in serious:
        if not CHECKS[finding.name].symptom:
            grouped.setdefault(_cause_of(finding, context), []).append(finding)
    symptoms = [f for f in serious if CHECKS[f.name].symptom]
    if grouped and symptoms:
        top = min(grouped, key=lambda cause: (-_score(cause, grouped[cause]), cause.value))
        grouped[top] += symptoms
    else:
        for finding in symptoms:
            grouped.setdefault(_cause_of(finding, context), []).append(finding)
    scored = sorted(((_score(cause, findings), cause, findings) for cause, findings in grouped.items()),
                    key=lambda item: (-item[0], item[1].value))
    return [{"cause": cause.value, "score": score, "evidence": _evidence(findings),
             "advice": _advice(cause, context, findings)}
            for score, cause, findings in scored]
