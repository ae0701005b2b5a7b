"""Invariants of every correct training loop, and probes of the properties themselves.

A statistic can only hint at a mechanism (a loss above uniform says that training fails, not
why). What a Watch sees of the loop itself — the optimizer and its groups, the gradients before
a backward and at the optimizer's step, the modules' modes, the targets beside the inputs, the
loss beside the model's own logits — either satisfies what the definitions of the optimizer, the
loss and the model require, or it does not. Each check below states the invariant and why it
must hold; none is a level fitted to runs. The Watch measures the evidence
(training/loop.py) into each record's "loop", "data" and "probe"; these checks read the record,
so `track` over a timeline reaches the same findings. Legitimate variants pass by construction:
gradients accumulated over several backward passes (only the first backward after an optimizer
step must find them zero), parts frozen on purpose (requires_grad False: not trainable, not
counted), several optimizers (a parameter outside the one given is info), evaluation inside the
loop (under torch.no_grad(): not taken for the training forward).
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from blocktrace.phrases import phrase
from blocktrace.diagnose.audit import scale_free
from blocktrace.diagnose.checks import Cause, Finding, Scope, check, finding, last_records
from blocktrace.vocab import Level

EXACT = 0.99  # share of target positions a relation must hold on to be the loop's relation (a few padding slips)
CHANCE = 0.5  # below this share at every shift, the targets are not the input text: coincidences stay far below
SUM_TOLERANCE = 0.1  # a loss within 10% of N × the mean cross-entropy is a sum over those N
WORST_TOLERANCE = 1e-3  # relative: the float32 rounding of a logsumexp over a vocabulary is ~1e-6
REPEATED_PAST_USE = 16  # times each sequence is trained on past which repeating data adds nothing (Muennighoff 2023)
LEAK_TOLERANCE = 1e-3  # relative change of an earlier position's logits: float32 rounding of the same rows is ~1e-7
MIN_SCALE = 4.0  # a loss scale this large is told apart from its absence (GradScaler starts at 65,536)
HARD_ROWS = 0.9  # share of the rows with a gradient that name one target: the loss is a hard-label one
TEMPERED_ROWS = 4  # sampled rows that must fit a tempered cross-entropy (training/logit_gradient.py samples 64)
TEMPERED_AGREE = 0.01  # relative spread of their slopes: one constant c
TEMPERED_MARGIN = 0.05  # |c − 1| beyond which c is a temperature (float32 fits c within 1e-6; bfloat16 ~1e-2)
SAME_WEIGHT = 1e-3  # rows of one target carry one weight: their scales agree to float32's rounding of the fit
SAME_TARGET_PAIRS = 2  # pairs of sampled rows with the same target that must agree before the class is the cause
WEIGHTED_ROWS = 1.1  # ratio of two rows' weights within one sequence beyond which the loss weights its rows
WEIGHTED_ERROR = 2.0  # ... and beyond which the objective is far from the likelihood (an error, not a warning)
MISSED_RECORDS = 2  # records in a row whose batch's embedding rows all got no gradient while others did
GROWN_OUTSIDE = 2.0  # factor a tensor's RMS grew by outside the optimizer from which weights were scaled, not replaced
SHARED_TARGET_ROWS = 8  # sampled rows with a gradient that must share one target distribution
SHARED_TARGET_FIT = 1e-3  # their gradients' distance from w·(p_r − q), as a share of the largest entry (float32: ~1e-6)
SHARED_TARGET_PEAK = 0.9  # q's largest entry below this: not one token repeated (a batch of one target)
SHARED_TARGET_MASS = 0.01  # |Σq − 1| within this: q is a distribution (a z-loss alone fits with q = 0)
UNPULLED_RECORDS = 2  # records in a row whose loss pulls no logit up (a batch whose targets are all ignored, once)
LIKELY_SLOPE = 0.5  # slope of log weight on log p_t from which the loss favours the tokens the model finds likely
LIKELY_EXPLAINED = 0.9  # share of the weights' variance that slope must explain (the weight a function of p_t)
LIKELY_SPAN = 1.0  # nats of log p_t the rows must span for a slope to be read (near the uniform start they span ~0)
FROZEN_BY_ROUNDING = 0.5  # share of a 16-bit tensor kind's elements unchanged over a whole interval of steps


def _loop(entry: dict) -> dict:
    return entry.get("loop") or {}


# What a record says of the batch's targets: read off the loss's gradient where the forward was given none
TARGET_FACTS = ("target_match", "counted", "targets_counted", "padding_counted", "padded_rows", "padding_id")


def _data(entry: dict) -> dict:
    """The record's batch facts; the targets' only where they are the loop's: given to the forward, or read off the
    gradient of a hard-label loss (`hard_rows` ≥ HARD_ROWS: training/logit_gradient.py)."""
    data = entry.get("data") or {}
    hard = data.get("hard_rows")
    if hard is not None and not (_finite(hard) and hard >= HARD_ROWS):
        return {key: value for key, value in data.items() if key not in TARGET_FACTS}
    return data


def _record_at(history: Sequence[dict], step: Optional[int]) -> Optional[dict]:
    """The latest record of `step` among the ones before (None where there is none, or no step is named)."""
    return next((r for r in reversed(history) if r.get("step") == step), None) if step is not None else None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- the gradients and the optimizer's step ----------------------------------------------------------------

@check(Scope.TRAINING, "gradients_not_zeroed",
       "the first backward after an optimizer step finds gradients already there (‖.grad‖ > 0; a Watch)",
       "invariant: PyTorch adds each backward's gradients into .grad, so every optimizer step must use only the "
       "backward passes since the step before (accumulating over several backward passes before one step is "
       "fine: only the first after a step must find zeros); Karpathy 2019, common mistake 3: 'you forgot to "
       ".zero_grad() before .backward()'",
       "the gradients of every earlier step are added again at each step: the update grows with the run's "
       "length and points where the model was, not where it is", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("call optimizer.zero_grad() once per optimizer step: after optimizer.step(), or before the first "
                     "backward of the next step"))
def _gradients_not_zeroed(history: Sequence[dict], entry: dict) -> list[Finding]:
    before = _loop(entry).get("grads_before_backward")
    if not _finite(before) or before <= 0:
        return []
    return [finding(Level.ERROR, None, None, before,
                    phrase("the backward of step {step} found gradients of norm {before:.3g} left from before the "
                           "last optimizer step", step=entry['step'], before=before))]


@check(Scope.TRAINING, "gradients_zeroed_between_micro_batches",
       "in a step of several training forwards (micro-batches), every backward after the first — a backward() call "
       "of its own, begun after the first ended — finds ‖.grad‖ = 0, while the step ends with a gradient (a Watch)",
       "invariant of accumulation: each micro-batch's backward adds into .grad what the ones before it left, so "
       "that the step applies their sum; a backward that finds nothing there started after a zero_grad()",
       "optimizer.zero_grad() runs inside the loop over micro-batches: each backward clears the ones before, and "
       "the step applies the last micro-batch's gradient alone", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("call optimizer.zero_grad() once per optimizer step — after optimizer.step() — not inside the loop "
                     "over micro-batches"))
def _gradients_zeroed_between_micro_batches(history: Sequence[dict], entry: dict) -> list[Finding]:
    later = _loop(entry).get("grads_before_later_backward")
    ended_with_one = any(_finite(layer.get("grad_norm")) and layer["grad_norm"] > 0 for layer in entry["layers"])
    if later != 0 or not ended_with_one:
        return []
    return [finding(Level.ERROR, None, None, 0.0,
                    phrase("at step {step}, every micro-batch's backward after the first found no gradient to add "
                           "to", step=entry["step"]))]


@check(Scope.TRAINING, "step_without_gradient",
       "optimizer.step() runs while no parameter it holds has a gradient (‖.grad‖ = 0), although the backward "
       "before it produced one (a Watch given optimizer=)",
       "invariant: an optimizer step applies the gradients of the backward before it; zeroed between the two, "
       "there is nothing to apply (TrainCheck, OSDI'25: API-misuse and ordering errors are silent)",
       "the gradients are cleared between backward() and optimizer.step(): the step changes nothing but the "
       "weight decay and the momentum", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("call optimizer.zero_grad() after optimizer.step() (or before the next backward), never between "
                     "backward() and step()"))
def _step_without_gradient(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    at, norm = loop.get("step_gradient_at"), loop.get("step_gradient")
    if loop.get("optimizer_share") == 0:
        return []  # an optimizer holding none of the trained parameters finds none of their gradients: its own finding
    if at is None or norm != 0:
        return []
    before = _record_at(history, at)  # the record before, in a step
    if before is None or not _finite(before.get("grad_norm")) or not before["grad_norm"] > 0:
        return []
    return [finding(Level.ERROR, None, None, 0.0,
                    phrase("at step {step} backward() left gradients of norm {before:.3g}, but optimizer.step() found "
                           "none", step=at, before=before['grad_norm']))]


def _between_steps(entry: dict) -> Optional[dict]:
    """The first change of the weights between two optimizer steps since the record before (training/between.py)."""
    found = _loop(entry).get("between_steps")
    return found if found and found.get("changed_at") is not None else None


@check(Scope.TRAINING, "embedding_gradient_misses_its_batch",
       f"at {MISSED_RECORDS} records in a row, the token embedding's gradient is exactly 0 on every row the recorded "
       f"batch's ids read and not 0 on some row they did not (training/embedding_rows.py; a Watch)",
       "calculus: a lookup's gradient reaches exactly the rows its tokens read (a tied head adds a gradient to "
       "every row); a mask on the table's gradient zeroes chosen rows — a frozen reserved row, PEFT's "
       "trainable_token_indices — and so zeroes some rows of a batch, not every row it read while others train. "
       "Two records: a batch that by chance holds none of the few rows a mask trains is not enough",
       "the gradient that reaches the embedding skipped the tokens of the batch it came from: a gradient mask "
       "inverted (`ids == k` where `ids != k` was meant), a hook that zeroes the rows it should keep; the "
       "embedding (and a head tied to it) stays at its initial values", Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("check the mask or hook on the embedding's gradient: it must keep the rows of the tokens "
                     "being trained and zero only the frozen ones"))
def _embedding_gradient_misses_its_batch(history: Sequence[dict], entry: dict) -> list[Finding]:
    recent = last_records(history, entry, MISSED_RECORDS)
    rows = [_loop(record).get("embedding_rows") or {} for record in recent]
    if not rows or not all(row.get("read_rows") == 0 and _finite(row.get("other_rows")) and row["other_rows"] > 0
                           for row in rows):
        return []
    return [finding(Level.ERROR, None, None, rows[-1]["other_rows"], phrase(
        "at steps {steps} no row of the embedding that the batch's tokens read got a gradient, while rows they "
        "did not read did (largest {other:.3g})", steps=", ".join(str(r["step"]) for r in recent),
        other=rows[-1]["other_rows"]))]


@check(Scope.TRAINING, "tied_head_gradient_missing",
       f"at {MISSED_RECORDS} records in a row, the token embedding is tied to an output head and the loss normalises "
       "a softmax over the vocabulary, yet the embedding's gradient is exactly 0 on every row the batch's ids did not "
       "read while each row they read got one (training/embedding_rows.py; a Watch)",
       "calculus: a tied head's gradient reaches every row of the matrix — row v's logit is in every position's "
       "softmax, ∂L/∂W_v = Σ_t (p_tv − y_tv)·h_t, nonzero wherever p_tv > 0 — so exactly 0 on every row no token "
       "read, with a gradient on each row one did, is the lookup's gradient alone. A mask on the table's gradient "
       "zeroes rows the batch read too; a backbone trained for another objective normalises no softmax over the "
       "vocabulary",
       "the loss's path through the output head does not reach the matrix: the head applied with the matrix "
       "detached (F.linear(h, W.detach()) — 'the tied matrix gets its gradient through the lookup'), or with a copy "
       "made once in place of the tied weight; the head's share of the matrix's training is lost",
       Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("apply the head with the tied weight itself (the output embedding's weight or the head "
                     "module), not a detached or copied tensor"))
def _tied_head_gradient_missing(history: Sequence[dict], entry: dict) -> list[Finding]:
    recent = last_records(history, entry, MISSED_RECORDS)
    rows = [_loop(record).get("embedding_rows") or {} for record in recent]
    if not rows or not all(_head_cut(row) for row in rows):
        return []
    return [finding(Level.ERROR, None, None, rows[-1]["unread"], phrase(
        "at steps {steps} the embedding tied to the output head got a gradient on every row the batch read and "
        "exactly 0 on all {unread} others, though the loss normalises a softmax over the vocabulary",
        steps=", ".join(str(r["step"]) for r in recent), unread=int(rows[-1]["unread"])))]


def _head_cut(rows: dict) -> bool:
    """One record's embedding rows as a tied head's gradient never gives them (see the check above)."""
    return rows.get("tied") == 1 and rows.get("softmax_over_vocabulary") == 1 and rows.get("other_rows") == 0 \
        and _finite(rows.get("read_rows_least")) and rows["read_rows_least"] > 0 and (rows.get("unread") or 0) > 0


@check(Scope.TRAINING, "weights_returned_to_earlier_step",
       "between two optimizer steps (after one ended, before the next began) the weights the optimizer holds "
       "changed, and became exactly what they were after an earlier recorded step's update, or as the Watch's "
       "first step began (a fingerprint of the optimizer's 4 largest tensors, the embedding and the head; a Watch "
       "given optimizer=)",
       "invariant: between the end of one step and the start of the next, the loop only reads the weights (its "
       "forward and backward); a state this run had steps ago, to the last sampled bit, is a checkpoint of it "
       "loaded again while the step count, the learning rate and the data went on",
       "the run resumed from an older checkpoint than its last (a checkpoint chosen by a sort of file names, "
       "'ckpt_100' before 'ckpt_80'; a stale 'latest' link; a restart that reloads the start): the steps since "
       "that state are lost, and are lost again at each such resume", Cause.WEIGHTS, direct=True,
       advice=phrase("resume from the newest checkpoint (choose it by its step number, not by sorting names); if the "
                     "run went back on purpose (as PaLM did around loss spikes), this is that"))
def _weights_returned_to_earlier_step(history: Sequence[dict], entry: dict) -> list[Finding]:
    found = _between_steps(entry)
    if found is None or found.get("returned_to") is None:
        return []
    back = found["returned_to"]
    state = (phrase("those after step {back}'s update", back=back) if back >= 0
             else phrase("the ones before step 0's update (the initial weights)"))
    return [finding(Level.ERROR, None, None, float(found["changed_at"] - 1 - back), phrase(
        "before step {at}'s optimizer step, the weights were again {state}: {lost} steps of training undone",
        at=found["changed_at"], state=state, lost=found["changed_at"] - 1 - back))]


@check(Scope.TRAINING, "weights_written_outside_optimizer",
       f"between two optimizer steps the weights the optimizer holds changed by more than its own last step moved "
       f"them (largest change of a sampled weight of the 4 largest tensors, the embedding and the head; a Watch "
       f"given optimizer=): a warning, an error where the change grew a tensor's RMS {GROWN_OUTSIDE:g}× or more",
       "invariant: only the optimizer writes the weights it holds, inside its step; a constraint or a hand-written "
       "decay applied between steps moves a weight by a fraction of a step (lr·λ·|w|, against Adam's ~lr), a "
       "replacement by more; a change that only sets weights to 0 (a pruning mask, Zhu & Gupta 2017) is passed "
       "over. A replacement by weights of their kind (an average, a checkpoint, a re-drawn initialisation, "
       "shrink-and-perturb's 0.6·w + noise, Ash & Adams 2020) keeps a tensor's RMS within a small factor; "
       "several-fold is a scaling, not a replacement",
       "something replaced the weights between steps: a checkpoint loaded in the middle of the run, averaged "
       "weights (EMA, SWA) swapped in for an evaluation and not swapped back, an outer optimizer (Lookahead, "
       "DiLoCo) the Watch was not given; grown several-fold: a multiplier folded into the live tensor (an export "
       "that wrote into state_dict()'s tensors, which are the parameters)", Cause.WEIGHTS,
       advice=phrase("find what writes the model's parameters between optimizer.step() and the next forward"))
def _weights_written_outside_optimizer(history: Sequence[dict], entry: dict) -> list[Finding]:
    found = _between_steps(entry)
    if found is None or found.get("returned_to") is not None:
        return []  # a return to an earlier state is its own, sharper finding
    change, move, growth = found.get("change"), found.get("step_move"), found.get("growth")
    if not _finite(change) or not _finite(move) or change <= move:
        return []
    grown = _finite(growth) and growth >= GROWN_OUTSIDE
    return [finding(Level.ERROR if grown else Level.WARNING, None, None, change, phrase(
        "before step {at}'s optimizer step, a weight had changed by {change:.3g} since the step before ended, "
        "which moved weights by {move:.3g} at most", at=found["changed_at"], change=change, move=move) + (phrase(
            "; a tensor's RMS grew {growth:.3g}×", growth=growth) if grown else ""))]


@check(Scope.TRAINING, "optimizer_lacks_parameters",
       "the optimizer given to the Watch holds none of the trainable parameters that got a gradient (error); "
       "some of them (info: a second optimizer may hold the rest)",
       "invariant: an optimizer updates the tensors in its param_groups and no others",
       "the parameters trained are not the ones the optimizer updates: it was built for another copy of the "
       "model, or before the model was replaced", Cause.OPTIMIZER, direct=True,
       advice=phrase("build the optimizer from the very model that is trained (after any re-creation, loading or "
                     "wrapping that replaces its parameters), and put every trainable parameter in a param group"))
def _optimizer_lacks_parameters(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    share = loop.get("optimizer_share")
    if not _finite(share) or share >= 1:
        return []
    names = ", ".join(loop.get("outside_optimizer") or [])
    return [finding(Level.ERROR if share == 0 else Level.INFO, None, None, share,
                    phrase("the optimizer holds {share:.0%} of the trainable parameters with a gradient{missing}",
                           share=share, missing=phrase(" (not: {names})", names=names) if names else ""))]


@check(Scope.TRAINING, "parameters_in_no_optimizer",
       "parameters that require a gradient and got one are held by no torch optimizer alive in the process (the one "
       "given to the Watch and every other, found by the garbage collector): an error where a block holds some of "
       "them beside parameters an optimizer updates, a warning where whole modules are left out (a Watch given "
       "optimizer=)",
       "definition: only an optimizer writes a parameter from its gradient; one in no optimizer's param groups keeps "
       "its initial value however long the run. Freezing is said with requires_grad_(False); a name filter that "
       "misses part of a block (a norm's gain) freezes it by mistake",
       "the param groups are built by a filter on the parameters' names that this model's names do not match "
       "(GPT-2's 'ln_' and 'c_attn' on a Llama), or a module added or replaced after the optimizer was built: "
       "those parameters never train", Cause.OPTIMIZER, direct=True,
       advice=phrase("build the param groups so that every parameter meant to train is in one (check that the groups' "
                     "parameters add up to the model's); freeze the others with requires_grad_(False)"))
def _parameters_in_no_optimizer(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    unheld = loop.get("unheld") or {}
    count = unheld.get("unheld") or 0
    if count < 1 or loop.get("optimizer_share") == 0:
        return []  # an optimizer holding none of them is optimizer_lacks_parameters' error
    partial = unheld.get("partial_blocks") or 0
    names = ", ".join(unheld.get("unheld_names") or [])
    return [finding(Level.ERROR if partial else Level.WARNING, None, None, float(count), phrase(
        "{count} parameters with a gradient are in no optimizer (first: {names}){inside}", count=count, names=names,
        inside=phrase("; {partial} blocks hold some of them beside parameters an optimizer trains", partial=partial)
        if partial else ""))]


@check(Scope.TRAINING, "learning_rate_zero",
       "every param group's learning rate is 0 at two records in a row, after step 0 (a Watch given optimizer=)",
       "definition: an optimizer step moves a weight by the learning rate times its update; at 0 nothing is "
       "learned, whatever the gradients (warm-up may start at 0, at step 0 only)",
       "the schedule gives 0: an integer division in a warm-up lambda, a scheduler stepped past its end, a "
       "multiplier of 0", Cause.LEARNING_RATE, direct=True,
       advice=phrase("print the learning rate of each param group over the first steps: the scheduler gives 0 (an "
                     "integer division, a schedule that ended, a factor of 0)"))
def _learning_rate_zero(history: Sequence[dict], entry: dict) -> list[Finding]:
    def all_zero(record: dict) -> bool:
        rates = _loop(record).get("lr_groups") or []
        return bool(rates) and all(_finite(r) and r == 0 for r in rates)

    if not history or entry["step"] <= 0 or not (all_zero(entry) and all_zero(history[-1])):
        return []
    return [finding(Level.ERROR, None, None, 0.0,
                    phrase("every param group's learning rate is 0 at steps {before} and {after}",
                           before=history[-1]['step'], after=entry['step']))]


@check(Scope.TRAINING, "updates_rounded_away",
       f"more than {FROZEN_BY_ROUNDING:.0%} of the elements of a float16/bfloat16 weight kind that requires a "
       "gradient are unchanged since the record before, at a learning rate above 0",
       "IEEE 754: a stored weight changes only when the update exceeds half its spacing (bfloat16 keeps 8 bits: "
       "a weight of 1 ignores any update below 0.004); Micikevicius et al. 2018 keep float32 master weights for "
       "this reason",
       "the optimizer's updates are smaller than the weights' rounding step: they are lost, and the weights "
       "stand still although every step computes an update", Cause.PRECISION, direct=True,
       advice=phrase("keep float32 master weights (torch.autocast with float32 parameters, or the optimizer's master "
                     "copy) instead of updating float16/bfloat16 parameters in place"))
def _updates_rounded_away(history: Sequence[dict], entry: dict) -> list[Finding]:
    rates = [r for r in (_loop(entry).get("lr_groups") or [entry.get("lr")]) if _finite(r)]
    if not history or (rates and max(rates) <= 0):
        return []
    flags = []
    for layer in entry["layers"]:
        stuck = [(kind, w["unchanged"]) for kind, w in (layer.get("weights") or {}).items()
                 if _finite(w.get("unchanged")) and w["unchanged"] > FROZEN_BY_ROUNDING]
        if stuck:
            kind, share = max(stuck, key=lambda item: item[1])
            flags.append(finding(Level.ERROR, None, layer["layer"], share,
                                 phrase("{share:.0%} of {kind}'s 16-bit elements did not change between steps "
                                        "{before} and {after}", share=share, kind=kind, before=history[-1]['step'],
                                        after=entry['step'])))
    return flags


# --- the modes of the modules ------------------------------------------------------------------------------

@check(Scope.TRAINING, "trained_in_eval_mode",
       "the forward whose loss is backpropagated runs dropout or batch-norm modules in eval mode (a Watch)",
       "definition: module.eval() switches dropout off and batch norm to its running statistics; "
       "model.train() switches them back. Karpathy 2019, common mistake 2: 'you forgot to toggle train/eval "
       "mode for the net'",
       "the model is trained in evaluation mode: its regularisation is off (and batch norm does not learn its "
       "statistics), usually since an evaluation inside the loop left it there", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("call model.train() after every evaluation inside the loop (and model.eval() before it)"))
def _trained_in_eval_mode(history: Sequence[dict], entry: dict) -> list[Finding]:
    count = _loop(entry).get("eval_mode_modules")
    if not isinstance(count, int) or count <= 0:
        return []
    return [finding(Level.ERROR, None, None, float(count),
                    phrase("{count} dropout or batch-norm module{s} in eval mode in the forward that training "
                           "backpropagated", count=count, s="s" if count > 1 else ""))]


# --- the loss against its own definition -------------------------------------------------------------------

@check(Scope.TRAINING, "outputs_are_probabilities",
       "the model's outputs, fed to its loss, are already probabilities (each row ≥ 0 and summing to 1)",
       "definition: F.cross_entropy applies log-softmax to raw logits; given probabilities p it computes "
       "−log softmax(p), which stays within about 1 nat of log V. Karpathy 2019, common mistake 4: 'you passed "
       "softmaxed outputs to a loss that expects raw logits'",
       "softmax is applied twice: the loss can barely fall below log V and its gradients are squashed",
       Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("give the loss the raw logits: drop the softmax before F.cross_entropy (or use F.nll_loss on "
                     "log_softmax)"))
def _outputs_are_probabilities(history: Sequence[dict], entry: dict) -> list[Finding]:
    if _loop(entry).get("outputs_are_probabilities") is not True:
        return []
    return [finding(Level.ERROR, None, None, 1.0,
                    phrase("every output row is ≥ 0 and sums to 1: the model returns probabilities, not logits"))]


@check(Scope.TRAINING, "loss_of_probabilities",
       "the loss's own autograd graph applies cross-entropy's log-softmax to the output of a softmax, made in the "
       "model or in the loop (a Watch given the loss)",
       "definition: F.cross_entropy applies log-softmax to what it is given, so it must be given logits; the graph "
       "says what it was given, wherever the softmax was computed. log_softmax before it, or F.nll_loss on "
       "log(softmax), pass: neither applies a softmax twice",
       "softmax is applied twice: the loss can barely fall below log V and its gradients are squashed",
       Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("give the loss the raw logits: drop the softmax between the model and F.cross_entropy (or use "
                     "F.nll_loss on log_softmax)"))
def _loss_of_probabilities(history: Sequence[dict], entry: dict) -> list[Finding]:
    if _loop(entry).get("softmax_before_loss") is not True or _loop(entry).get("outputs_are_probabilities") is True:
        return []  # the model's own outputs already said so (outputs_are_probabilities): one finding, not two
    return [finding(Level.ERROR, None, None, 1.0, phrase("the loss's graph runs cross-entropy on the output of a "
                                                         "softmax"))]


@check(Scope.TRAINING, "loss_normalises_another_axis",
       "a log-softmax near the top of the loss's autograd graph takes the logits (an input with an axis of the "
       "vocabulary's size) and normalises over an axis of another size (a Watch given the loss)",
       "definition: cross-entropy is −log of the softmax over the classes, so the log-softmax must run over the "
       "vocabulary's axis, whatever the layout (F.cross_entropy on [B, V, T] normalises dim 1, of size V, and "
       "passes); over the batch or the positions it makes each token's 'probability' a share among other tokens",
       "the loss normalises over the wrong axis: log_softmax(logits, dim=0) or dim=1 on [B, T, V], a softmax "
       "without its dim", Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("normalise over the vocabulary: F.log_softmax(logits, dim=-1), or F.cross_entropy on logits "
                     "reshaped to [N, V]"))
def _loss_normalises_another_axis(history: Sequence[dict], entry: dict) -> list[Finding]:
    sizes, vocab = _loop(entry).get("log_softmax_over") or [], entry.get("vocab")  # the logits' last axis
    wrong = [size for size in sizes if isinstance(vocab, int) and size != vocab]
    if not wrong:
        return []
    return [finding(Level.ERROR, None, None, float(wrong[0]), phrase(
        "the loss's log-softmax normalises over an axis of size {size}, not the vocabulary's {vocab}",
        size=wrong[0], vocab=vocab))]


def _sum_over(ratio: float, counts: dict) -> Optional[str]:
    for name, count in counts.items():
        if isinstance(count, int) and count >= 2 and abs(ratio / count - 1) < SUM_TOLERANCE:
            return name
    return None


@check(Scope.TRAINING, "loss_not_mean",
       f"the loss is N × the mean cross-entropy of the model's own logits and targets (within "
       f"{SUM_TOLERANCE:.0%}), N ≥ 2 the number of counted targets, of sequences or of positions",
       "definition: a language model's loss is the mean cross-entropy over the counted targets (F.cross_entropy's "
       "reduction='mean'); a sum scales every gradient by the batch's size, so the learning rate is in effect "
       "N times larger and changes with the batch",
       "the loss is a sum, not a mean", Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("average the loss over the counted targets (reduction='mean'), or divide the learning rate by the "
                     "count the sum runs over"))
def _loss_not_mean(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    ratio = loop.get("loss_over_cross_entropy")
    if not _finite(ratio) or ratio < 2:
        return []
    counts = {phrase("counted targets"): _data(entry).get("targets_counted"),
              phrase("sequences"): loop.get("sequences"),
              phrase("positions per sequence"): loop.get("positions")}
    over = _sum_over(ratio, counts)
    if over is None:
        return []
    return [finding(Level.ERROR, None, None, ratio,
                    phrase("the loss is {ratio:.4g} × the mean cross-entropy of the model's logits: a sum over its "
                           "{counts} {over}", ratio=ratio, counts=counts[over], over=over))]


def _judged_as_cross_entropy(loop: dict) -> bool:
    """Whether the loss's range can be judged against a cross-entropy's: one training forward per step, and the loss's
    graph holds no more than one log-softmax over the logits, reading them as the model gave them — a distillation
    (a student at a temperature beside a cross-entropy, a KL at a temperature) mixes others, whose sum may leave the
    range legitimately."""
    sizes = loop.get("log_softmax_over") or []
    return (loop.get("micro_batches") or 1) <= 1 and \
        (not sizes or (len(sizes) == 1 and loop.get("log_softmax_reads_logits") is not False))


CROSS_ENTROPY_RANGE_SOURCE = (
    "definition: a cross-entropy against a distribution q is a q-weighted mean of −log p over the classes, so a "
    "row's lies between its best and its worst class's −log p, and a mean over rows between the smallest and the "
    "largest of those. Label smoothing, soft targets and small added terms (a z-loss, a router's balance loss) "
    "stay inside; a distillation's mix (a second log-softmax, or logits at a temperature, in the loss's graph) and "
    "several micro-batches a step are not judged")


@check(Scope.TRAINING, "loss_tempers_logits",
       f"the gradient the backward hands the model's logits is, on at least {TEMPERED_ROWS} sampled rows, that of a "
       f"hard-label cross-entropy of c × the logits, with c the same on every row (within {TEMPERED_AGREE:.0%}) and "
       f"|c − 1| > {TEMPERED_MARGIN:g} (training/logit_gradient.py; a Watch)",
       "calculus: the cross-entropy of softmax(c·z) at target t has ∂L/∂z_j = (c/N)·softmax(c·z)_j for j ≠ t, so log "
       "∂L/∂z_j is a straight line in z_j of slope c — 1 for the logits as they are; Hinton, Vinyals & Dean 2015 "
       "§2: the hard-label term is computed 'using exactly the same logits … but at a temperature of 1'. A "
       "smoothed label, a distillation or a binary loss fits no such line and is not judged",
       "the hard-label loss reads the logits at a temperature 1/c (a distillation temperature applied to the label "
       "term, a 'temperature' left in a config): the model learns logits 1/c times those a softmax of them should "
       "be, miscalibrated wherever they are read as they are (evaluation, generation)", Cause.LOSS_FUNCTION,
       direct=True,
       advice=phrase("compute the cross-entropy with the labels on the logits as they are (temperature 1); keep a "
                     "temperature for the soft, distillation term only"))
def _loss_tempers_logits(history: Sequence[dict], entry: dict) -> list[Finding]:
    tempered = _loop(entry).get("tempered") or {}
    low, high, rows = tempered.get("slope_low"), tempered.get("slope_high"), tempered.get("rows") or 0
    if rows < TEMPERED_ROWS or not _finite(low) or not _finite(high) or low <= 0:
        return []
    if high > low * (1 + TEMPERED_AGREE) or abs((low + high) / 2 - 1) <= TEMPERED_MARGIN:
        return []
    slope = (low + high) / 2
    return [finding(Level.ERROR, None, None, slope, phrase(
        "at step {step} the loss's gradient at the logits is the cross-entropy's of {slope:.3g} × the logits "
        "(temperature {temperature:.3g}) on {rows} rows", step=entry["step"], slope=slope, temperature=1 / slope,
        rows=rows))]


@check(Scope.TRAINING, "loss_weights_classes",
       f"the gradient the backward hands the model's logits gives sampled rows of the same target the same weight "
       f"(within {SAME_WEIGHT:g}, on at least {SAME_TARGET_PAIRS} pairs) and rows of one sequence with other targets "
       f"weights more than {WEIGHTED_ROWS:g}× apart (error from {WEIGHTED_ERROR:g}×; training/logit_gradient.py)",
       "calculus and definition: a row's cross-entropy gradient off its target is s·softmax(z)_j; the likelihood "
       "(a mean or sum over the tokens) gives every counted token the same s, and F.cross_entropy(weight=w) gives "
       "a token w[target]/Σw. Weights by sequence, by confidence (focal loss) or a z-loss depend on the row, so "
       "rows of one target differ, and are not judged",
       "the loss weights the target classes (class weights from the token frequencies, sklearn's 'balanced', "
       "copied from a classifier): the model is trained to over-predict the up-weighted tokens, and its "
       "probabilities, loss and perplexity are not the text's", Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("train a language model on the unweighted cross-entropy (no weight= argument); set a token's "
                     "targets to ignore_index to leave it out"))
def _loss_weights_classes(history: Sequence[dict], entry: dict) -> list[Finding]:
    weights = _loop(entry).get("row_weights") or {}
    pairs, spread, ratio = (weights.get(key) for key in ("same_target_pairs", "same_target_spread", "sequence_ratio"))
    if not (pairs or 0) >= SAME_TARGET_PAIRS or not _finite(spread) or spread > SAME_WEIGHT \
            or not _finite(ratio) or ratio <= WEIGHTED_ROWS:
        return []
    return [finding(Level.ERROR if ratio >= WEIGHTED_ERROR else Level.WARNING, None, None, ratio, phrase(
        "at step {step} the loss weighs a token whose target is id {high} {ratio:.3g}× one whose target is id {low}, "
        "in one sequence, and tokens of the same target alike ({pairs} pairs)", step=entry["step"],
        high=weights.get("high_target"), low=weights.get("low_target"), ratio=ratio, pairs=pairs))]


@check(Scope.TRAINING, "loss_weights_likely_tokens",
       f"the weight the loss gives each sampled logit row (read exactly off its gradient: a·softmax(z) − b·e_t) "
       f"grows with the model's probability of the row's target: a slope of log b on log p_t of at least "
       f"{LIKELY_SLOPE:g} explaining {LIKELY_EXPLAINED:.0%} of the weights' variance, over rows spanning "
       f"{LIKELY_SPAN:g} nat of log p_t (training/logit_gradient.py; a Watch)",
       "calculus: the mean cross-entropy −(1/N)Σ log p_t gives every token the weight 1/N whatever p_t (slope 0); "
       "focal loss (Lin et al. 2017) weighs a token by a power of 1 − p_t (a negative slope); −log((1/N)Σ p_t) has "
       "the gradient (p_t/Σp)·(softmax(z) − e_t) per token: a weight proportional to p_t, slope 1 (Jensen: it is "
       "not the likelihood). Robust losses for noisy labels (MAE, generalised cross-entropy, Zhang & Sabuncu 2018) "
       "weigh by p_t^q on purpose",
       "the loss takes the log after averaging the probabilities (−log of a mean likelihood, a perplexity computed "
       "before the log) or weighs tokens by the model's confidence: the tokens the model finds hard are trained "
       "hardly at all, and the cross-entropy of the text rises while the loss optimised falls",
       Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("average −log p over the tokens (F.cross_entropy on the logits), not −log of the averaged p; a "
                     "robust loss for noisy labels (MAE, GCE) is for classification with wrong labels, not for "
                     "a language model's text"))
def _loss_weights_likely_tokens(history: Sequence[dict], entry: dict) -> list[Finding]:
    weights = _loop(entry).get("row_weights") or {}
    slope, explained, span = (weights.get(key) for key in
                              ("probability_slope", "probability_explained", "probability_span"))
    if not (_finite(slope) and _finite(explained) and _finite(span)) or slope < LIKELY_SLOPE \
            or explained < LIKELY_EXPLAINED or span < LIKELY_SPAN:
        return []
    return [finding(Level.ERROR, None, None, slope, phrase(
        "at step {step} the loss weighs each token by its probability to the power {slope:.3g} ({rows} tokens whose "
        "probabilities span {span:.2g} nats): the tokens the model gets wrong hardly count", step=entry["step"],
        slope=slope, rows=weights.get("probability_rows"), span=span))]


@check(Scope.TRAINING, "targets_same_for_every_row",
       f"the gradient the backward hands the model's logits is w·(p_r − q) with one w > 0 and one distribution q on "
       f"every sampled row with a gradient (at least {SHARED_TARGET_ROWS}; within {SHARED_TARGET_FIT:g} of the "
       f"largest entry), q a distribution (Σq within {SHARED_TARGET_MASS:g} of 1) and not a single token (its "
       f"largest entry below {SHARED_TARGET_PEAK:g}) "
       f"(training/logit_gradient.py; a Watch)",
       "calculus: a cross-entropy against q_r gives row r the gradient w_r·(softmax(z_r) − q_r); a language "
       "model's q_r is its own position's next token — one-hot, smoothed or a teacher's distribution of it — so "
       "rows differ by their q. One q for every row is a target that does not depend on the position",
       "the loss scores every position against the same distribution of targets — an [N] index against an "
       "[N, 1] one broadcasts to an N × N table (every position against every target of the batch), targets "
       "averaged over the batch: the model can learn only the targets' overall frequencies",
       Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("index each position's log-probability with its own target: logp.gather(-1, "
                     "targets.unsqueeze(-1)), or F.cross_entropy(logits.view(-1, V), targets.view(-1))"))
def _targets_same_for_every_row(history: Sequence[dict], entry: dict) -> list[Finding]:
    weights = _loop(entry).get("row_weights") or {}
    rows, residual, weight, peak, mass = (weights.get(key) for key in ("shared_rows", "shared_residual",
                                                                       "shared_weight", "shared_peak", "shared_mass"))
    if not all(_finite(value) for value in (rows, residual, weight, peak, mass)) or rows < SHARED_TARGET_ROWS \
            or residual > SHARED_TARGET_FIT or weight <= 0 or peak >= SHARED_TARGET_PEAK \
            or abs(mass - 1) > SHARED_TARGET_MASS:
        return []
    return [finding(Level.ERROR, None, None, residual, phrase(
        "at step {step} the loss trains all {rows} sampled positions toward one and the same distribution of targets "
        "(its most likely token {peak:.0%}), whatever each position's own next token", step=entry["step"],
        rows=rows, peak=peak))]


@check(Scope.TRAINING, "no_logit_pulled_up",
       f"at {UNPULLED_RECORDS} records in a row, the gradient the backward hands the model's logits (a loss computed in "
       "the loop) has no negative entry in any row that has a gradient (training/logit_gradient.py; a Watch)",
       "calculus: a cross-entropy against any target distribution q gives row r the gradient w·(p_r − q_r), negative "
       "wherever q_r exceeds p_r — at the target, for a one-hot, smoothed or teacher's q; a z-loss adds β·p_r and an "
       "entropy penalty terms of both signs. A gradient that pulls no logit up in any row trains no target: only a "
       "term that pushes every logit down reached them",
       "the target term of the loss does not reach the logits: computed on a detached copy of them (logits.detach(), "
       "a value read through .item() or numpy), or left out of the sum — while a regulariser on the live logits (a "
       "z-loss) still does; the model learns nothing of its targets",
       Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("compute the cross-entropy on the logits as the model returned them (not detached, not a copy), "
                     "and add it to the loss that backward() differentiates"))
def _no_logit_pulled_up(history: Sequence[dict], entry: dict) -> list[Finding]:
    recent = last_records(history, entry, UNPULLED_RECORDS)
    shares = [_data(record).get("pulled_rows") for record in recent]
    if not recent or not all(share == 0 for share in shares):
        return []
    return [finding(Level.ERROR, None, None, 0.0, phrase(
        "at steps {steps} the loss's gradient at the logits pulled no logit up in any row: it trains no target",
        steps=", ".join(str(record["step"]) for record in recent)))]


@check(Scope.TRAINING, "loss_above_any_cross_entropy",
       f"the loss given to the Watch exceeds, by more than {WORST_TOLERANCE:.0e} of it, the largest −log p of any "
       f"row and class of the recorded forward's logits (where loss_not_mean finds a sum over a count of the batch, "
       f"it says so instead)", CROSS_ENTROPY_RANGE_SOURCE,
       "the loss is not a mean cross-entropy of the model's logits against a distribution: soft targets whose "
       "mass exceeds 1, a loss multiplied by a constant, a sum over the classes", Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("make the loss a mean cross-entropy against targets that are distributions: one-hot labels, or "
                     "soft targets that sum to 1 in every row"))
def _loss_above_any_cross_entropy(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    ratio = loop.get("loss_over_worst_cross_entropy")
    if not _finite(ratio) or ratio <= 1 + WORST_TOLERANCE or not _judged_as_cross_entropy(loop) \
            or _loss_not_mean(history, entry):
        return []
    return [finding(Level.ERROR, None, None, ratio, phrase(
        "the loss is {ratio:.4g} × the largest −log p of any token and class in the batch: no cross-entropy "
        "against a distribution reaches it", ratio=ratio))]


@check(Scope.TRAINING, "loss_below_any_cross_entropy",
       f"the loss given to the Watch is below, by more than {WORST_TOLERANCE:.0e} of it, the smallest −log p of any "
       f"row and class of the recorded forward's logits", CROSS_ENTROPY_RANGE_SOURCE,
       "the loss is not a cross-entropy of the model's logits: a binary cross-entropy (sigmoid per class) or a "
       "squared error on them, a loss divided by a constant — lower than any softmax's prediction of a token allows",
       Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("train a language model on F.cross_entropy(logits, targets): a softmax over the vocabulary, "
                     "not a sigmoid per class"))
def _loss_below_any_cross_entropy(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    ratio = loop.get("loss_over_best_cross_entropy")
    if not _finite(ratio) or ratio >= 1 - WORST_TOLERANCE or not _judged_as_cross_entropy(loop):
        return []
    return [finding(Level.ERROR, None, None, ratio, phrase(
        "the loss is {ratio:.4g} × the smallest −log p of any token and class in the batch: no cross-entropy "
        "of these logits is that low", ratio=ratio))]


# --- the targets beside the inputs -------------------------------------------------------------------------

@check(Scope.TRAINING, "targets_not_counted",
       "every target of the batch is the ignore index (-100): the loss counts no token (a Watch)",
       "definition: cross-entropy averages over the targets that are not ignore_index; with none, it is 0/0 "
       "(NaN) or 0, and no gradient says anything",
       "the labels are all masked: a padding or prompt mask that covers everything (inverted, or applied to "
       "the wrong tensor)", Cause.DATA, direct=True,
       advice=phrase("set the ignore index (-100) only at padding and prompt positions: check the mask that builds "
                     "the labels"))
def _targets_not_counted(history: Sequence[dict], entry: dict) -> list[Finding]:
    if _data(entry).get("counted") != 0:
        return []
    return [finding(Level.ERROR, None, None, 0.0, phrase("every target of the batch is -100"))]


# The shifts a target can hold against its input, as a sentence names them.
RELATIONS_SAID = {"same": phrase("same"), "next": phrase("next"), "previous": phrase("previous")}


def _relation(match: dict) -> Optional[str]:
    """The shift the targets hold against the inputs on (nearly) every counted position: same, next or previous."""
    # "same" and "next" first: a run of one repeated token holds every relation, and both are correct somewhere
    held = [name for name in ("same", "next", "previous") if _finite(match.get(name)) and match[name] >= EXACT]
    return held[0] if held else None


def next_token_training(entry: dict) -> bool:
    """Whether the record's loop trains next-token prediction: its targets are the inputs advanced by one, or the
    inputs themselves given to a model that shifts them (HF's labels=ids)."""
    data = _data(entry)
    relation = _relation(data.get("target_match") or {})
    return relation == "next" and data.get("shifts_inside") is not True or \
        relation == "same" and data.get("shifts_inside") is True


@check(Scope.TRAINING, "targets_misaligned",
       f"the targets equal the inputs delayed by one position, or already advanced for a model that shifts them "
       f"itself, on ≥ {EXACT:.0%} of the counted positions; or, for a language model, at no shift on even "
       f"{CHANCE:.0%} of them (a Watch)",
       "definition of next-token prediction: the target of position t is the input at t + 1, given as the "
       "inputs themselves to a model that shifts inside (HF) or as the inputs advanced by one to one that does "
       "not (nanoGPT)",
       "the model is trained on the wrong token: one it already sees (it learns to copy), two ahead (shifted "
       "twice), or one unrelated to the text (the targets of another batch or another order)",
       Cause.DATA, direct=True,
       advice=phrase("build the targets as the same token sequence shifted by one, once: targets[t] = ids[t + 1] for a "
                     "model that does not shift, labels = ids for one that does (HF)"))
def _targets_misaligned(history: Sequence[dict], entry: dict) -> list[Finding]:
    data = _data(entry)
    match = data.get("target_match")
    if not isinstance(match, dict):
        return []
    detail = misalignment(match, data.get("shifts_inside") is True,
                          bool(data.get("language_model")) and _finite(data.get("counted")) and data["counted"] >= CHANCE,
                          at_logits=data.get("hard_rows") is not None)
    if detail is None:
        return []
    return [finding(Level.ERROR, None, None, max(match.values()), detail)]


def misalignment(match: dict, inside: bool, judged_at_no_shift: bool = True, at_logits: bool = False) -> Optional[str]:
    """What is wrong with targets that match the inputs by these shares at each shift (None: nothing): `inside`,
    the model shifts its labels itself; `judged_at_no_shift`, unrelated targets are judged (a language model whose
    targets are mostly counted: a masked-LM's are not); `at_logits`, the targets are the loss's at the logits' own
    positions (read off its gradient), where one equal to its input is the token that position sees."""
    relation = _relation(match)
    if relation == "previous":
        return phrase("the targets are the inputs delayed by one: each position is trained on a token it already sees")
    if relation == "same" and at_logits:
        return phrase("the loss's target at each position is that position's own input token, which the model "
                      "sees: it learns to copy")
    if relation == "next" and inside:
        return phrase("the labels are already the inputs advanced by one, and the model shifts them again: position "
                      "t is trained on token t + 2")
    if relation is None and judged_at_no_shift and match and all(_finite(v) and v < CHANCE for v in match.values()):
        shown = ", ".join(phrase("{relation} {share:.0%}", relation=RELATIONS_SAID.get(name, name), share=value)
                          for name, value in match.items())
        return phrase("the targets match the inputs at no shift ({shown} of the positions)", shown=shown)
    return None


# --- each recorded step's effect on its own batch: the descent probe ----------------------------------------------

# The loop's loss and the cross-entropy the replay computes of its targets agree to float32's rounding of a mean
# (~1e-7 of it) where they are one quantity; a focal loss, smoothed labels or a divided loss differ by far more
REPLAYED_AGREE = 1e-5


def _descent(entry: dict) -> Optional[dict]:
    """The probe of the optimizer step after an earlier record (training/loop.py): g·Δw and the batch's loss before
    and after the step, all finite; None where it was not run, or where the loss replayed (the cross-entropy of the
    targets a loss outside the model used) is not the loss the loop gave."""
    found = _loop(entry).get("descent")
    if not isinstance(found, dict) or not all(_finite(found.get(key)) for key in ("predicted", "loss_before")):
        return None
    given = found.get("loss_given")
    if given is not None and not (_finite(given) and abs(given - found["loss_before"]) <= REPLAYED_AGREE * abs(given)):
        return None
    return found


# A momentum optimizer's velocity can carry a step or two uphill across a valley: SGD at lr 0.1 with momentum 0.9
# climbed its own batch's loss at two records in a row in a run that trains (5.5 → 2.7 nats). A sign flipped climbs
# at every step; the first step, before any velocity exists, is conclusive alone.
CLIMBS_IN_A_ROW = 3
# The batch's loss rose by as much as the objective backward() differentiated fell: |ΔL − (−g·Δw)| within this share
# of |g·Δw| (a loss negated before backward: within 2% at lr 1e-3, 22% at the first step of a large one); a step
# that overshoots its own batch lands there only by coincidence, so two records in a row
MIRROR_TOLERANCE = 0.3
MIRRORED_IN_A_ROW = 2


def _climbs(entry: dict) -> bool:
    """The step probed at this record raised its batch's loss, and its first-order prediction says it would."""
    descent = _descent(entry)
    return descent is not None and _finite(descent.get("loss_after")) and descent["predicted"] > 0 \
        and descent["loss_after"] > descent["loss_before"]


def _mirrored(entry: dict) -> bool:
    """The step descends what backward() differentiated (g·Δw < 0) and the model's loss on the same batch rises by
    about as much: the gradient the optimizer followed is minus the loss's."""
    descent = _descent(entry)
    if descent is None or not _finite(descent.get("loss_after")) or not descent["predicted"] < 0:
        return False
    rise = descent["loss_after"] - descent["loss_before"]
    return rise > 0 and abs(rise + descent["predicted"]) <= MIRROR_TOLERANCE * -descent["predicted"]


def _in_a_row(history: Sequence[dict], entry: dict, holds) -> int:
    """How many records, this one and those just before it, the probe found `holds` at."""
    count = 0
    for record in (entry, *reversed(history)):
        if not holds(record):
            break
        count += 1
    return count


@check(Scope.TRAINING, "update_ascends",
       "a recorded step's update climbs on both counts — the first-order change it predicts, g·Δw, is above 0 and "
       f"the same batch's loss after the step (the same forward, the same dropout draws) is above its loss before — "
       f"at the optimizer's first step, or at {CLIMBS_IN_A_ROW} records in a row (a Watch given the optimizer)",
       "definition of descent: an optimizer's step moves the weights against the gradient, so g·Δw < 0 and, for a "
       "step small enough to follow its gradient, the batch's loss falls. The first step has no velocity that could "
       "turn it; later, momentum can carry a step or two uphill across a valley, never every one",
       "the update climbs the loss: a sign flipped in the optimizer (maximize, a negative learning rate, a custom "
       "step that adds the gradient)",
       Cause.OPTIMIZER, direct=True,
       advice=phrase("make the step descend: p ← p − lr·update(g) with lr > 0 and maximize=False; check a custom "
                     "optimizer's sign"))
def _update_ascends(history: Sequence[dict], entry: dict) -> list[Finding]:
    if not _climbs(entry):
        return []
    descent, in_a_row = _descent(entry), _in_a_row(history, entry, _climbs)
    if not descent["first_step"] and in_a_row < CLIMBS_IN_A_ROW:
        return []
    when = phrase("the optimizer's first step") if descent["first_step"] else \
        phrase("{count} records in a row", count=in_a_row)
    return [finding(Level.ERROR, None, None, descent["predicted"],
                    phrase("the step after the record at step {step}: g·Δw = {predicted:.3g} > 0, and its batch's "
                           "loss went from {before:.4g} to {after:.4g} ({when})", step=descent.get("at"),
                           predicted=descent["predicted"], before=descent["loss_before"], after=descent["loss_after"],
                           when=when))]


@check(Scope.TRAINING, "objective_opposes_the_loss",
       "the backward of a recording step starts at the model's own loss with a negative gradient (what backward() "
       "differentiated falls as the loss rises); or a recorded step descends what backward() differentiated "
       f"(g·Δw < 0) while the model's loss on the same batch rises by as much (within {MIRROR_TOLERANCE:.0%} of "
       f"|g·Δw|), at {MIRRORED_IN_A_ROW} records in a row (a Watch; the second given the optimizer; both a model "
       "that returns its loss)",
       "chain rule and first order: the gradient reaching the loss is d(objective)/d(loss), 1 for the loss itself, "
       "1/k for a loss divided over k micro-batches, a loss scaler's scale — never below 0. And a small step changes "
       "a loss by its gradient · Δw: the optimizer followed g, and the loss moved by −g·Δw, so its gradient is −g. "
       "A step too large for its batch raises the loss by any amount, not by the mirror of the prediction at record "
       "after record",
       "backward() is called on the negative of the loss (a sign written for a maximisation, a log-likelihood not "
       "negated): the optimizer descends it and the loss climbs",
       Cause.LOSS_FUNCTION, direct=True,
       advice=phrase("call backward() on the loss to minimise — the cross-entropy, the negative log-likelihood — not "
                     "on its negation"))
def _objective_opposes_the_loss(history: Sequence[dict], entry: dict) -> list[Finding]:
    factor = _loop(entry).get("backward_factor")
    if _finite(factor) and factor < 0:
        return [finding(Level.ERROR, None, None, factor,
                        phrase("the backward of step {step} started at the model's loss with gradient {factor:.3g}: "
                               "what backward() differentiated falls as the loss rises", step=entry["step"],
                               factor=factor))]
    in_a_row = _in_a_row(history, entry, _mirrored)
    if in_a_row < MIRRORED_IN_A_ROW:
        return []
    descent = _descent(entry)
    return [finding(Level.ERROR, None, None, descent["loss_after"] - descent["loss_before"],
                    phrase("the step after the record at step {step}: g·Δw = {predicted:.3g} predicts a descent, and "
                           "its batch's loss rose from {before:.4g} to {after:.4g} — by minus the prediction, "
                           "{count} records in a row", step=descent.get("at"), predicted=descent["predicted"],
                           before=descent["loss_before"], after=descent["loss_after"], count=in_a_row))]


MEAN_TOLERANCE = 0.1  # the model's loss within 10% of its logits' mean cross-entropy: a per-micro-batch mean


@check(Scope.TRAINING, "accumulation_summed",
       "a step of k ≥ 2 training forwards whose backward starts at the model's own loss with gradient exactly 1 (not "
       f"1/k), that loss its micro-batch's mean cross-entropy (within {MEAN_TOLERANCE:.0%}), and the optimizer's "
       "step given ‖.grad‖ not divided after it (at least half the record's; a Watch given the optimizer, a model "
       "that returns its loss)",
       "chain rule: the gradient arriving at the loss is d(objective)/d(loss) — 1/k for a mean over k micro-batches "
       "(HF, nanoGPT and Lightning divide each micro-batch's loss by k), 1 for their sum; a loss already normalised "
       "over the whole step (HF's num_items_in_batch) is not its micro-batch's mean, and gradients divided before "
       "the step shrink by k",
       "the micro-batches' losses are summed, not averaged: each update is k times the mean gradient's — k times the "
       "learning rate for SGD unless the rate was chosen for the sum; for Adam and Lion, whose updates are "
       "scale-free, only ε's share changes",
       Cause.TRAINING_LOOP, direct=True,
       advice=phrase("divide each micro-batch's loss by the number of accumulation steps before backward() (or "
                     "average the gradients before optimizer.step())"))
def _accumulation_summed(history: Sequence[dict], entry: dict) -> list[Finding]:
    if not history:
        return []
    recorded, loop = _loop(history[-1]), _loop(entry)  # the step's optimizer.step() is read at the next record
    k, factor, mean = recorded.get("micro_batches"), recorded.get("backward_factor"), \
        recorded.get("loss_over_cross_entropy")
    norm, stepped = history[-1].get("grad_norm"), loop.get("step_gradient")
    if not (isinstance(k, int) and k >= 2 and factor == 1 and _finite(mean) and abs(mean - 1) <= MEAN_TOLERANCE
            and _finite(norm) and norm > 0 and _finite(stepped) and stepped >= norm / 2
            and loop.get("step_gradient_at") == history[-1].get("step")):
        return []
    return [finding(Level.WARNING if scale_free(history[-1]) else Level.ERROR, None, None, float(k),
                    phrase("at step {step}, {k} micro-batches each backpropagated its own mean loss undivided "
                           "(d(objective)/d(loss) = 1, not 1/{k}): the step applied their sum",
                           step=history[-1]["step"], k=k))]


# --- data-parallel training: what every rank must share, and what each must not ----------------------------------

REPLICA_TOLERANCE = 1e-9  # relative: replicas are equal to the bit, and float64 sums of equal tensors are equal


def _ranks(entry: dict) -> list[dict]:
    """Every rank's fingerprint at this record (training/distributed.py), rank 0 first; [] in one process."""
    rows = entry.get("replicas")
    if not isinstance(rows, list) or len(rows) < 2 or not all(isinstance(row, dict) for row in rows):
        return []
    return rows


def _apart(a, b) -> bool:
    """Two sums that differ beyond rounding (non-finite or missing: nothing said)."""
    return _finite(a) and _finite(b) and abs(a - b) > REPLICA_TOLERANCE * max(abs(a), abs(b), 1e-30)


def _first_apart(rows: list[dict], *columns: str) -> Optional[int]:
    return next((rank for rank, row in enumerate(rows[1:], start=1)
                 if any(_apart(rows[0].get(c), row.get(c)) for c in columns)), None)


def _shards_apart(rows: list[dict]) -> Optional[tuple[int, int]]:
    """The first rank whose replicated shards (HSDP) differ from those of the first rank of its replica group, with
    that rank; None when every group agrees or no rank holds such shards."""
    first_of_group: dict[float, int] = {}
    for rank, row in enumerate(rows):
        group = row.get("replica_group")
        if not _finite(group):
            continue
        other = first_of_group.setdefault(group, rank)
        if other != rank and any(_apart(rows[other].get(c), row.get(c)) for c in ("shards_sum", "shards_square")):
            return rank, other
    return None


@check(Scope.TRAINING, "replicas_differ",
       "under data parallelism, a rank's replicated weights differ from rank 0's, or its optimizer's state of them "
       "where every rank holds the same parameters' state, or (FSDP2 replicating over a mesh dimension, HSDP) its "
       "local shards from those of the first rank of its replica group (their sum or sum of squares, beyond "
       f"{REPLICA_TOLERANCE:g} relative; shards and state that differ by design, as ZeRO's, are not compared) "
       "(a Watch)",
       "invariant of DDP: every rank starts from the same weights and applies the same averaged gradient with the "
       "same optimizer, so the replicas stay equal to the bit (TrainCheck, OSDI'25: BLOOM-176B's LayerNorm "
       "weights drifted apart when gradient clipping ran on one rank only); under HSDP the ranks that hold the same "
       "shard are replicas of it",
       "the ranks train different models: a step, a clipping or an update made on some ranks only, or weights "
       "loaded or changed on one rank", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("make every rank run the same step on the same gradients: clip, scale and step on all ranks "
                     "alike, and change weights only where every rank does"))
def _replicas_differ(history: Sequence[dict], entry: dict) -> list[Finding]:
    rows = _ranks(entry)
    rank = _first_apart(rows, "weights_sum", "weights_square") if rows else None
    if rank is not None:
        return [finding(Level.ERROR, None, None, float(rank),
                        phrase("rank {rank}'s weights differ from rank 0's: Σw² {value:.9g} against {reference:.9g}",
                               rank=rank, value=rows[rank]["weights_square"], reference=rows[0]["weights_square"]))]
    if rows and len({row.get("state_held") for row in rows}) == 1:  # the same parameters' state on every rank
        rank = _first_apart(rows, "state_sum", "state_square")
        if rank is not None:
            return [finding(Level.ERROR, None, None, float(rank),
                            phrase("rank {rank}'s optimizer state differs from rank 0's: Σs² {value:.9g} against "
                                   "{reference:.9g}", rank=rank, value=rows[rank]["state_square"],
                                   reference=rows[0]["state_square"]))]
    apart = _shards_apart(rows) if rows else None
    if apart is None:
        return []
    rank, other = apart
    return [finding(Level.ERROR, None, None, float(rank),
                    phrase("rank {rank}'s replicated shards differ from rank {other}'s, a replica of them: Σw² "
                           "{value:.9g} against {reference:.9g}", rank=rank, other=other,
                           value=rows[rank]["shards_square"], reference=rows[other]["shards_square"]))]


@check(Scope.TRAINING, "gradients_not_averaged",
       "after a backward DDP synchronises (not inside no_sync), a rank's gradients differ from rank 0's (a Watch)",
       "definition of DDP: its backward all-reduces every gradient, so after a synchronised backward each rank "
       "holds the same average; gradients accumulated under no_sync differ by design and are not judged",
       "the gradients are not averaged across ranks: a communication hook that skips the all-reduce, a model "
       "moved after wrapping, or parameters DDP does not see", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("let DDP average the gradients: wrap the model after moving it to its device, and keep any "
                     "communication hook's all-reduce"))
def _gradients_not_averaged(history: Sequence[dict], entry: dict) -> list[Finding]:
    rows = _ranks(entry)
    if not rows or not all(row.get("synchronised") == 1 for row in rows):
        return []
    rank = _first_apart(rows, "grads_sum", "grads_square")
    if rank is None:
        return []
    return [finding(Level.ERROR, None, None, float(rank),
                    phrase("after a synchronised backward, rank {rank}'s gradients differ from rank 0's: Σg² "
                           "{value:.6g} against {reference:.6g}", rank=rank, value=rows[rank]["grads_square"],
                           reference=rows[0]["grads_square"]))]


@check(Scope.TRAINING, "same_batch_on_ranks",
       "under data parallelism, every rank's batch is the same ids in the same order (a Watch)",
       "definition of data parallelism: each rank trains on its own share of the data; the same batch on every "
       "rank is one batch's gradient, N times the compute",
       "the data is not split between the ranks: no DistributedSampler, or every rank seeding its sampler alike",
       Cause.DATA, direct=True,
       advice=phrase("give each rank its own share: DataLoader(..., sampler=DistributedSampler(dataset)), with "
                     "sampler.set_epoch(epoch) every epoch"))
def _same_batch_on_ranks(history: Sequence[dict], entry: dict) -> list[Finding]:
    rows = _ranks(entry)  # sums of integer ids, exact in float64: equal only for the same ids in the same order
    if not rows or not all(_finite(row.get("batch_sum")) for row in rows) or \
            any((row.get("batch_sum"), row.get("batch_weighted")) != (rows[0]["batch_sum"], rows[0]["batch_weighted"])
                for row in rows):
        return []
    return [finding(Level.ERROR, None, None, float(len(rows)),
                    phrase("all {count} ranks trained on the same batch", count=len(rows)))]


@check(Scope.TRAINING, "data_order_repeats",
       "from some step on, every training step's batch equals the batch one period before, for a whole period "
       "or 8 steps in a row (a Watch, which keys every step's batch): a warning under torch.distributed, info in one "
       "process", "definition of DistributedSampler: it shuffles with its seed and the epoch set_epoch gave it, so "
       "an epoch it was never given repeats the first epoch's order (PyTorch's DistributedSampler documentation); "
       "its default is shuffle=True, a DataLoader's shuffle=False (a fixed order, as PyTorch's word-language-model "
       "example trains, is legitimate in one process)",
       "the data comes in the same order every epoch: a DistributedSampler whose set_epoch is never called",
       Cause.DATA, direct=True,
       advice=phrase("call sampler.set_epoch(epoch) at the start of every epoch (DistributedSampler shuffles by the "
                     "epoch it is told), or shuffle=True in a DataLoader of one process"))
def _data_order_repeats(history: Sequence[dict], entry: dict) -> list[Finding]:
    repeats = _data(entry).get("order_repeats")
    if not repeats or (history and _data(history[-1]).get("order_repeats")):
        return []  # said at the record that found it
    level = Level.WARNING if (entry.get("ranks") or 1) > 1 else Level.INFO
    return [finding(level, None, None, float(repeats["period"]),
                    phrase("from step {since} on, each batch repeats the batch {period} steps before it: the same "
                           "order again", since=repeats["since"], period=repeats["period"]))]


@check(Scope.TRAINING, "data_repeated_past_use",
       f"the sequences trained on since the Watch began, over the distinct ones among them, exceed "
       f"{REPEATED_PAST_USE} (a Watch, which keys every step's sequences)",
       "Muennighoff et al. 2023, 'Scaling Data-Constrained Language Models': up to 4 epochs of repeated data train "
       "almost as well as fresh data, and the value of repeating decays to nothing at around 16 (40 epochs are "
       "worthless); the count needs no dataset length — each sequence's ids are keyed, and a random window of a "
       "large corpus is almost never drawn twice",
       "the model sees a handful of sequences again and again and memorises them: documents truncated to their "
       "first window, a sampler that draws from a few fixed windows, a dataset far smaller than meant",
       Cause.DATA, direct=True,
       advice=phrase("train on more distinct text: check how the dataset is cut into sequences (truncation keeps only "
                     "each document's first window) and that the sampler draws from all of it"))
def _data_repeated_past_use(history: Sequence[dict], entry: dict) -> list[Finding]:
    counts = _data(entry).get("repetition") or {}
    sequences, distinct = counts.get("sequences"), counts.get("distinct")
    if not sequences or not distinct or sequences / distinct <= REPEATED_PAST_USE:
        return []
    return [finding(Level.WARNING, None, None, sequences / distinct, phrase(
        "the {sequences} sequences trained on are {distinct} distinct ones, each seen {times:.3g} times on average",
        sequences=sequences, distinct=distinct, times=sequences / distinct))]


# the share of evaluated tokens whose id training never held, and its multiple of Good's estimate, that say the
# evaluated batches are not the training data's distribution (a held-out text of the same kind leaves its tokens
# unseen at Good's rate; a byte-level corpus against raw text left 20% of them)
UNSEEN_SHARE = 0.05
UNSEEN_OVER_ESTIMATE = 10
UNSEEN_RECORDS = 2  # records in a row: an evaluation before the first training batches counts as unseen


@check(Scope.TRAINING, "evaluated_tokens_never_trained",
       f"at {UNSEEN_RECORDS} records in a row, of the tokens the loop evaluated since the record before (forwards "
       f"without gradients; the Watch's own probes left out), at least {UNSEEN_SHARE:g} have an id no training batch "
       f"held, and at least {UNSEEN_OVER_ESTIMATE}× the share Good's estimate gives (the training tokens whose id came "
       "exactly once, N1/N)",
       "Good 1953 (after Turing): the probability mass of the ids a sample has not met is estimated by the share of "
       "its tokens whose id it met once, so a batch drawn from the training data's own distribution leaves about "
       "that share of its tokens unseen; many times more is a distribution training never sampled",
       "the evaluated stream is not encoded as the training one: a byte-level tokenizer's visible form of the text "
       "trained on and the text itself evaluated, another tokenizer's (or another vocabulary's) ids, an offset "
       "added on one side; the held-out loss then measures tokens the model was never trained on",
       Cause.DATA, direct=True,
       advice=phrase("encode the training and the held-out data with the same pipeline (tokenizer, vocabulary, any "
                     "preprocessing of the text), and compare a few decoded batches of each"))
def _evaluated_tokens_never_trained(history: Sequence[dict], entry: dict) -> list[Finding]:
    recent = last_records(history, entry, UNSEEN_RECORDS)
    shares = [_unseen(_data(record).get("coverage") or {}) for record in recent]
    if not recent or not all(share is not None for share in shares):
        return []
    coverage = _data(entry)["coverage"]
    return [finding(Level.ERROR, None, None, shares[-1], phrase(
        "{unseen} of the {tokens} tokens evaluated since the record before ({share:.1%}) have an id no training batch "
        "held; a sample of the training data would leave {expected:.2%} unseen",
        unseen=coverage["evaluated_unseen"], tokens=coverage["evaluated_tokens"], share=shares[-1],
        expected=coverage["trained_once"] / coverage["trained_tokens"]))]


def _unseen(coverage: dict) -> Optional[float]:
    """The share of the evaluated tokens unseen in training where it is past both limits of the check above."""
    tokens, trained = coverage.get("evaluated_tokens"), coverage.get("trained_tokens")
    if not tokens or not trained:
        return None
    share, expected = coverage["evaluated_unseen"] / tokens, coverage["trained_once"] / trained
    return share if share >= UNSEEN_SHARE and share >= UNSEEN_OVER_ESTIMATE * expected else None


@check(Scope.TRAINING, "ranks_step_apart",
       "under data parallelism, a rank's learning rate, step count or loss scale differs from rank 0's (a Watch)",
       "invariant of data parallelism: the ranks take one step together, so they share its learning rate, its "
       "number and its loss scale",
       "the ranks do not step alike: a scheduler stepped on some ranks only, a resumed rank at another step, a "
       "loss scaler per rank", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("build and step the scheduler and the loss scaler on every rank alike, and resume every rank from "
                     "one checkpoint"))
def _ranks_step_apart(history: Sequence[dict], entry: dict) -> list[Finding]:
    rows = _ranks(entry)
    for column, said in (("lr", phrase("learning rate")), ("step", phrase("step")),
                         ("loss_scale", phrase("loss scale"))):
        rank = _first_apart(rows, column) if rows else None
        if rank is not None:
            return [finding(Level.ERROR, None, None, float(rank),
                            phrase("rank {rank}'s {what} is {value:g}, rank 0's {reference:g}", rank=rank, what=said,
                                   value=rows[rank][column], reference=rows[0][column]))]
    return []


# --- float16 and its loss scale ------------------------------------------------------------------------------

@check(Scope.TRAINING, "float16_unscaled",
       "the recording forward computed in float16 (autocast to float16, or float16 parameters) and its backward "
       "started from the loss itself, no loss scale above 1 (a Watch given the model's loss)",
       "Micikevicius et al. 2018, Mixed Precision Training (§3.2: float16 gradients below 2^-24 flush to zero; "
       "scaling the loss before backward keeps them); PyTorch's AMP recipe: float16 autocast is used together "
       "with torch.amp.GradScaler (bfloat16, with float32's range, needs no scaler)",
       "float16 without loss scaling: small gradients underflow to zero in the backward, and the layers they "
       "reach learn slowly or not at all", Cause.PRECISION, direct=True,
       advice=phrase("scale the loss: scaler = torch.amp.GradScaler(); scaler.scale(loss).backward(); "
                     "scaler.step(optimizer); scaler.update() — or train in bfloat16, which needs no scaler"))
def _float16_unscaled(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = _loop(entry)
    if loop.get("float16_forward") is not True or loop.get("loss_scale") != 1:
        return []
    return [finding(Level.ERROR, None, None, 1.0, phrase("the forward computed in float16 and its backward was "
                                                         "not scaled: loss scale 1"))]


def _scaled_step(history: Sequence[dict], entry: dict) -> Optional[tuple[int, float, float, float]]:
    """The step after an earlier record whose backward a loss scaler multiplied by S ≥ MIN_SCALE: (its step, S, the
    record's gradient norm as the loss's own, the norm the optimizer's step found); None where not measured."""
    loop = _loop(entry)
    at, stepped = loop.get("step_gradient_at"), loop.get("step_gradient")
    before = _record_at(history, at)
    if before is None or not _finite(stepped) or not _finite(before.get("grad_norm")):
        return None
    scale = _loop(before).get("loss_scale")
    if not _finite(scale) or scale < MIN_SCALE or not before["grad_norm"] > 0:
        return None
    return at, scale, before["grad_norm"], stepped


@check(Scope.TRAINING, "clipped_before_unscaling",
       f"a loss scaler multiplied the backward by S ≥ {MIN_SCALE:g}, and the optimizer's step after the record found "
       f"gradients of at most 1/S of the loss's own (a Watch given the optimizer)",
       "PyTorch's AMP recipe ('Working with unscaled gradients'): clip after scaler.unscale_(optimizer), since "
       "clip_grad_norm_ on scaled gradients measures S × the norm; scaler.step then divides what the clip left by S, "
       "so the step finds max_norm / S — below 1/S of the loss's own gradient wherever the clip acted on a "
       "gradient of norm ≥ max_norm (a legitimate clip leaves min(‖g‖, max_norm))",
       "the gradients were clipped while still multiplied by the loss scale: every step is clipped to max_norm / S, "
       "the learning rate in effect divided by the scale (65,536 by default)", Cause.TRAINING_LOOP, direct=True,
       advice=phrase("call scaler.unscale_(optimizer) before clip_grad_norm_, then scaler.step(optimizer)"))
def _clipped_before_unscaling(history: Sequence[dict], entry: dict) -> list[Finding]:
    found = _scaled_step(history, entry)
    if found is None or not 0 < found[3] * found[1] <= found[2]:
        return []
    at, scale, own, stepped = found
    return [finding(Level.ERROR, None, None, stepped / own, phrase(
        "the optimizer's step after step {at} found gradients of norm {stepped:.3g}, {ratio:.2g} × the loss's own "
        "({own:.3g}), under a loss scale of {scale:g}", at=at, stepped=stepped, ratio=stepped / own, own=own,
        scale=scale))]


# --- the forward's other inputs ------------------------------------------------------------------------------

@check(Scope.TRAINING, "position_ids_constant",
       "the forward's position_ids hold one value throughout every sequence of 2 or more tokens (a Watch)",
       "definition: position ids index the positions of a sequence, so T tokens have T distinct positions "
       "(packed documents restart at 0, but none is one value throughout)",
       "every token is told it sits at one position: RoPE rotates every query and key alike, a learned position "
       "table adds one vector, and word order is invisible but for the causal mask", Cause.DATA, direct=True,
       advice=phrase("give position_ids = arange(T) per sequence (restarting at each packed document), or leave them "
                     "out and let the model make them"))
def _position_ids_constant(history: Sequence[dict], entry: dict) -> list[Finding]:
    if _data(entry).get("positions_constant") is not True:
        return []
    return [finding(Level.ERROR, None, None, 1.0, phrase("every sequence's position_ids are one value throughout"))]


@check(Scope.TRAINING, "attention_mask_inverted",
       "the forward's attention_mask keeps positions that all hold one id and drops positions that hold "
       "several (a Watch)",
       "HF's attention_mask: 1 keeps a token, 0 drops padding; padding is one repeated id (the pad id), text "
       "never is",
       "the mask is inverted: the model attends to the padding and ignores the text", Cause.MASK, direct=True,
       advice=phrase("attention_mask = (input_ids != pad_id): 1 at the text, 0 at the padding (a mask built as == "
                     "pad_id, or 1 - mask applied twice, inverts it)"))
def _attention_mask_inverted(history: Sequence[dict], entry: dict) -> list[Finding]:
    mask = _data(entry).get("mask")
    if not isinstance(mask, dict) or mask.get("kept_one_id") is not True or mask.get("dropped_one_id") is not False:
        return []
    return [finding(Level.ERROR, None, None, 1.0, phrase("the positions the mask keeps all hold one id; those it drops "
                                                  "hold several"))]


# One position per sequence passes: the end-of-text token a collator keeps as the target after the text where the
# pad id is the eos id (GPT-2's tokenizer has no pad token of its own), the first position its mask drops.
PADDING_TARGETS_ALLOWED = 1


@check(Scope.TRAINING, "padding_counted",
       f"the loss counts the targets of more than {PADDING_TARGETS_ALLOWED} position of one sequence that its "
       "attention_mask drops (a Watch)",
       "definition: the positions an attention mask drops are padding, not text, and their targets are the ignore "
       "index (-100), as HF's DataCollatorForLanguageModeling sets them; HF's loss reads the labels, never the "
       "mask. One such position per sequence passes: the end-of-text target a collator keeps when the pad id is "
       "the eos id",
       "the padding is in the loss: the model is trained to predict pad tokens after pad tokens, and the loss "
       "averages in positions that hold no text", Cause.DATA, direct=True,
       advice=phrase("set the labels of padded positions to -100 (labels[attention_mask == 0] = -100), or build the "
                     "batches with a collator that does"))
def _padding_counted(history: Sequence[dict], entry: dict) -> list[Finding]:
    data = _data(entry)
    counted, mask = data.get("padding_counted"), data.get("mask") or {}
    if not _finite(counted) or counted <= PADDING_TARGETS_ALLOWED:
        return []
    if mask.get("kept_one_id") is True and mask.get("dropped_one_id") is False:
        return []  # an inverted mask drops the text: attention_mask_inverted says so, one finding, not two
    return [finding(Level.ERROR, None, None, float(counted),
                    phrase("a sequence's loss counts {count} targets at positions its attention mask drops",
                           count=int(counted)))]


@check(Scope.TRAINING, "padding_trained_on",
       "at least half the sequences of the batch (and 2) end with a run of one id, the same in each, over at least "
       "1/8 of the sequence (and 4 positions), with more than one of the run's targets counted by the loss (a "
       "Watch that sees the targets; where an attention mask drops the run, padding_counted says it)",
       "definition: a collator right-pads a batch with one id, and the padded positions' targets are the ignore "
       "index (-100), as HF's DataCollatorForLanguageModeling sets them; text does not end half a batch's "
       "sequences with one token repeated. One counted target per sequence passes: the end-of-text target",
       "the padding is in the loss, with no mask to say so: the model is trained to predict pad after pad, an easy "
       "target that lowers the training loss and teaches nothing", Cause.DATA, direct=True,
       advice=phrase("set the labels of padded positions to -100 (and pass the attention_mask), or build the "
                     "batches with a collator that does"))
def _padding_trained_on(history: Sequence[dict], entry: dict) -> list[Finding]:
    data = _data(entry)
    padded, rows = data.get("padded_rows"), data.get("rows")
    if not padded or not rows or padded < max(2, rows / 2) or _padding_counted(history, entry):
        return []
    return [finding(Level.ERROR, None, None, float(padded), phrase(
        "{padded} of the batch's {rows} sequences end with a run of id {id} whose targets the loss counts: right "
        "padding trained on", padded=padded, rows=rows, id=int(data.get("padding_id"))))]


# --- a probe of causality ------------------------------------------------------------------------------------

def causal_expected(entry: dict) -> bool:
    """Whether the loop trains next-token prediction: an HF causal LM, or targets that are the text at a shift."""
    data = _data(entry)
    return bool((entry.get("probe") or {}).get("causal_model")) or \
        _relation(data.get("target_match") or {}) is not None


@check(Scope.TRAINING, "forward_not_deterministic",
       f"two forwards of one sequence in eval mode, under no_grad, give logits that differ by more than "
       f"{LEAK_TOLERANCE:g} (relative to their largest magnitude; a Watch's probe, with the causal one)",
       "definition of a network's eval mode: model.eval() switches off everything that draws (dropout, stochastic "
       "depth, noisy gates), so a forward is a function of its input and its weights",
       "the forward draws random numbers in eval mode: a layer created inside forward() (fresh random weights at "
       "each call, never trained: nn.Linear(...)(x)), F.dropout(x, p) without training=self.training, noise "
       "added unconditionally", Cause.ARCHITECTURE, direct=True,
       advice=phrase("create every layer in __init__ (so it is a module of the model, trained and saved), and pass "
                     "training=self.training to functional dropout"))
def _forward_not_deterministic(history: Sequence[dict], entry: dict) -> list[Finding]:
    moved = (entry.get("probe") or {}).get("nondeterministic")
    if not _finite(moved) or moved <= LEAK_TOLERANCE:
        return []
    return [finding(Level.ERROR, None, None, moved, phrase(
        "the same sequence, given twice in eval mode, gave logits {moved:.3g} apart (relative)", moved=moved))]


@check(Scope.TRAINING, "padding_leak",
       f"changing only the ids at the positions the forward's attention_mask drops moves the logits of a kept "
       f"position by more than {LEAK_TOLERANCE:g} (relative) (a Watch's probe: two forwards of one padded sequence "
       "in eval mode, the same random draws; one process)",
       "definition of HF's attention_mask: 0 drops a position from every attention, so a kept position's output "
       "cannot depend on what a dropped one holds (its key weighs exactly 0)",
       "the padding reaches the text: the mask is taken and not passed on to the attention, or a 0/1 keep mask is "
       "added to the scores as if it were an additive one (nothing is masked), so each prediction depends on how "
       "much padding its batch had", Cause.MASK, direct=True,
       advice=phrase("pass the attention_mask to every attention: as a boolean mask (True keeps), or as an additive "
                     "one of 0 and -inf built from it, never the 0/1 mask added to the scores"))
def _padding_leak(history: Sequence[dict], entry: dict) -> list[Finding]:
    probe = entry.get("probe") or {}
    leak = probe.get("padding_leak")
    if probe.get("padding_probed") is not True or not _finite(leak) or leak <= LEAK_TOLERANCE:
        return []
    return [finding(Level.ERROR, None, None, leak,
                    phrase("changing only the padding's ids moved the text's logits by up to {leak:.3g} (relative)",
                           leak=leak))]


@check(Scope.TRAINING, "batch_leak",
       f"changing one sequence of the batch moves another sequence's logits by more than {LEAK_TOLERANCE:g} "
       f"(relative) (a Watch's probe: two forwards of the batch's first sequences in eval mode, the middle one "
       "changed in the second, the same random draws; one process)",
       "definition: a Transformer computes each sequence of a batch alone — attention, norms over the features and "
       "the FFN act within a sequence; batch norm, the one layer that pools a batch, uses its running statistics "
       "in eval mode",
       "the sequences of a batch are mixed: nn.MultiheadAttention given [B, T, E] without batch_first=True attends "
       "across the batch, a reshape or transpose swaps the batch and time axes, a norm pools over the batch",
       Cause.ARCHITECTURE, direct=True,
       advice=phrase("keep the batch axis apart: nn.MultiheadAttention(..., batch_first=True) for [B, T, E] inputs, "
                     "reshapes that keep B first, norms over the last (feature) axis only"))
def _batch_leak(history: Sequence[dict], entry: dict) -> list[Finding]:
    leak = (entry.get("probe") or {}).get("batch_leak")
    if not _finite(leak) or leak <= LEAK_TOLERANCE:
        return []
    return [finding(Level.ERROR, None, None, leak,
                    phrase("changing one sequence of the batch moved another's logits by up to {leak:.3g} (relative)",
                           leak=leak))]


@check(Scope.TRAINING, "future_leak",
       f"changing only the later half of a sequence moves the logits of an earlier position by more than "
       f"{LEAK_TOLERANCE:g} (relative), in a model trained on next-token prediction (a Watch's probe: two "
       "forwards of one sequence in eval mode, any attention implementation)",
       "definition of a causal language model: the prediction at position t depends on tokens 0..t only",
       "later tokens reach earlier positions: the causal mask is missing or misaligned, or a reshape mixes "
       "positions (view where a transpose is needed), so the model can read what it is asked to predict",
       Cause.MASK, direct=True,
       advice=phrase("make each position see only itself and earlier tokens: apply the causal mask to the scores "
                     "(is_causal=True), and split the heads with .view(B, T, heads, d).transpose(1, 2), never .view(B, heads, "
                     "T, d)"))
def _future_leak(history: Sequence[dict], entry: dict) -> list[Finding]:
    leak = (entry.get("probe") or {}).get("future_leak")
    if not _finite(leak) or leak <= LEAK_TOLERANCE or not causal_expected(entry):
        return []
    position = (entry.get("probe") or {}).get("leak_position")
    return [finding(Level.ERROR, None, None, leak,
                    phrase("changing only later tokens moved earlier positions' logits by up to {leak:.3g} (relative; "
                           "most at position {position})", leak=leak, position=position))]
