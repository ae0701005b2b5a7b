"""Training judged over time: what a series of records says that no single record can.

A layer that gets no gradient or never moves, an optimizer that changes nothing, updates that vanish
or spike, a learning rate that jumps, weights that collapse or are zeroed, the loss itself (above
uniform, stuck, spiking, too good to be true) and, where a Watch saw the batch, the data.

One function, `judge(history, entry)`, serves the Watch (each record against the records before it)
and `track` (each record of a timeline or of a checkpoint series against the ones before): the same
evidence gives the same findings everywhere. Records are timeline records (training/timeline.py);
`update_ratio` there is ‖ΔW‖/‖W‖ since the record before, so it is divided by the steps between the
two to compare intervals of different lengths. Each check is one `@check(Scope.TRAINING, ...)` entry
below: its threshold, source and cause on the function that raises it (diagnose.checks).
"""

from __future__ import annotations

import math
import statistics
from typing import Iterator, Optional, Sequence

from blocktrace.phrases import phrase
from blocktrace.diagnose.audit import ADAM_FAMILY, in_zero_saddle
from blocktrace.diagnose.checks import Cause, Finding, Flag, Scope, check, detectors, finding
from blocktrace.diagnose.health import GAIN_HIGH, GAIN_LOW, LOSS_MARGIN, gain_extreme
from blocktrace.diagnose.history import learning_rates_before
from blocktrace.diagnose.invariants import next_token_training
from blocktrace.vocab import Level

WATCH = "watch"
MIN_SPIKE_HISTORY = 8  # recorded losses before a spike is judged against their spread
NORM_KIND = "norm"  # norm gains move unlike matrices (and Gemma's start at 0): left out of the update statistics
# Each defined once, cited in its check's entry; the healthy-run measurements are benchmarks/FAILURES.md's calibration half.
FROZEN_FRACTION = 0.02  # a layer moving less than this share of the median layer's per-step ‖ΔW‖/‖W‖
STILL = 1e-9  # per-step ‖ΔW‖/‖W‖ below this is no movement at all (float32 rounding of an unchanged tensor is 0)
TINY_UPDATE = 1e-5  # per-step ‖ΔW‖/‖W‖ of the median matrix: healthy calibration runs stay ≥ 10× above
TINY_LR = 1e-6  # a learning rate this small explains tiny updates by itself
# a learning rate this far below the largest the run has recorded: the schedule itself made the updates small
SCHEDULE_SHRANK = 100
# The optimizer's step found gradients below this share of the ones the backward left: the loop cut them in between
# (a clip acting on loss-scaled gradients then unscaled, a clip on a gradient 1,000 × its max_norm), so tiny updates
# are the loop's, not the optimizer's
GRADIENT_CUT = 1e-3
ADAM_TINY = 0.5  # Adam's per-step ‖ΔW‖/‖W‖ per unit of learning rate: ≈ |m̂/√v̂| / std(W), ≥ 1 for usual weights
# Adam's per-step rms(ΔW) per unit of learning rate, |m̂/√v̂| ≈ 0.1–1: tiny 10× below. The same bound as ADAM_TINY at
# std(W) 0.02 (0.5 × 0.02), and the one that holds at any weight size (a run whose weights grew 20× moves them
# 20× less relative to their norm at the same Adam step)
ADAM_TINY_STEP = ADAM_TINY * 0.02
RECTIFIED_ABOVE = 5.0  # RAdam's adaptive step needs ρ_t > 5 (Liu et al. 2020, Algorithm 2; torch.optim.RAdam)
SHRINK_PER_STEP = 0.9  # a tensor kind's ‖W‖ losing > 10% per step between two records (AdamW's decay: lr·λ ≈ 1e-4)
SPIKE_FACTOR = 10.0  # a record's ‖ΔW‖/‖W‖ per unit of learning rate against its median over the previous records
LR_JUMP = 10.0  # a learning rate against the largest one recorded before
MIN_HISTORY = 3  # records before a trend is judged
SKIP_RATE_PUBLISHED = 0.5  # LayerDrop / stochastic depth: Fan et al. 2020 train at 0.1–0.2, Huang et al. 2016 ≤ 0.5
SKIP_OBSERVATIONS = 12  # block-forwards seen over the records before a skip rate is judged
NORM_COLLAPSE = 0.25  # a tensor kind's ‖W‖ against its first record: healthy calibration runs stay ≥ 0.9
LOSS_SPIKE_SIGMAS, LOSS_SPIKE_WINDOW, LOSS_SPIKE_FLOOR = 6.0, 16, 0.25  # σ over the previous records, nats at least
STUCK_STEPS = 100  # steps after which a loss still at log V means nothing is learned
STUCK_MARGIN = 0.1  # nats below log V
L2_TOLERANCE = 0.02  # a norm's gain within 2% of 1/√d: the output of an L2 normalisation, not an RMS one
MIN_L2_WIDTH = 16  # below this 1/√d is too near 1 to tell an L2 norm from a gain
LEAK_LOSS = 0.05  # nats per token: no language model predicts text this well; the answer is in the input
# With targets equal to the inputs, a loss below this says the model copies them (it does not shift them). Set on
# the calibration half of benchmarks/failures.py: the run with unshifted labels fell to 0.10–0.15 nats, the healthy
# runs' lowest training loss was 2.39 (2.14 on the held-out half).
LABEL_COPY_LOSS = 0.5


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def interval_lr(before: dict, entry: dict) -> Optional[float]:
    """The learning rate of the steps between two records: the larger of the two recorded (None: not recorded)."""
    rates = [r for r in (before.get("lr"), entry.get("lr")) if _finite(r)]
    return max(rates) if rates else None


def _moved_kinds(layer: dict) -> Iterator[tuple[str, dict]]:
    """The layer's matrix kinds an optimizer may move (not the norms' gains, nor the kinds whose every tensor
    requires no gradient: a LoRA fine-tune's frozen base) that have an update ratio."""
    frozen = set(layer.get("frozen_kinds") or ())
    for kind, w in (layer.get("weights") or {}).items():
        if kind != NORM_KIND and kind not in frozen and _finite(w.get("update_ratio")):
            yield kind, w


def per_step_ratios(before: dict, entry: dict) -> dict[int, list[float]]:
    """Per layer: each matrix kind's ‖ΔW‖/‖W‖ between the two records, divided by the steps between them."""
    gap = entry["step"] - before["step"]
    if gap <= 0:
        return {}
    found = {}
    for layer in entry["layers"]:
        ratios = [w["update_ratio"] / gap for _, w in _moved_kinds(layer)]
        if ratios:
            found[layer["layer"]] = ratios
    return found


def _median_update(before: dict, entry: dict) -> Optional[float]:
    """The median matrix's per-step ‖ΔW‖/‖W‖ between two records, per unit of learning rate when it is known."""
    ratios = [r for values in per_step_ratios(before, entry).values() for r in values]
    if not ratios:
        return None
    lr = interval_lr(before, entry)
    return statistics.median(ratios) / (lr if lr else 1.0)


# --- gradients ---------------------------------------------------------------------------------------

@check(Scope.TRAINING, "no_gradient",
       "a layer whose parameters require a gradient gets none (grad null) or exactly 0 while "
       "other layers get one (a Watch)", "invariant: every trainable parameter on the loss's graph gets a "
       "gradient", "the layer is cut off from the loss: a .detach(), a no_grad block, or a gradient hook zeroes "
       "it; it never learns", Cause.GRADIENT_FLOW)
def _no_gradient(history: Sequence[dict], entry: dict) -> list[Finding]:
    """Layers whose parameters require a gradient and get none while others do (a Watch saw the gradients)."""
    if entry.get("source") != WATCH:
        return []
    norms = {layer["layer"]: layer.get("grad_norm") for layer in entry["layers"]}
    flowing = [n for n in norms.values() if _finite(n) and n > 0]
    if not flowing:
        return []  # nothing has a gradient: the Watch warns that step() came before backward()
    return [finding(Level.ERROR, None, layer["layer"], 0.0 if norm is None else norm,
                    phrase("gradient norm {norm} while other layers get up to {largest:.3g}",
                           norm="null" if norm is None else f"{norm:g}", largest=max(flowing)))
            for layer in entry["layers"] for norm in [norms[layer["layer"]]]
            if layer.get("trainable", True) is not False and (norm is None or norm == 0)]


@check(Scope.TRAINING, "blocks_cut_from_loss",
       "every block whose parameters require a gradient gets none (grad null) while the backward gave other "
       "parameters one (the model's gradient norm above 0) (a Watch)",
       "invariant: every trainable parameter on the loss's graph gets a gradient; a backward that reached the "
       "embeddings or the head but no block ran the blocks off the graph",
       "the blocks are cut from the loss: activation checkpointing with use_reentrant=True on inputs that need "
       "no gradient (frozen embeddings), a .detach() or torch.no_grad() around the blocks; they never learn",
       Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("let the gradient reach the blocks: torch.utils.checkpoint(..., use_reentrant=False), or an input "
                     "that requires grad; no detach or no_grad around the blocks"))
def _blocks_cut_from_loss(history: Sequence[dict], entry: dict) -> list[Finding]:
    blocks, norm = entry.get("blocks"), entry.get("grad_norm")
    if entry.get("source") != WATCH or not isinstance(blocks, dict) or not _finite(norm) or not norm > 0:
        return []
    trainable, cut = blocks.get("trainable"), blocks.get("without_gradient")
    if not isinstance(trainable, int) or trainable < 1 or cut != trainable:
        return []
    return [finding(Level.ERROR, None, None, norm,
                    phrase("none of the {trainable} trainable blocks got a gradient, while the model's gradient "
                           "norm is {norm:.3g}{enabled}", trainable=trainable, norm=norm, enabled=phrase(
                               "; {traced} of {count} blocks ran with gradients enabled in the recorded forward",
                               traced=blocks.get("traced"), count=blocks.get("count"))
                           if blocks.get("traced") != blocks.get("count") else ""))]


def _skips(history: Sequence[dict], entry: dict) -> tuple[int, int]:
    """Over the records a Watch wrote: the blocks' forwards skipped (LayerDrop) and the blocks' forwards seen."""
    seen = [r["blocks"] for r in (*history, entry) if isinstance(r.get("blocks"), dict)
            and isinstance(r["blocks"].get("skipped"), int) and isinstance(r["blocks"].get("count"), int)]
    return sum(b["skipped"] for b in seen), sum(b["count"] for b in seen)


def _past_published(skipped: int, forwards: int) -> bool:
    """More of the blocks' forwards skipped than any published LayerDrop rate, from enough of them seen."""
    return forwards >= SKIP_OBSERVATIONS and skipped / forwards > SKIP_RATE_PUBLISHED


def _skipped_mostly(history: Sequence[dict], entry: dict) -> bool:
    return _past_published(*_skips(history, entry))


@check(Scope.TRAINING, "blocks_skipped",
       f"blocks returned their very input at the recorded forward, skipped (info); over the run's records more than "
       f"{SKIP_RATE_PUBLISHED:.0%} of the blocks' forwards skipped, from {SKIP_OBSERVATIONS} seen (warning; a Watch)",
       "LayerDrop (Fan, Grave & Joulin 2020: rates 0.1–0.2, up to 0.5) and stochastic depth (Huang et al. 2016: the "
       "drop probability rising linearly to 0.5 at the last layer) skip a block at a training forward — its output is "
       "its input, it gets no gradient that step, and its residual identity and gradient are not judged. A rate "
       "above every published one leaves most of the network out of every forward",
       "the drop rate is too high: a survival probability given where the drop probability belongs (0.8 for 0.2), "
       "or a schedule that reaches 1; each block trains on a fraction of the steps and the network seen at "
       "evaluation (every block) is not the one trained", Cause.ARCHITECTURE,
       advice=phrase("set the LayerDrop / stochastic-depth probability of dropping a block (0.1–0.2 is usual; "
                     "check whether the setting is the probability to keep it)"))
def _blocks_skipped(history: Sequence[dict], entry: dict) -> list[Finding]:
    blocks = entry.get("blocks") if entry.get("source") == WATCH else None
    if not isinstance(blocks, dict) or not blocks.get("skipped"):
        return []
    skipped, forwards = _skips(history, entry)
    rate = skipped / forwards if forwards else 0.0
    high = _past_published(skipped, forwards)
    return [finding(Level.WARNING if high else Level.INFO, None, None, rate, phrase(
        "{now} of {count} blocks passed their input through at step {step}; {skipped} of {forwards} blocks' "
        "forwards skipped over the records ({rate:.0%})", now=blocks["skipped"], count=blocks.get("count"),
        step=entry["step"], skipped=skipped, forwards=forwards, rate=rate))]


@check(Scope.TRAINING, "gradient_misses_weights",
       "in a layer that gets a gradient, the matrices of one kind get a nonzero gradient at fewer entries than one "
       "of their rows or columns holds, at two records in a row (a Watch)",
       "calculus of a linear map y = x·Wᵀ: ∂L/∂W = δᵀ·x reaches every entry of every row whose unit gets a gradient "
       "(x is dense), so a weight used through its product with the input gets a nonzero gradient at a row's worth "
       "of entries at least; dead units zero whole rows, not all but a few entries. A zero-initialised partner "
       "(∂L/∂W1 ∝ W2 = 0 at step 0) passes by the next record",
       "the gradient does not reach the weights through the layer's product: a rounding or comparison in the "
       "forward (quantisation without a straight-through estimator), a detach on the weight; they never learn",
       Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("let the gradient reach the weights: w + (q(w) − w).detach() for a quantised or rounded weight "
                     "(the straight-through estimator), no detach on it"))
def _gradient_misses_weights(history: Sequence[dict], entry: dict) -> list[Finding]:
    flags = []
    for layer, earlier in _layers_with_record_before(history, entry):
        if layer.get("trainable") is False or not _finite(layer.get("grad_norm")) or not layer["grad_norm"] > 0 \
                or in_zero_saddle(layer) or _zero_held_still(earlier, layer, entry):  # a zero partner explains it
            continue
        missed = [kind for kind, w in (layer.get("weights") or {}).items()
                  if _misses(w) and _misses(((earlier or {}).get("weights") or {}).get(kind))]
        if missed:
            w = layer["weights"][missed[0]]
            flags.append(finding(Level.ERROR, None, layer["layer"], float(w["gradient_entries"]), phrase(
                "{kind} gets a nonzero gradient at {reached} of its entries (a row of it holds {line}), here and at the "
                "record before", kind=missed[0], reached=int(w["gradient_entries"]), line=int(w["line"]))))
    return flags


@check(Scope.TRAINING, "zero_matrix_not_updated",
       "a layer's weight matrix is exactly 0 at two records in a row, with a nonzero gradient at both and optimizer "
       "steps between them at learning rates above 0 (a Watch given the optimizer)",
       "definition of the first-order optimizers: a step on a nonzero gradient moves the weights (SGD's −lr·g, Adam's "
       "m̂/√v̂ ≠ 0 where g ≠ 0, Lion's sign), and a zero weight takes any step exactly; a zero matrix held at 0 under "
       "its gradient has a rule that scales the step by ‖w‖ — LAMB's or LARS's trust ratio ‖w‖/‖u‖ without the guard "
       "that sets it to 1 at ‖w‖ = 0 (You et al. 2019; NVIDIA apex's FusedLAMB; cybertronai/pytorch-lamb PR #6)",
       "a zero-initialised matrix (a residual branch's output projection, as Fixup and GPT-NeoX recipes zero it) never "
       "leaves 0, so its branch adds nothing and the matrices before it get no gradient", Cause.OPTIMIZER, direct=True,
       advice=phrase("guard the trust ratio: use 1 where ‖w‖ or ‖update‖ is 0 (LAMB's reference implementations do), "
                     "or do not zero-initialise the matrices such an optimizer updates"))
def _zero_matrix_not_updated(history: Sequence[dict], entry: dict) -> list[Finding]:
    flags = []
    for layer, earlier in _layers_with_record_before(history, entry):
        still = _zero_held_still(earlier, layer, entry)
        if still:
            flags.append(finding(Level.ERROR, None, layer["layer"], 0.0, phrase(
                "{kind} is exactly 0 at steps {start} and {end} under a nonzero gradient: "
                "{steps} optimizer steps left it there", kind=still[0], start=history[-1]["step"], end=entry["step"],
                steps=int(entry["loop"]["optimizer_steps"]))))
    return flags


def _layers_with_record_before(history: Sequence[dict], entry: dict) -> Iterator[tuple[dict, Optional[dict]]]:
    """Each layer of the record with the same layer at the record before (None where it was not traced then);
    nothing at a first record."""
    if not history:
        return
    before = {layer["layer"]: layer for layer in history[-1]["layers"]}
    for layer in entry["layers"]:
        yield layer, before.get(layer["layer"])


def _zero_held_still(before: Optional[dict], layer: dict, entry: dict) -> list[str]:
    """The matrices of a layer exactly 0 at the record before and now, with a gradient at nonzero entries at both,
    over optimizer steps at learning rates above 0 (a group at lr 0 is frozen on purpose: not judged)."""
    loop = entry.get("loop") or {}
    rates, steps = loop.get("lr_groups") or [], loop.get("optimizer_steps")
    if before is None or not _finite(steps) or steps < 1 or not rates or not all(_finite(r) and r > 0 for r in rates):
        return []
    earlier = before.get("weights") or {}
    return [kind for kind, w in (layer.get("weights") or {}).items()
            if _zero_with_gradient(w) and _zero_with_gradient(earlier.get(kind))]


def _zero_with_gradient(weights: Optional[dict]) -> bool:
    norm, reached = (weights or {}).get("norm"), (weights or {}).get("gradient_entries")
    return norm == 0 and _finite(reached) and reached > 0


def _misses(weights: Optional[dict]) -> bool:
    reached, line = (weights or {}).get("gradient_entries"), (weights or {}).get("line")
    return _finite(reached) and _finite(line) and reached < line


@check(Scope.TRAINING, "gradient_zero_everywhere",
       "every layer whose parameters require a gradient gets one of exactly 0 (not null: a backward ran); or none "
       "at all, neither when the Watch recorded nor when the optimizer stepped after it (a Watch given the optimizer)",
       "invariant: a loss that depends on the parameters gives some of them a non-zero gradient; exactly 0 "
       "everywhere means no path from the loss reaches any parameter with a non-zero derivative, and no gradient at "
       "all by the optimizer's step means the backward started from a tensor the parameters are not on the graph of; "
       "blocks at 0 while the model's gradient is not are a zero weight between them and the loss (a zero-initialised "
       "head: modded-nanogpt, µP's readout, Yang et al. 2021), which its first step moves",
       "the backward reaches no parameter: the loss is clamped or thresholded where its derivative is 0, "
       "multiplied by 0, or computed from detached values — no update can follow", Cause.GRADIENT_FLOW,
       direct=True,
       advice=phrase("make the loss differentiable in the parameters where it is: no clamp, round or threshold on it "
                     "(use the plain mean cross-entropy), no .detach() or .item() on the way from the logits to the loss"))
def _gradient_zero_everywhere(history: Sequence[dict], entry: dict) -> list[Finding]:
    if entry.get("source") != WATCH:
        return []
    if history and _no_gradient_by_the_step(history[-1], entry):
        return [finding(Level.ERROR, None, None, 0.0,
                        phrase("no trainable layer had a gradient at step {step}, neither when the Watch recorded nor "
                               "when the optimizer stepped: the backward reached no parameter", step=history[-1]['step']))]
    norms = [layer.get("grad_norm") for layer in entry["layers"] if layer.get("trainable", True) is not False]
    if not norms or not all(isinstance(n, (int, float)) and n == 0 for n in norms):
        return []
    if any(in_zero_saddle(layer) for layer in entry["layers"]):
        return []  # matrices at exactly 0 make the zero gradients themselves: the weights' fact (weights_zero_stuck)
    if _finite(entry.get("grad_norm")) and entry["grad_norm"] > 0:
        # the backward reached parameters outside the blocks: a weight at exactly 0 between the blocks and the loss
        # (a zero-initialised head, as modded-nanogpt's and µP's readout) stops it there for the steps it stays 0
        return []
    return [finding(Level.ERROR, None, None, 0.0,
                    phrase("every trainable layer's gradient is exactly 0 at step {step}: the backward reached no "
                           "parameter", step=entry['step']))]


def _no_gradient_by_the_step(previous: dict, entry: dict) -> bool:
    """The record before had trainable layers, none with a gradient (null), and the optimizer's step after it found
    none either (‖.grad‖ = 0 over its parameters, this record's loop.step_gradient): a backward called after
    watch.step() would have left one there."""
    trainable = [layer for layer in previous["layers"] if layer.get("trainable", True) is not False]
    loop = entry.get("loop") or {}
    return bool(trainable) and all(layer.get("grad_norm") is None for layer in trainable) \
        and loop.get("step_gradient") == 0 and loop.get("step_gradient_at") == previous.get("step")


# --- the loss ----------------------------------------------------------------------------------------

def _uniform(entry: dict) -> Optional[float]:
    """log V, the loss of guessing every token equally likely, when the record says the vocabulary."""
    vocab = entry.get("vocab")
    return math.log(vocab) if isinstance(vocab, int) and vocab > 1 else None


def _above_uniform(entry: dict) -> bool:
    loss, uniform = entry.get("loss"), _uniform(entry)
    return loss is not None and uniform is not None and (not math.isfinite(loss) or loss > uniform + LOSS_MARGIN)


# relative: the float32 rounding of a logsumexp over a vocabulary is ~1e-6 (invariants.WORST_TOLERANCE's reason)
BOUND_TOLERANCE = 1e-3


def _no_cross_entropy(entry: dict) -> bool:
    """The recorded loss is above the mean over rows of each row's largest −log p of the recorded logits: no
    cross-entropy of them at one class per row reaches it, so it holds other terms (Poly-1's ε(1 − p_t), an
    unlikelihood term) and says nothing of how the predictions compare with uniform guessing."""
    ratio = ((entry.get("loop") or {}).get("loss_over_mean_worst_cross_entropy"))
    return isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 1 + BOUND_TOLERANCE


@check(Scope.TRAINING, "loss_above_uniform")  # declared in diagnose.health, for a checkpoint's loss
def _loss_above_uniform(history: Sequence[dict], entry: dict) -> list[Finding]:
    """Over training, one record above uniform is a transient a healthy run can recover from (an SGD run's spike):
    info; an error when it is not finite, was above uniform at the record before too, or is at step 0 (before
    any update: the initialisation's). A finite loss that no cross-entropy of the recorded logits reaches is not
    judged (_no_cross_entropy)."""
    if not _above_uniform(entry) or (math.isfinite(entry["loss"]) and _no_cross_entropy(entry)):
        return []
    lasting = not math.isfinite(entry["loss"]) or entry["step"] == 0 or (bool(history) and _above_uniform(history[-1]))
    return [finding(Level.ERROR if lasting else Level.INFO, None, None, entry["loss"],
                    phrase("loss {loss:.4g} against log V = {uniform:.4g} for uniform guessing{so_far}",
                           loss=entry["loss"], uniform=_uniform(entry),
                           so_far="" if lasting else phrase(" (at this record only, so far)")))]


@check(Scope.TRAINING, "loss_stuck",
       f"after {STUCK_STEPS} steps the loss is still above log V − {STUCK_MARGIN:g} (V: the "
       "vocabulary)", "definition: log V is the loss of predicting every token equally likely",
       "the model has learned nothing in a hundred steps", Cause.UNKNOWN, symptom=True)
def _loss_stuck(history: Sequence[dict], entry: dict) -> list[Finding]:
    loss, uniform = entry.get("loss"), _uniform(entry)
    if loss is None or uniform is None or _above_uniform(entry) or entry["step"] < STUCK_STEPS or \
            not loss > uniform - STUCK_MARGIN:
        return []
    return [finding(Level.ERROR, None, None, loss,
                    phrase("loss {loss:.4g} at step {step}, log V = {uniform:.4g}", loss=loss, step=entry['step'],
                           uniform=uniform))]


@check(Scope.TRAINING, "loss_negative",
       "the loss < 0 (an error where the record says the vocabulary the model's logits span, a warning where it "
       "does not)",
       "definition: a cross-entropy is −log p ≥ 0 for every token, and label smoothing, a z-loss and a load-balance "
       "loss are ≥ 0 too; an objective of another kind (a policy gradient) can be negative, hence only a warning "
       "without logits over a vocabulary",
       "the loss is no cross-entropy of the model's probabilities: nll_loss given logits where it wants "
       "log_softmax, a sign flipped, probabilities where log-probabilities belong", Cause.LOSS_FUNCTION)
def _loss_negative(history: Sequence[dict], entry: dict) -> list[Finding]:
    loss = entry.get("loss")
    if loss is None or not math.isfinite(loss) or not loss < 0:
        return []
    level = Level.ERROR if _uniform(entry) is not None else Level.WARNING
    return [finding(level, None, None, loss, phrase("loss {loss:.4g}, below 0", loss=loss))]


@check(Scope.TRAINING, "loss_near_zero",
       f"the training loss < {LEAK_LOSS:g} nats per token after step 0",
       "healthy-run measurement: language models stay far above (benchmarks/FAILURES.md: ≥ 1 nat on "
       "characters)", "the model predicts its targets almost perfectly: they leak into its input (labels "
       "equal to the inputs, no shift) or it memorises one repeated batch", Cause.DATA)
def _loss_near_zero(history: Sequence[dict], entry: dict) -> list[Finding]:
    loss = entry.get("loss")
    if loss is None or not math.isfinite(loss) or entry["step"] <= 0 or not 0 <= loss < LEAK_LOSS:
        return []  # below 0 is no leak but no cross-entropy at all: loss_negative's
    return [finding(Level.ERROR, None, None, loss, phrase("loss {loss:.3g} nats per token", loss=loss))]


@check(Scope.TRAINING, "loss_spike",
       f"the loss > mean + {LOSS_SPIKE_SIGMAS:g}σ of the previous {LOSS_SPIKE_WINDOW} records "
       f"(at least {MIN_SPIKE_HISTORY}) and > mean + {LOSS_SPIKE_FLOOR:g} nats",
       "OLMo-core's stability monitor (a spike is > 6σ above the last 128 values), on the recorded steps",
       "the loss jumped well beyond its recent noise", Cause.UNKNOWN, symptom=True)
def _loss_spike(history: Sequence[dict], entry: dict) -> list[Finding]:
    loss = entry.get("loss")
    recent = [r["loss"] for r in history[-LOSS_SPIKE_WINDOW:] if _finite(r.get("loss"))]
    if loss is None or not math.isfinite(loss) or len(recent) < MIN_SPIKE_HISTORY:
        return []
    mean = statistics.fmean(recent)
    if not loss > mean + LOSS_SPIKE_FLOOR:
        return []  # below the floor whatever the spread: the exact (and slow) pstdev is spared
    spread = statistics.pstdev(recent)
    if not loss > mean + LOSS_SPIKE_SIGMAS * spread:
        return []
    return [finding(Level.ERROR, None, None, loss,
                    phrase("loss {loss:.4g} against {mean:.4g} ± {spread:.2g} over the previous {count} records",
                           loss=loss, mean=mean, spread=spread, count=len(recent)))]


# --- the norms across the model ---------------------------------------------------------------------

def _norm_gains(entry: dict) -> list[float]:
    """Every norm's effective gain (rms) in every layer of the record; empty unless every layer has some."""
    layers = entry.get("layers") or []
    per_layer = [list((layer.get("norm_gains") or {}).values()) for layer in layers]
    if not per_layer or not all(per_layer):
        return []
    return [gain for gains in per_layer for gain in gains if _finite(gain)]


def _l2_scaled(entry: dict, gains: list[float]) -> bool:
    width = entry.get("width")
    if not isinstance(width, int) or width < MIN_L2_WIDTH or not gains:
        return False
    expected = width ** -0.5
    return all(abs(gain - expected) <= L2_TOLERANCE * expected for gain in gains)


@check(Scope.TRAINING, "norm_is_l2",
       f"every norm of every layer scales its output to rms 1/√d (within {L2_TOLERANCE:.0%}; d ≥ {MIN_L2_WIDTH}, the "
       "width)", "definition: RMSNorm divides by √(mean x²) = ‖x‖/√d; dividing by ‖x‖ alone (F.normalize) leaves "
       "every token at rms 1/√d, and no set of learned gains lands on that value in every norm",
       "the norms divide by the L2 norm where the RMS belongs (F.normalize without × √d): every sublayer reads "
       "inputs √d times too small", Cause.NORM)
def _norm_is_l2(history: Sequence[dict], entry: dict) -> list[Finding]:
    gains = _norm_gains(entry)
    if not _l2_scaled(entry, gains):
        return []
    return [finding(Level.ERROR, None, None, statistics.fmean(gains),
                    phrase("every norm's output has rms {gain:.3g} = 1/√{width}", gain=statistics.fmean(gains),
                           width=entry["width"]))]


@check(Scope.TRAINING, "norm_gains_not_one",
       f"at a run's first record (step 0), whose loss is still near uniform guessing (≥ log V − {LOSS_MARGIN:g}), "
       f"every norm of every layer has an effective gain outside [{GAIN_LOW:g}, {GAIN_HIGH:g}]",
       "definition: LayerNorm and RMSNorm initialise their gains to 1 (Ba et al. 2016; Zhang & Sennrich 2019; "
       "Gemma's (1 + w) with w = 0); a pretrained model being fine-tuned may have learned such gains, but its loss "
       "is far below uniform",
       "the norms were initialised far from gain 1 (a custom init that draws every weight, the gains included, from "
       "N(0, 0.02)): every sublayer's input is rescaled by it", Cause.INITIALISATION)
def _norm_gains_not_one(history: Sequence[dict], entry: dict) -> list[Finding]:
    gains, loss, uniform = _norm_gains(entry), entry.get("loss"), _uniform(entry)
    if history or entry.get("step") != 0 or not gains or loss is None or uniform is None or \
            not (not math.isfinite(loss) or loss >= uniform - LOSS_MARGIN):
        return []
    if not all(gain_extreme(gain) for gain in gains) or _l2_scaled(entry, gains):
        return []  # the L2 signature is norm_is_l2's
    return [finding(Level.ERROR, None, None, statistics.fmean(gains),
                    phrase("every norm's gain rms is between {low:.3g} and {high:.3g} at step 0, the loss {loss:.4g} "
                           "against log V = {uniform:.4g}", low=min(gains), high=max(gains), loss=loss,
                           uniform=uniform))]


# --- the data a Watch saw ----------------------------------------------------------------------------

@check(Scope.TRAINING, "repeated_batch",
       "the recorded batch equals the one recorded before (a Watch)",
       "invariant: a data loader over a corpus gives other batches at other steps",
       "the model sees the same batch again and again: a loader that restarts or a fixed batch", Cause.DATA)
def _repeated_batch(history: Sequence[dict], entry: dict) -> list[Finding]:
    if not (entry.get("data") or {}).get("repeated"):
        return []
    return [finding(Level.ERROR, None, None, 1.0,
                    phrase("this step's batch equals the batch of the record before"))]


@check(Scope.TRAINING, "labels_are_inputs",
       "the targets passed to the model equal its input ids (a Watch; HF's models, which "
       f"shift them inside, are not reported): info, an error once the loss is below {LABEL_COPY_LOSS:g} nats "
       "per token", "definition of next-token prediction: the target of position t is the token at t + 1; the "
       "loss level from the calibration half of the failure benchmark", "the targets are the inputs unshifted: "
       "unless the model shifts them, each position learns to copy its own token", Cause.DATA)
def _labels_are_inputs(history: Sequence[dict], entry: dict) -> list[Finding]:
    loss = entry.get("loss")
    if not (entry.get("data") or {}).get("labels_are_inputs"):
        return []
    copying = _finite(loss) and loss < LABEL_COPY_LOSS
    return [finding(Level.ERROR if copying else Level.INFO, None, None, 1.0,
                    phrase("the targets passed to the model are its input ids, unshifted{copies}", copies=phrase(
                        ", and the loss is {loss:.3g} nats per token: the model copies them", loss=loss)
                        if copying else ""))]


# --- how the weights moved since the record before ---------------------------------------------------

def _largest_moves(history: Sequence[dict], entry: dict) -> Optional[dict[int, float]]:
    """Per layer, its largest per-step ‖ΔW‖/‖W‖ since the record before; None when there is nothing to compare."""
    per_layer = per_step_ratios(history[-1], entry) if history else {}
    return {layer: max(values) for layer, values in per_layer.items()} if per_layer else None


def _still(history: Sequence[dict], entry: dict) -> bool:
    """No layer moved: no_update's case (or a learning rate of 0), which the other movement checks leave alone."""
    largest = _largest_moves(history, entry)
    return largest is not None and max(largest.values()) < STILL


def _skipped_by_scaler(record: dict) -> bool:
    """Whether the step right after this record had non-finite gradients (its grad_norm inf or NaN): a GradScaler
    then skips optimizer.step() on purpose, so the weights standing still after it are the scaler's choice. (Over a
    longer interval with nothing moving, the skips went on: the non-finite gradients are gradient_exploding's.)"""
    norm = record.get("grad_norm")
    return isinstance(norm, float) and not math.isfinite(norm)


@check(Scope.TRAINING, "no_update",
       f"no layer's weights move (per-step ‖ΔW‖/‖W‖ < {STILL:g}) between two records while the "
       f"learning rate is above 0 (learning_rate when it is below {TINY_LR:g} or below 1/{SCHEDULE_SHRANK} of the "
       "largest the run recorded)", "invariant: an optimizer step with lr > 0 and a gradient moves the weights",
       "the optimizer changes nothing: it holds other parameters than the model's, or (the loop's fault, where the "
       "Watch was given the optimizer and counted no optimizer.step() between the records) it is never stepped, or "
       "(the schedule's) the learning rate was brought so low that a step cannot move a weight",
       Cause.OPTIMIZER)
def _no_update(history: Sequence[dict], entry: dict) -> list[Finding]:
    if not _still(history, entry):
        return []
    before, largest, lr = history[-1], _largest_moves(history, entry), interval_lr(history[-1], entry)
    if lr is not None and lr <= 0:
        return []  # a learning rate of 0 is a choice (a frozen phase), not a fault
    if entry["layers"] and all(layer.get("trainable") is False for layer in entry["layers"]):
        return []  # the blocks are frozen on purpose (only the embeddings or the head train): nothing to move
    if _skipped_by_scaler(before):
        return []  # the gradients of the step after `before` were not finite: a loss scaler skips that step
    if _skipped_mostly(history, entry):
        return []  # blocks skipped at most forwards get no gradient for steps on end: blocks_skipped says why
    detail = phrase("no layer moved between steps {before} and {after}{at_lr}", before=before["step"],
                    after=entry["step"], at_lr=_at_learning_rate(lr))
    if (entry.get("loop") or {}).get("optimizer_steps") == 0:  # the Watch counted none: the loop never called it
        return [finding(Level.ERROR, None, None, max(largest.values()),
                        detail + phrase("; optimizer.step() was not called between them"), Cause.TRAINING_LOOP)]
    # a step moves a weight by a few lr at most (Adam's |m̂/√v̂| ≤ about 1): at such a rate nothing can move
    shrunk = lr is not None and (lr < TINY_LR or _schedule_shrank(history, lr))
    return [finding(Level.ERROR, None, None, max(largest.values()), detail,
                    Cause.LEARNING_RATE if shrunk else None)]


@check(Scope.TRAINING, "optimizer_steps_skipped",
       "optimizer.step() ran at fewer than half of the watch.step() calls between two records, after an interval "
       "in which it ran at every one (a Watch given optimizer=)",
       "definition of the loop: each training step ends with an optimizer step (gradient accumulation steps once "
       "every k calls from the start: its rhythm does not change); a loop that stepped at every call and now skips "
       "most has started throwing its gradients away",
       "a guard skips the updates: a loss-spike guard that compares each loss with the best one so far (not with a "
       "running mean), so most steps count as spikes once the loss stops improving at every step; a loss scale "
       "whose gradients overflow at every step", Cause.TRAINING_LOOP,
       advice=phrase("log when and why optimizer.step() is skipped; a spike guard compares with a running mean of "
                     "recent losses (2× or more), not with the best loss so far"))
def _optimizer_steps_skipped(history: Sequence[dict], entry: dict) -> list[Finding]:
    def interval(before: dict, after: dict) -> Optional[tuple[int, int]]:
        steps, calls = (after.get("loop") or {}).get("optimizer_steps"), after["step"] - before["step"]
        return (steps, calls) if isinstance(steps, int) and calls > 0 else None

    if not history or (now := interval(history[-1], entry)) is None or not now[0] < now[1] / 2:
        return []
    records = [*history, entry]
    if not any((done := interval(a, b)) is not None and done[0] == done[1] for a, b in zip(records, records[1:-1])):
        return []
    return [finding(Level.WARNING, None, None, now[0] / now[1], phrase(
        "optimizer.step() ran {steps} times in the {calls} steps before step {step}, at every step earlier",
        steps=now[0], calls=now[1], step=entry["step"]))]


# the smallest peak learning rate published Adam-family pre-training uses is GPT-3 175B's 6e-5 (Brown et al. 2020,
# Table 2.1; LLaMA-65B 1.5e-4, Chinchilla 1e-4); below a sixth of it a model trained from scratch barely moves.
# Fine-tuning (RLHF, DPO: 1e-6 and below) starts from a trained model and is not judged
PRETRAINING_LR_FLOOR = 1e-5
FROM_SCRATCH_NATS = 1.0  # a first loss within this of log V: the model starts from its initialisation


def _rates(record: dict) -> list[float]:
    """The record's learning rates: every param group's, else the one the record holds."""
    rates = [r for r in ((record.get("loop") or {}).get("lr_groups") or []) if _finite(r)]
    return rates or ([record["lr"]] if _finite(record.get("lr")) else [])


def _from_scratch(first: dict) -> bool:
    """Whether the run's first record is a model at its initialisation: its loss within FROM_SCRATCH_NATS of log V."""
    loss, vocab = first.get("loss"), first.get("vocab")
    return _finite(loss) and isinstance(vocab, int) and vocab > 1 and loss >= math.log(vocab) - FROM_SCRATCH_NATS


@check(Scope.TRAINING, "learning_rate_below_pretraining",
       f"an Adam-family optimizer training a language model (targets: the next tokens) from scratch (the first "
       f"record's loss within {FROM_SCRATCH_NATS:g} nat of log V) has had no learning rate above "
       f"{PRETRAINING_LR_FLOOR:g} in any param group at any record, and its learning rate has stopped rising (not "
       "below the record before's: a warm-up is not judged) (a Watch)",
       "published Adam-family pre-training: the smallest peak learning rate is GPT-3 175B's 6e-5 (Brown et al. 2020, "
       "Table 2.1; LLaMA-65B 1.5e-4, Chinchilla 1e-4, GPT-2-sized models 6e-4); Adam moves each weight by about lr "
       "per step, so at a sixth of the smallest a model at its initialisation barely leaves it. Fine-tuning a "
       "trained model (RLHF, DPO: 1e-6 and below) starts far below log V and is not judged",
       "the learning rate is far below any pre-training recipe's: a fine-tuning rate used from scratch, a warm-up "
       "factor or a scheduler's floor taken for the peak, a unit slip (1e-6 for 1e-3)", Cause.LEARNING_RATE,
       advice=phrase("use a pre-training learning rate (6e-4 for a GPT-2-sized model, 3e-4 to 1e-4 for billions of "
                     "parameters) with a warm-up, and print each param group's learning rate over the first steps"))
def _learning_rate_below_pretraining(history: Sequence[dict], entry: dict) -> list[Finding]:
    if not history or ADAM_FAMILY not in str(entry.get("optimizer") or "").lower() or not _from_scratch(history[0]) \
            or not next_token_training(entry):
        return []
    now, before = _rates(entry), _rates(history[-1])
    # every record's learning rate: History keeps the largest seen, beside the records it still holds
    seen = [r for r in (learning_rates_before(history)[1],) if r is not None]
    largest = max((*seen, *(r for record in (*history, entry) for r in _rates(record))), default=None)
    if not now or not before or largest is None or not 0 < largest <= PRETRAINING_LR_FLOOR \
            or max(now) > max(before):
        return []
    return [finding(Level.ERROR, None, None, largest,
                    phrase("{optimizer} from scratch at learning rates no higher than {largest:.3g} since the first "
                           "record (published pre-training peaks: 6e-5 and above)",
                           optimizer=entry.get("optimizer"), largest=largest))]


@check(Scope.TRAINING, "layer_frozen",
       f"a layer's largest per-step ‖ΔW‖/‖W‖ < {FROZEN_FRACTION:g} × the median moving layer's between "
       "two records (an error in a Watch's records when its parameters require a gradient; info when they do not, "
       "and between checkpoints, which cannot say)",
       "healthy-run measurement: layers of one model move within 10× of each other (benchmarks/FAILURES.md)",
       "the layer's weights do not move while the others train: frozen by mistake or cut off from the loss",
       Cause.GRADIENT_FLOW)
def _layer_frozen(history: Sequence[dict], entry: dict) -> list[Finding]:
    largest = _largest_moves(history, entry)
    if largest is None or _still(history, entry):
        return []
    # the median of the layers that move: where most layers stand still (a fine-tune of the top block, or most
    # layers cut off), the median of all would be 0 and nothing would stand out
    typical = statistics.median(moved for moved in largest.values() if moved >= STILL)
    # only a Watch knows whether a layer's parameters require a gradient; between checkpoints a layer frozen on
    # purpose (a fine-tune) and one cut off from the loss look the same: info, said so, never a verdict
    trainable = {layer["layer"]: layer.get("trainable") for layer in entry["layers"]}
    return [finding(Level.ERROR if trainable.get(layer) is True else Level.INFO, None, layer, moved,
                    phrase("per-step ‖ΔW‖/‖W‖ at most {moved:.3g} against the median moving layer's {typical:.3g}{why}",
                           moved=moved, typical=typical, why={
                               True: "", False: phrase(" (its parameters do not require a gradient)")}.get(
                               trainable.get(layer), phrase(" (frozen on purpose or cut off from the loss: checkpoints "
                                                            "cannot tell; a Watch can)"))))
            for layer, moved in largest.items() if moved < FROZEN_FRACTION * typical]


@check(Scope.TRAINING, "updates_tiny",
       f"the median matrix's per-step ‖ΔW‖/‖W‖ < {TINY_UPDATE:g} in the layers that move, require a gradient and had "
       f"a nonzero one at the step (the others are layer_frozen's; in a Watch, matrices that require no gradient — "
       f"a LoRA fine-tune's frozen base — left out), or, under an Adam-family (RAdam past its first "
       f"steps, where ρ_t ≤ {RECTIFIED_ABOVE:g} makes its step lr·m̂) "
       f"optimizer (a Watch given optimizer=), its per-step rms(ΔW) < {ADAM_TINY_STEP:g} × the learning rate "
       f"(records without element counts: ‖ΔW‖/‖W‖ < {ADAM_TINY:g} × the learning rate; learning_rate when the "
       f"learning rate is below {TINY_LR:g} or below 1/{SCHEDULE_SHRANK} of the largest the run recorded — the "
       f"schedule shrank it —, else optimizer)",
       "Kingma & Ba 2015: Adam moves each weight by about lr·|m̂/√v̂| with |m̂/√v̂| ≈ 0.1–1, so rms(ΔW) per unit "
       "of learning rate is about that whatever the weights' size (‖ΔW‖/‖W‖ per unit of learning rate ≈ 10 at std "
       "0.02); healthy-run measurement (benchmarks/FAILURES.md, calibration half)",
       "the weights barely move: nothing is learned",
       Cause.OPTIMIZER,
       advice=phrase("make the updates reach the weights: check the optimizer's learning rate, eps (Adam's 1e-8) and "
                     "betas, and that every parameter is in a param group"))
def _updates_tiny(history: Sequence[dict], entry: dict) -> list[Finding]:
    largest = _largest_moves(history, entry)
    if largest is None or _still(history, entry):
        return []
    lr = interval_lr(history[-1], entry)
    # the optimizer's updates are judged where it makes them: a layer whose parameters require no gradient, or that
    # does not move at all while others do (no update reaches it: frozen or cut off from the loss), is layer_frozen's
    unreached = {layer["layer"] for layer in entry["layers"] if layer.get("trainable") is False} | {
        layer for layer, moved in largest.items() if moved < STILL} | _without_gradient(history[-1])
    ratios = [r for layer, values in per_step_ratios(history[-1], entry).items() if layer not in unreached
              for r in values]
    if not ratios:
        return []
    median = statistics.median(ratios)
    adam = "adam" in str(entry.get("optimizer") or "").lower() and not _unrectified(entry)
    if not (median < TINY_UPDATE or (adam and lr and _adam_step_tiny(history[-1], entry, median, lr, unreached))):
        return []
    cut = _gradient_cut(history[-1], entry)
    cause = Cause.LEARNING_RATE if lr is not None and (lr < TINY_LR or _schedule_shrank(history, lr)) \
        else Cause.TRAINING_LOOP if cut is not None and cut < GRADIENT_CUT else Cause.OPTIMIZER
    return [finding(Level.ERROR, None, None, median, phrase(
        "the median matrix moves {median:.3g} of its norm per step{at_lr}{cut}", median=median,
        at_lr=_at_learning_rate(lr), cut=phrase(": the optimizer's step found gradients {cut:.2g} × the ones the "
                                                "backward left", cut=cut)
        if cause is Cause.TRAINING_LOOP else ""), cause)]


def _without_gradient(before: dict) -> set[int]:
    """The layers whose gradient was exactly 0 when the step after `before` was taken: no optimizer follows a zero
    gradient (a weight decay alone moves them), so their small move is no fault of the update (a zero-initialised
    head stops the first backward at the blocks; whatever zeroes a gradient is gradient_zero_everywhere's)."""
    return {layer["layer"] for layer in before.get("layers", []) if layer.get("grad_norm") == 0}


def _gradient_cut(before: dict, entry: dict) -> Optional[float]:
    """The gradient norm the optimizer's step after `before` found, over the one `before` recorded after its
    backward (as the loss's own where a loss scale was seen): below 1 where the loop cut the gradients between the
    two (a clip, an unscale); None where either is missing."""
    loop = entry.get("loop") or {}
    stepped, recorded = loop.get("step_gradient"), before.get("grad_norm")
    if loop.get("step_gradient_at") != before.get("step") or not _finite(stepped) or not _finite(recorded) \
            or recorded <= 0:
        return None
    return stepped / recorded


def _schedule_shrank(history: Sequence[dict], lr: float) -> bool:
    """Whether the run's schedule brought the learning rate to 1/SCHEDULE_SHRANK of its largest recorded value."""
    peak = max((r["lr"] for r in history if _finite(r.get("lr"))), default=None)
    return peak is not None and peak > 0 and lr <= peak / SCHEDULE_SHRANK


def _at_learning_rate(lr: Optional[float]) -> str:
    return "" if lr is None else phrase(" at learning rate {lr:g}", lr=lr)


def _unrectified(entry: dict) -> bool:
    """Whether the interval's first optimizer step is one of RAdam's first steps, which take lr·m̂ (SGD with momentum)
    instead of Adam's lr·m̂/√v̂ while ρ_t = ρ_∞ − 2tβ2^t/(1 − β2^t) ≤ 5 (ρ_∞ = 2/(1 − β2) − 1: t ≤ 5 at β2 0.999), so
    Adam's per-step size says nothing of them; also where the step count or β2 is not known."""
    loop = entry.get("loop") or {}
    optimizer = loop.get("optimizer") or {}
    if "radam" not in str(optimizer.get("class") or entry.get("optimizer") or "").lower():
        return False
    groups, t = optimizer.get("groups") or [{}], loop.get("update_step")
    betas = groups[0].get("betas") or []
    if not _finite(t) or t < 1 or len(betas) != 2 or not _finite(betas[1]) or not 0 < betas[1] < 1:
        return True
    beta2 = betas[1]
    rho = 2 / (1 - beta2) - 1 - 2 * t * beta2 ** t / (1 - beta2 ** t)
    return rho <= RECTIFIED_ABOVE


def _adam_step_tiny(before: dict, entry: dict, median_ratio: float, lr: float, unreached: set) -> bool:
    """Whether Adam's median per-step rms(ΔW) over the layers not `unreached` is below ADAM_TINY_STEP × lr; by
    ‖ΔW‖/‖W‖ against ADAM_TINY × lr where the records do not count their elements (timelines written before they
    did)."""
    steps = _per_step_sizes(before, entry, unreached)
    if steps is None:
        return median_ratio < ADAM_TINY * lr
    return statistics.median(steps) < ADAM_TINY_STEP * lr


def _per_step_sizes(before: dict, entry: dict, unreached: set) -> Optional[list[float]]:
    """Each matrix kind's per-step rms(ΔW) = ‖ΔW‖ / √n / steps, ‖ΔW‖ = update_ratio × ‖W‖ as it was in `before`,
    in the layers not `unreached`; None unless every moved kind has its element count and its earlier norm."""
    gap, earlier = entry["step"] - before["step"], {layer["layer"]: layer for layer in before["layers"]}
    sizes = []
    for layer in entry["layers"]:
        if layer["layer"] in unreached:
            continue
        for kind, w in _moved_kinds(layer):
            then = ((earlier.get(layer["layer"]) or {}).get("weights") or {}).get(kind) or {}
            if not (_finite(then.get("norm")) and isinstance(w.get("elements"), int) and w["elements"] > 0):
                return None
            sizes.append(w["update_ratio"] * then["norm"] / math.sqrt(w["elements"]) / gap)
    return sizes or None


@check(Scope.TRAINING, "update_spike",
       f"a record's median ‖ΔW‖/‖W‖ per unit of learning rate > {SPIKE_FACTOR:g} × its median "
       f"over the previous records (at least {MIN_HISTORY}) and > {SPIKE_FACTOR:g} × the last of them",
       "Kingma & Ba 2015: Adam's update per element is bounded by about the learning rate, so per unit of "
       "learning rate it stays steady; Marin #1368: update-norm spikes precede loss spikes",
       "one update was far larger than the ones before: a spike that can "
       "throw the model off", Cause.LEARNING_RATE, symptom=True)
def _update_spike(history: Sequence[dict], entry: dict) -> list[Finding]:
    """An update far larger, per unit of learning rate, than the ones before."""
    if not history:
        return []
    now = _median_update(history[-1], entry)
    if now is None:
        return []  # nothing moved to judge: the window's intervals are spared
    window = list(history[-LOSS_SPIKE_WINDOW:])
    earlier = [u for a, b in zip(window, window[1:]) for u in [_median_update(a, b)] if u]
    # one interval far above the ones before it, and above the last of them: updates that grow steadily (an
    # optimizer that estimates its own step size, Prodigy or D-Adaptation, under a fixed group lr) are no spike
    if len(earlier) < MIN_HISTORY or not now > SPIKE_FACTOR * max(statistics.median(earlier), earlier[-1]):
        return []
    factor = now / statistics.median(earlier)
    return [finding(Level.ERROR, None, None, factor,
                    phrase("‖ΔW‖/‖W‖ per unit of learning rate {factor:.3g}× its median over the previous {count} "
                           "intervals", factor=factor, count=len(earlier)))]


@check(Scope.TRAINING, "lr_jump",
       f"the learning rate > {LR_JUMP:g} × the largest recorded before (after {MIN_HISTORY - 1} "
       "records)", "invariant: warm-up and decay schedules change the learning rate smoothly",
       "the learning rate jumped: a scheduler bug, a resumed run with the wrong state, or a unit slip",
       Cause.LEARNING_RATE,
       advice=phrase("fix the learning-rate schedule: warm-up and decay change it gradually (check the scheduler's "
                     "state when resuming, and the units of the peak)"))
def _lr_jump(history: Sequence[dict], entry: dict) -> list[Finding]:
    count, largest = learning_rates_before(history)
    lr = entry.get("lr")
    if not history or not _finite(lr) or count < MIN_HISTORY - 1 or largest <= 0 or not lr > LR_JUMP * largest:
        return []
    return [finding(Level.ERROR, None, None, lr,
                    phrase("learning rate {lr:g}, {factor:.3g}× the largest recorded before ({largest:g})", lr=lr,
                           factor=lr / largest, largest=largest))]


# --- the weights' norms ------------------------------------------------------------------------------

def kind_norms(entry: dict) -> dict[tuple[int, str], float]:
    """‖W‖ per (layer, tensor kind) in a record."""
    return {(layer["layer"], kind): w["norm"] for layer in entry["layers"]
            for kind, w in (layer.get("weights") or {}).items() if _finite(w.get("norm"))}


def _zeroed(history: Sequence[dict], entry: dict) -> dict[int, tuple[str, float]]:
    """Per layer, the first tensor kind whose ‖W‖ shrank by more than SHRINK_PER_STEP per step since the record
    before: (kind, norm)."""
    if not history:
        return {}
    before = history[-1]
    now, previous, found = kind_norms(entry), kind_norms(before), {}
    gap = max(1, entry["step"] - before["step"])
    for (layer, kind), norm in now.items():
        if layer not in found and norm < SHRINK_PER_STEP ** gap * previous.get((layer, kind), 0):
            found[layer] = (kind, norm)
    return found


@check(Scope.TRAINING, "weights_zeroed",
       f"a tensor kind's ‖W‖ shrank by more than {1 - SHRINK_PER_STEP:.0%} per step since the "
       "record before", "invariant: no optimizer step zeroes a tensor; AdamW's decay shrinks it by lr·λ ≈ 1e-4 "
       "per step", "a tensor was set to 0 outside the optimizer: a bug in "
       "loading, surgery or a hook", Cause.WEIGHTS)
def _weights_zeroed(history: Sequence[dict], entry: dict) -> list[Finding]:
    previous = kind_norms(history[-1]) if history else {}
    return [finding(Level.ERROR, None, layer, norm,
                    phrase("{kind}: ‖W‖ {norm:.3g}, {previous:.3g} at step {step}", kind=kind, norm=norm,
                           previous=previous[layer, kind], step=history[-1]['step']))
            for layer, (kind, norm) in _zeroed(history, entry).items()]


@check(Scope.TRAINING, "weight_norm_collapse",
       f"a tensor kind's ‖W‖ < {NORM_COLLAPSE:g} × its first record's",
       "healthy-run measurement: no kind of the calibration runs fell below 0.9× (benchmarks/FAILURES.md)",
       "the weights shrink towards 0: weight decay too strong or applied to the norms' gains",
       Cause.OPTIMIZER,
       advice=phrase("lower the weight decay and keep it off the norms' gains and the biases (param groups with "
                     "weight_decay 0)"))
def _weight_norm_collapse(history: Sequence[dict], entry: dict) -> list[Finding]:
    """Tensor kinds whose norm collapsed since the first record (a layer already zeroed is that finding's)."""
    if not history:
        return []
    now, start, seen, flags = kind_norms(entry), kind_norms(history[0]), set(_zeroed(history, entry)), []
    for (layer, kind), norm in now.items():
        origin = start.get((layer, kind), 0)
        if layer not in seen and norm > 0 and origin > 0 and norm < NORM_COLLAPSE * origin:
            flags.append(finding(Level.ERROR, None, layer, norm / origin,
                                 phrase("{kind}: ‖W‖ {norm:.3g}, {factor:.2g}× its {origin:.3g} at step {step}",
                                        kind=kind, norm=norm, factor=norm / origin, origin=origin,
                                        step=history[0]['step'])))
            seen.add(layer)
    return flags


def judge(history: Sequence[dict], entry: dict) -> list[Flag]:
    """The findings over training at `entry`, judged against the records before it (oldest first; the first is the
    reference for trends): every check of Scope.TRAINING, in the order declared. Findings the record already holds
    (same name and layer) are not repeated."""
    flags = [found for detect in detectors(Scope.TRAINING) for found in detect(history, entry)]
    held = {(f["name"], f.get("layer")) for f in entry.get("flags") or []}
    return [f for f in flags if (f.name, f.layer) not in held]
