"""The audit of the setup: the optimizer's hyperparameters against the region its definition is valid in, and
weights that no gradient can ever move.

A setting outside that region is a fault whatever the run's statistics say: an optimizer told to maximize climbs
the loss at every step; moment rates outside [0, 1) do not average; Adam's first moment decaying slower than the
square root of its second is outside the region where Adam is known to converge. The Watch records every param
group's settings (training/loop.optimizer_hyperparameters) in each record's "loop"; these checks read them at every
record (a schedule may move a group out of the region later), so `track` over a timeline finds the same. Each bound
is the definition's, not a level fitted to runs; the variants published recipes use (β = (0.9, 0.95) of GPT-3 and
Llama, (0.9, 0.98) of the Transformer and RoBERTa, (0.9, 0.999) of Adam's paper and BERT, β1 = 0 as in Adafactor's
recipe, Lion's (0.9, 0.99), SGD with Nesterov momentum 0.9, decoupled decay 0.1 at lr 6e-4) lie inside it. A pair
of weight matrices that are each other's gradient factor, both zero from the start, is the initialisation's fault
by the same kind of reasoning: calculus, not a level.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from blocktrace.phrases import phrase
from blocktrace.diagnose.checks import Cause, Finding, Scope, check, finding, last_records
from blocktrace.vocab import Exterior, Level

# optimizers whose update divides a first moment by the square root of a second (Adam, AdamW, NAdam, RAdam,
# Adamax, fused and 8-bit AdamW): the convergence region β1 < √β2 is theirs; Lion's and Adan's betas mean otherwise
ADAM_FAMILY = "adam"
# decoupled decay multiplies each weight by (1 − lr·λ) per step: at this product a weight no gradient holds up
# halves within 100 steps; published recipes stay near 1e-4 (GPT-3 and nanoGPT 6e-4 × 0.1, Llama 2 3e-4 × 0.1)
DECAY_HALVES_IN = 100
DECAY_TOO_STRONG = 1 - 0.5 ** (1 / DECAY_HALVES_IN)
# a first-moment rate (betas[0], SGD's momentum) at which the average spans 1/(1 − β) = 1000 steps: published first
# rates stay at or below 0.99 (Adam 0.9-0.95, Sophia 0.965, Adan 0.98, SGD 0.9-0.99)
FIRST_RATE_STALE = 0.999


def _groups(entry: dict) -> list[tuple[int, dict]]:
    optimizer = (entry.get("loop") or {}).get("optimizer") or {}
    return list(enumerate(optimizer.get("groups") or []))


# optimizers whose update ignores a constant factor on the gradient: Adam's m/√v, Lion's sign
SCALE_FREE_FAMILIES = (ADAM_FAMILY, "lion")


def scale_free(entry: dict) -> bool:
    """Whether the record's optimizer (by its class name) makes scale-free updates."""
    name = ((entry.get("loop") or {}).get("optimizer") or {}).get("class") or ""
    return any(family in name.lower() for family in SCALE_FREE_FAMILIES)


def _class(entry: dict) -> str:
    return ((entry.get("loop") or {}).get("optimizer") or {}).get("class") or "the optimizer"


def _number(value) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else None


@check(Scope.TRAINING, "optimizer_ascends",
       "a param group of the optimizer the Watch is given has maximize=True, or a learning rate below 0",
       "definition (torch.optim): maximize=True steps along +∇L, and a negative learning rate along +∇L as well; "
       "a loss is minimised only by steps along −∇L",
       "every optimizer step climbs the loss: a flag copied from another model's optimizer (optimizer), or a "
       "learning rate that went below 0 — a schedule whose multiplier is not clamped, a warm-down past its end "
       "(learning_rate)", Cause.OPTIMIZER, direct=True,
       advice=phrase("build the optimizer with maximize=False (the default) and keep every learning rate ≥ 0"))
def _optimizer_ascends(history: Sequence[dict], entry: dict) -> list[Finding]:
    flags = []
    for index, group in _groups(entry):
        lr = _number(group.get("lr"))
        if group.get("maximize") is True:
            flags.append(finding(Level.ERROR, None, None, 1.0,
                                 phrase("{class_}'s param group {index} has maximize=True: each step climbs the loss",
                                        class_=_class(entry), index=index)))
        elif lr is not None and lr < 0:  # a value of the learning rate: its schedule's, not the optimizer's rule
            flags.append(finding(Level.ERROR, None, None, lr,
                                 phrase("{class_}'s param group {index} has lr={lr:g} < 0: each step climbs the loss",
                                        class_=_class(entry), index=index, lr=lr), Cause.LEARNING_RATE))
    return flags


@check(Scope.TRAINING, "moment_rates_invalid",
       "a param group's betas, momentum or dampening lie outside [0, 1); Nesterov momentum with a dampening; for "
       f"an Adam-family optimizer, β1 ≥ √β2; for any, a first-moment rate (betas[0], momentum) ≥ {FIRST_RATE_STALE:g}",
       "definition: an exponential moving average m ← β·m + (1 − β)·g averages only for β in [0, 1) (at 1 it never "
       "forgets, above it grows without bound), and SGD's velocity v ← μ·v + (1 − dampening)·g stays bounded only "
       "for μ < 1 and takes the gradient in only for dampening < 1; Nesterov's step g + μ·v is defined with no "
       "dampening (Sutskever et al. 2013; torch.optim.SGD raises 'Nesterov momentum requires a momentum and zero "
       "dampening'); "
       "Adam's convergence analysis needs β1 < √β2 (Kingma & Ba 2015, γ = β1²/√β2 < 1; Reddi et al. 2018, "
       "'On the Convergence of Adam and Beyond', β1 < √β2); a moving average at rate β spans 1/(1 − β) steps, and "
       "published first rates stay at or below 0.99 (Adam 0.9–0.95, Sophia 0.965, Adan 0.98, SGD momentum 0.9–0.99; "
       "the slow 0.9999 of AdEMAMix is a third beta beside a fast first one)",
       "the optimizer's moments do not average the gradients as its definition requires: swapped betas (0.999, "
       "0.9), a rate of 1 or above, a momentum of 1 — its steps are stale or unbounded", Cause.OPTIMIZER,
       direct=True,
       advice=phrase("use betas in [0, 1) with β1 < √β2 — published recipes use (0.9, 0.95), (0.9, 0.98) or (0.9, "
                     "0.999) — and a momentum below 1 (0.9 is usual)"))
def _moment_rates_invalid(history: Sequence[dict], entry: dict) -> list[Finding]:
    adam = ADAM_FAMILY in _class(entry).lower()
    flags = []
    for index, group in _groups(entry):
        fault = _moment_fault(group, adam)
        if fault:
            value, detail = fault
            flags.append(finding(Level.ERROR, None, None, value, phrase("{class_}'s param group {index}: {detail}",
                                                                        class_=_class(entry), index=index,
                                                                        detail=detail)))
    return flags


def _moment_fault(group: dict, adam: bool) -> Optional[tuple[float, str]]:
    """The rate at fault in a group's moment rates and what is wrong with it (None: nothing)."""
    betas = [b for b in (group.get("betas") or []) if _number(b) is not None]
    outside = [b for b in betas if not 0 <= b < 1]
    if outside:
        return outside[0], phrase("betas={betas} has {beta:g} outside [0, 1)", betas=tuple(betas), beta=outside[0])
    momentum = _number(group.get("momentum"))
    if momentum is not None and not 0 <= momentum < 1:
        return momentum, phrase("momentum={momentum:g} is outside [0, 1)", momentum=momentum)
    dampening = _number(group.get("dampening"))
    if dampening is not None and not 0 <= dampening < 1:
        return dampening, phrase("dampening={dampening:g} is outside [0, 1)", dampening=dampening)
    if dampening and group.get("nesterov") is True:
        return dampening, phrase("nesterov=True with dampening={dampening:g}: Nesterov momentum is defined without "
                                 "dampening (torch.optim.SGD refuses it)", dampening=dampening)
    if adam and len(betas) == 2 and betas[0] >= math.sqrt(betas[1]):
        return betas[0], phrase("betas={betas}: β1 = {beta1:g} ≥ √β2 = {root:.4g}, outside the region where Adam "
                                "converges (β1 < √β2)", betas=tuple(betas), beta1=betas[0], root=math.sqrt(betas[1]))
    first = betas[0] if betas else momentum
    if first is not None and first >= FIRST_RATE_STALE:
        return first, phrase("first-moment rate {first:g}: its average spans {steps:.0f} steps, where published first "
                             "rates stay at or below 0.99 (betas swapped?)", first=first, steps=1 / (1 - first))
    return None


@check(Scope.TRAINING, "weight_decay_too_strong",
       f"a param group's decoupled weight decay has lr·λ ≥ {DECAY_TOO_STRONG:.3g} (a weight halves in "
       f"{DECAY_HALVES_IN} steps without a gradient: warning), or ≥ 1 (error)",
       "definition (Loshchilov & Hutter 2019, torch.optim.AdamW): each step multiplies every weight by (1 − lr·λ); "
       "at lr·λ ≥ 1 that factor is ≤ 0, so the weights are zeroed or flip sign at every step; published recipes "
       "use about 1e-4 (GPT-3 and nanoGPT: lr 6e-4 × λ 0.1)",
       "the weight decay shrinks the weights faster than the gradients can hold them up: a decay meant for L2 "
       "(λ around 1e-4 × lr⁻¹) given to AdamW, or λ and lr swapped", Cause.OPTIMIZER, direct=True,
       advice=phrase("use a decoupled weight decay λ around 0.1 with learning rates around 1e-3 or below (lr·λ near "
                     "1e-4)"))
def _weight_decay_too_strong(history: Sequence[dict], entry: dict) -> list[Finding]:
    flags = []
    for index, group in _groups(entry):
        lr, decay = _number(group.get("lr")), _number(group.get("weight_decay"))
        if group.get("decoupled_weight_decay") is not True or lr is None or decay is None:
            continue
        product = lr * decay
        if product >= DECAY_TOO_STRONG:
            flags.append(finding(Level.ERROR if product >= 1 else Level.WARNING, None, None, product,
                                 phrase("{class_}'s param group {index}: lr·weight_decay = {lr:g} × {decay:g} = "
                                        "{product:.3g}: each step multiplies the weights by {kept:.3g}",
                                        class_=_class(entry), index=index, lr=lr, decay=decay, product=product,
                                        kept=1 - product)))
    return flags


@check(Scope.TRAINING, "orthogonalised_embedding_or_head",
       "a param group Muon updates (use_muon=True, or any group of an optimizer named Muon that carries no such flag) "
       "holds the model's embedding or its output head (a Watch)",
       "definition (Jordan 2024, 'Muon: An optimizer for hidden layers in neural networks'): Muon orthogonalises the "
       "updates of the hidden layers' 2D weights, and 'the input and output layers should be optimized by a standard "
       "method such as AdamW'; its README splits model.body from model.embed and model.head, Keras's Muon excludes "
       "the embedding and the final output layer, DeepSpeed (PR #7641) keeps embedding and lm_head on AdamW",
       "the embedding or the head takes an orthogonalised step meant for hidden matrices: every matrix of the model "
       "handed to Muon (p.ndim >= 2 over the whole model, not its body)", Cause.OPTIMIZER, direct=True,
       advice=phrase("give Muon the hidden layers' matrices only, and the embedding, the output head, gains and biases "
                     "to an AdamW group"))
def _orthogonalised_embedding_or_head(history: Sequence[dict], entry: dict) -> list[Finding]:
    named_muon = "muon" in _class(entry).lower()
    flags = []
    for index, group in _groups(entry):
        muon = group.get("use_muon") is True or (named_muon and "use_muon" not in group)
        held = [role.value for role in Exterior if group.get(f"holds_{role.value}") is True]
        if muon and held:
            flags.append(finding(Level.WARNING, None, None, float(len(held)), phrase(
                "{class_}'s param group {index} updates the model's {layers} with Muon's orthogonalised step",
                class_=_class(entry), index=index, layers=" and ".join(held))))
    return flags


# schedulers whose step takes a fraction of an epoch by design (torch's docs: scheduler.step(epoch + i / iters))
FRACTIONAL_EPOCHS = ("CosineAnnealingWarmRestarts",)


@check(Scope.TRAINING, "scheduler_stepped_with_a_value",
       "a learning-rate scheduler driving the optimizer the Watch is given has a step count (last_epoch) that is not "
       "a whole number (CosineAnnealingWarmRestarts, which takes fractional epochs, aside; a Watch given optimizer=)",
       "definition (torch.optim.lr_scheduler): step() counts steps, and step(epoch)'s argument (deprecated) is the "
       "step number the schedule is evaluated at; only ReduceLROnPlateau.step(metrics) takes a measured value "
       "(pytorch/pytorch#2849: 'the default API for step is either step() or step(epoch) … for ReduceLROnPlateau "
       "is step(metric)'). A count that is not whole was set from a value",
       "the schedule is evaluated at a loss or a metric instead of the step: step(loss.item()) written for a "
       "scheduler that is not ReduceLROnPlateau — its learning rate follows the loss, not the recipe",
       Cause.LEARNING_RATE, direct=True,
       advice=phrase("call scheduler.step() with no argument once per optimizer step; pass the metric only to "
                     "ReduceLROnPlateau.step(metric)"))
def _scheduler_stepped_with_a_value(history: Sequence[dict], entry: dict) -> list[Finding]:
    for scheduler in (entry.get("loop") or {}).get("schedulers") or []:
        count = _number(scheduler.get("last_epoch"))
        if count is not None and count != int(count) and scheduler.get("class") not in FRACTIONAL_EPOCHS:
            return [finding(Level.ERROR, None, None, count, phrase(
                "{class_}'s step count is {count:.6g}, not a step number: step() was given a value",
                class_=scheduler.get("class"), count=count))]
    return []


def _schedules(entry: dict) -> list[tuple[dict, dict]]:
    """(scheduler, its transformers schedule) for each scheduler whose lengths were read (training/schedulers.py)."""
    return [(scheduler, scheduler["schedule"]) for scheduler in (entry.get("loop") or {}).get("schedulers") or []
            if isinstance(scheduler.get("schedule"), dict)]


@check(Scope.TRAINING, "warmup_beyond_schedule",
       "a transformers schedule driving the optimizer (get_cosine_schedule_with_warmup and its kin, found behind a "
       "LambdaLR) has more warm-up steps than steps in all (num_warmup_steps > num_training_steps; a Watch given "
       "optimizer=)",
       "definition (transformers.optimization): the warm-up is the first num_warmup_steps of the num_training_steps "
       "the schedule spans, so it cannot be longer than they are; with more, the rate rises for the whole run and "
       "the decay never starts (shirley-wu/cross-doc-misinfo-detection#1: 'the arguments of num_warmup_steps and "
       "num_training_steps are switched … the LR is always arising during the whole training')",
       "the schedule's two lengths are swapped (passed by position in the wrong order) or the warm-up counted in "
       "other units than the run (samples, micro-batches): the rate climbs all run and reaches its peak, if ever, at "
       "the end", Cause.LEARNING_RATE, direct=True,
       advice=phrase("pass the lengths by name — num_warmup_steps (a few per cent of the run) and num_training_steps "
                     "(the optimizer steps of the whole run)"))
def _warmup_beyond_schedule(history: Sequence[dict], entry: dict) -> list[Finding]:
    for _, schedule in _schedules(entry):
        warmup, end = _number(schedule.get("warmup")), _number(schedule.get("end"))
        if warmup is not None and end is not None and warmup > end:
            return [finding(Level.ERROR, None, None, warmup, phrase(
                "{function}: num_warmup_steps = {warmup:g} is more than the {end:g} steps of the whole schedule",
                function=schedule.get("function"), warmup=warmup, end=end))]
    return []


@check(Scope.TRAINING, "warmup_given_as_ratio",
       "a transformers schedule driving the optimizer has a number of warm-up steps strictly between 0 and 1 (a "
       "Watch given optimizer=)",
       "definition (transformers.optimization): num_warmup_steps counts optimizer steps, and the factor is "
       "step / max(1, num_warmup_steps) before it — 0 at step 0 and the full rate from step 1 for any count below 1; "
       "the ratio is TrainingArguments' warmup_ratio, a separate argument (transformers PR #10229, issue #6673)",
       "a warm-up ratio (0.1 for a tenth of the run) passed where the number of warm-up steps belongs: the run has "
       "no warm-up and takes its peak rate from the second step", Cause.WARMUP, direct=True,
       advice=phrase("pass num_warmup_steps = int(ratio × the run's optimizer steps), not the ratio"))
def _warmup_given_as_ratio(history: Sequence[dict], entry: dict) -> list[Finding]:
    for _, schedule in _schedules(entry):
        warmup = _number(schedule.get("warmup"))
        if warmup is not None and 0 < warmup < 1:
            return [finding(Level.ERROR, None, None, warmup, phrase(
                "{function}: num_warmup_steps = {warmup:g}, a fraction of one step: the warm-up ends at step 1",
                function=schedule.get("function"), warmup=warmup))]
    return []


# a scheduler's step count may run one past its schedule's end (a scheduler.step() after the last optimizer step)
PAST_THE_END = 1


@check(Scope.TRAINING, "schedule_past_its_end",
       f"a schedule driving the optimizer — a transformers schedule function behind a LambdaLR, torch's "
       f"CosineAnnealingLR or PolynomialLR — is at a step more than {PAST_THE_END} past its end (num_training_steps, "
       "WSD's warm-up + stable + decay steps, T_max, total_iters), and its factor there is 0 or above its factor at "
       "the end (a Watch given optimizer=)",
       "definition (transformers.optimization, torch.optim.lr_scheduler): a schedule spans its steps; beyond them the "
       "linear and hard-restart schedules and PolynomialLR give 0 (no step moves the weights) and the cosine ones "
       "wrap around, the rate climbing back towards its peak (CosineAnnealingLR 'implements the cosine annealing "
       "part of SGDR, and not the restarts'). Schedules that end on a floor above 0 and keep it (polynomial decay's "
       "lr_end, WSD's min_lr_ratio) may be run past their end and pass, and so do LinearLR and ConstantLR, which "
       "hold their last factor by design",
       "the run is longer than the schedule it was given: num_training_steps or T_max counted in epochs while the "
       "scheduler steps every batch, in optimizer steps of another batch size, or before gradient accumulation was "
       "added — past the end the rate is 0 or rises again",
       Cause.LEARNING_RATE, direct=True,
       advice=phrase("give the schedule the optimizer steps of the whole run: epochs × batches per epoch ÷ "
                     "accumulation steps"))
def _schedule_past_its_end(history: Sequence[dict], entry: dict) -> list[Finding]:
    for scheduler, schedule in _schedules(entry):
        step, end = _number(scheduler.get("last_epoch")), _number(schedule.get("end"))
        now, at_end = _number(schedule.get("factor_now")), _number(schedule.get("factor_at_end"))
        if None in (step, end, now, at_end) or step <= end + PAST_THE_END or not (now == 0 or now > at_end):
            continue
        return [finding(Level.ERROR, None, None, step, phrase(
            "{function} is at step {step:g} of a schedule of {end:g} steps: its factor is {now:.3g} there, "
            "{at_end:.3g} at its end", function=schedule.get("function"), step=step, end=end, now=now,
            at_end=at_end))]
    return []


# pairs of weight kinds each of which is the other's gradient factor: both zero, neither ever moves
# (∂L/∂W1 ∝ W2 and ∂L/∂W2 ∝ act(x·W1) = act(0) = 0 for GELU, SiLU and ReLU; ∂L/∂Wq ∝ Wk and ∂L/∂Wk ∝ Wq)
STUCK_TOGETHER = (("ffn_w1", "ffn_w2"), ("attn_q", "attn_k"), ("attn_qkv", "attn_qkv"))


DROPOUT_HALF = 0.5  # a rate that drops at least every other activation: published LM recipes stay at or below 0.3
# a rate that keeps at most a fifth: a keep probability (TensorFlow 1's keep_prob, 0.8-0.9 in its recipes) given
# where PyTorch's drop rate belongs
DROPOUT_KEEP_GIVEN = 0.8


@check(Scope.TRAINING, "dropout_too_high",
       f"a dropout module of the model has p ≥ {DROPOUT_HALF:g} (warning), ≥ {DROPOUT_KEEP_GIVEN:g} (error) (a Watch)",
       "definition: dropout zeroes each activation with probability p and scales the rest by 1/(1 − p); published "
       "language-model recipes use 0 to 0.3 (GPT-2, BERT and T5 0.1, nanoGPT's Shakespeare 0.2, none above 0.3); "
       "TensorFlow 1's tf.nn.dropout took the keep probability (keep_prob, 0.8–0.9 in its recipes), the complement "
       "of PyTorch's p",
       "most of each layer's signal is dropped at every step, so the gradient is mostly noise: a config value left "
       "on, or a keep probability given where a drop rate is meant", Cause.ARCHITECTURE, direct=True,
       advice=phrase("set dropout to the recipe's rate (0.0 to 0.1 for pre-training a language model; p is the share "
                     "dropped, not kept)"))
def _dropout_too_high(history: Sequence[dict], entry: dict) -> list[Finding]:
    dropout = (entry.get("loop") or {}).get("dropout")
    if not isinstance(dropout, dict) or not (_number(dropout.get("p")) or 0) >= DROPOUT_HALF:
        return []
    level = Level.ERROR if dropout["p"] >= DROPOUT_KEEP_GIVEN else Level.WARNING
    return [finding(level, None, None, dropout["p"],
                    phrase("{module} drops p = {dropout:g} of its activations", module=dropout.get('module'),
                           dropout=dropout['p']))]


@check(Scope.TRAINING, "frozen_matrix_zero",
       "a matrix or embedding table of the model (a floating parameter of two or more axes) holds only zeros and "
       "requires no gradient (a Watch: every frozen matrix read at the first record)",
       "definition: a tensor that requires no gradient keeps its values for the whole run, and a matrix of zeros "
       "maps every input to 0 (an embedding table of zeros adds nothing to the stream), so its module contributes "
       "nothing now and never will; the zero-initialised matrices of published recipes (LoRA's B, Fixup's and "
       "GPT-NeoX's output projections) are the ones trained",
       "a component of the model is switched off for good: a position embedding zeroed and frozen (no position "
       "signal but the causal mask), a module frozen after its weights were zeroed or before they were loaded",
       Cause.ARCHITECTURE, direct=True,
       advice=phrase("give the matrix its initialisation or its pretrained values, or let it train "
                     "(requires_grad=True and in the optimizer); remove the module if it is meant to be absent"))
def _frozen_matrix_zero(history: Sequence[dict], entry: dict) -> list[Finding]:
    names = (entry.get("loop") or {}).get("frozen_zero")
    if not names:
        return []
    return [finding(Level.ERROR, None, None, float(len(names)),
                    phrase("{names} {are} exactly 0 and {require} no gradient", names=", ".join(names[:3]) +
                           (" …" if len(names) > 3 else ""), are="are" if len(names) > 1 else "is",
                           require="require" if len(names) > 1 else "requires"))]


@check(Scope.TRAINING, "requires_grad_attribute_ignored",
       "a module of the model holds a requires_grad attribute of its own that some of its parameters contradict (a "
       "Watch, at every record)",
       "definition (torch.nn.Module): a module has no requires_grad attribute — autograd reads the flag on each "
       "parameter, and Module.requires_grad_(flag) sets it on every parameter of the module; assigning "
       "module.requires_grad = flag adds a plain Python attribute that nothing reads (PyTorch forums, 'Freezing "
       "layers': model.requires_grad = False 'will not freeze'). The attribute stands only where someone meant it; "
       "parameters that disagree show it did nothing",
       "a layer meant to be unfrozen stays frozen (and out of an optimizer built from the parameters that require a "
       "gradient), or one meant to be frozen trains: `layer.requires_grad = True` written for "
       "`layer.requires_grad_(True)`", Cause.GRADIENT_FLOW, direct=True,
       advice=phrase("call module.requires_grad_(flag) — the method, with the underscore — and build the optimizer "
                     "after it"))
def _requires_grad_attribute_ignored(history: Sequence[dict], entry: dict) -> list[Finding]:
    found = (entry.get("loop") or {}).get("requires_grad_attributes")
    if not found:
        return []
    return [finding(Level.ERROR, None, None, float(item["differing"]), _attribute_ignored(item)) for item in found]


def _attribute_ignored(item: dict) -> str:
    if item["value"]:
        return phrase("{module}.requires_grad = True is a plain attribute: {differing} of its {parameters} parameters "
                      "require no gradient", module=item["module"], differing=item["differing"],
                      parameters=item["parameters"])
    return phrase("{module}.requires_grad = False is a plain attribute: {differing} of its {parameters} parameters "
                  "still require a gradient", module=item["module"], differing=item["differing"],
                  parameters=item["parameters"])


@check(Scope.TRAINING, "token_embedding_zero",
       "the model's token embedding (HF's input embedding, else its largest nn.Embedding) holds only zeros at the "
       "Watch's first record",
       "definition: the embedding is the model's only view of which token it reads; a table of zeros gives every "
       "token the same vector (only positions differ), so no layer can tell its inputs apart until the table has "
       "learned. Published initialisations draw it at random (GPT-2 N(0, 0.02), BERT, Llama); the zero-initialised "
       "layer of μP (Yang et al. 2021) is the output head — which, tied, is this very table",
       "the token embedding was zeroed: a head zeroed in place (μP's zero readout applied to a tied head), an "
       "initialisation that zeroes every nn.Embedding, a table never loaded", Cause.INITIALISATION, direct=True,
       advice=phrase("draw the token embedding at random (N(0, 0.02) as GPT-2); zero-initialise only an untied "
                     "output head"))
def _token_embedding_zero(history: Sequence[dict], entry: dict) -> list[Finding]:
    name = (entry.get("loop") or {}).get("token_embedding_zero")
    if not name:
        return []
    return [finding(Level.ERROR, None, None, 0.0, phrase(
        "{name} holds only zeros at step {step}: every token enters the model as the same vector", name=name,
        step=entry.get("step")), None if entry.get("step") == 0 else Cause.WEIGHTS)]


@check(Scope.TRAINING, "autocast_casts_stale",
       "at a record, under a torch.autocast context still open there with its cast cache on, the copy of the first "
       "nn.Linear's float32 weight that autocast serves to a matmul differs from that weight's values cast now (an "
       "identity matmul over 64 of its rows)",
       "definition (torch.autocast): the cast of each leaf weight that requires a gradient is cached until the "
       "outermost context exits, so one forward's uses of a weight share a cast of its current values; a context "
       "held across optimizer.step() serves the casts made before the step from then on. PyTorch's AMP recipe "
       "wraps only the forward and the loss (and the backward may run outside); a fresh cast matches exactly",
       "one autocast context wraps the whole training loop (or several steps): every forward computes with the "
       "low-precision weights of the step the context opened at, while the float32 weights move under it — the "
       "loss stays where that step left it", Cause.PRECISION, direct=True,
       advice=phrase("open torch.autocast anew for each step's forward and loss (`with torch.autocast(...): loss "
                     "= model(x)`), and call optimizer.step() outside it"))
def _autocast_casts_stale(history: Sequence[dict], entry: dict) -> list[Finding]:
    stale = (entry.get("loop") or {}).get("autocast_stale") or {}
    share = _number(stale.get("share"))
    if not share:
        return []
    return [finding(Level.ERROR, None, None, share, phrase(
        "under the autocast open at step {step}, {share:.1%} of {name}'s low-precision copy differs from the "
        "weight now: the forward computes with casts made before later optimizer steps", step=entry.get("step"),
        share=share, name=stale.get("name")))]


@check(Scope.TRAINING, "embeddings_untied",
       "the model's config ties its output embedding to its input embedding (tie_word_embeddings true), and the "
       "two are different tensors (a Watch, on an HF model)",
       "definition: HF's PreTrainedModel makes a tied head the very tensor of the input embedding (tie_weights), so "
       "one matrix both reads and writes the vocabulary; two tensors are a model other than the config's",
       "the tie was lost after the model was built: a head replaced or re-created, the model moved or wrapped by a "
       "tool that copies parameters one by one (a device move that unties, a sharding that duplicates), a "
       "checkpoint loaded into a fresh head; the head then trains apart from the embedding, with twice the "
       "parameters", Cause.ARCHITECTURE, direct=True,
       advice=phrase("call model.tie_weights() after moving, wrapping or loading the model, before the optimizer is "
                     "built (so that it holds the one tensor)"))
def _embeddings_untied(history: Sequence[dict], entry: dict) -> list[Finding]:
    embeddings = (entry.get("loop") or {}).get("embeddings")
    if not isinstance(embeddings, dict) or embeddings.get("tied") is not False:
        return []
    return [finding(Level.ERROR, None, None, 1.0, phrase(
        "{model}'s config ties its output embedding to its input embedding, and they are two tensors",
        model=entry.get("model") or phrase("the model")))]


# the optimizers whose every move per unit of learning rate is bounded by their definition, by class-name ending
# (torch's Adam and AdamW and the hand-written or wrapped ones named so; Lion's sign): NAdam, RAdam, Adamax,
# schedule-free, 8-bit, GaLore's projected and Adam-mini's block-shared updates follow other arithmetic
BOUNDED_ADAM, BOUNDED_SIGN = ("adam", "adamw"), ("lion",)
UNBOUNDED_VARIANTS = ("nadam", "radam", "adamax", "schedulefree", "8bit", "galore", "mini")
# the bound is exact (ε only lowers a move); the margin is for state kept in 16 bits, whose rounding of m and v
# can move the ratio by a few per cent, never by half
MOVE_MARGIN = 1.5
# a sign update's largest sampled move against the learning rate: 1 by definition, rounding aside (a move of lr on a
# weight of 0.02 in float32 is exact to ~1e-3 of lr at lr 1e-4); half of it is no sign
SIGN_SHORT = 0.5
# a first moment this far from 0 cannot sit over a float32 second moment of exactly 0 (|m| ≤ C·√v with C below
# 1,000 for every β2 ≤ 0.999999, and the smallest float32 is 1.4e-45: |m| < 4e-20 there): only rounding to 16 bits or
# below can have zeroed v
FIRST_MOMENT_FLOOR = 1e-12
# an update of a momentum optimizer that a·g + b·w explains but for this share of its size carries no earlier gradient
MEMORYLESS = 1e-3
STATE_RECORDS = 2  # records in a row for the optimizer-state checks: a one-off reset (a restart, ReLoRA's) is a recipe
# a first moment this many times the gradients' size needs gradients as much larger within its memory, at two records
# apart (a spike's gradient, 10-100× for a step, has decayed from Adam's average by the next record)
MOMENT_OVER_GRADIENT = 10
# the optimizers (by class name) whose exp_avg is by definition an average of the raw gradients: Adam's family, Lion.
# ADOPT's averages g/√v (of size ~1 whatever the gradients'), NovoGrad's g/‖g‖: their exp_avg is no such average
RAW_AVERAGE_FAMILIES = (ADAM_FAMILY, "lion")


def adam_move_bound(beta1: float, beta2: float, step: Optional[int] = None) -> Optional[float]:
    """The largest |m̂_t|/√v̂_t any gradient sequence can give at step t (every step when t is not known; None outside
    β1² < β2): by Cauchy–Schwarz on m_t = Σ(1−β1)β1^(t−i)g_i against v_t = Σ(1−β2)β2^(t−i)g_i²,
    |m_t| ≤ (1−β1)/√(1−β2)·√((1−γ^t)/(1−γ))·√v_t with γ = β1²/β2; with the bias corrections that is
    (1−β1)/√(1−β2)·√((1−γ^t)/(1−γ))·√(1−β2^t)/(1−β1^t) — 1 at t = 1, (1−β1)/√((1−β2)(1−γ)) as t grows (the
    same limit bounds an Adam without bias correction)."""
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1) or beta1 ** 2 >= beta2:
        return None
    gamma = beta1 ** 2 / beta2
    scale = (1 - beta1) / math.sqrt(1 - beta2)

    def at(t: int) -> float:
        return scale * math.sqrt((1 - gamma ** t) / (1 - gamma)) * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)

    if step is not None:
        return at(step)
    steps = list(range(1, 2001)) + [int(10 ** (k / 8)) for k in range(27, 57)]
    return max(max(at(t) for t in steps), scale / math.sqrt(1 - gamma))


def _move_bound(optimizer_class: str, group: dict, step: Optional[int]) -> Optional[float]:
    """The largest move per unit of learning rate the class's definition allows this group at this step of its
    (None: no bound)."""
    name = optimizer_class.lower()
    if any(variant in name for variant in UNBOUNDED_VARIANTS):
        return None
    if name.endswith(BOUNDED_SIGN):
        return 1.0  # lr·sign(·): every weight moves by exactly lr, or not at all
    betas = [_number(b) for b in group.get("betas") or []]
    if name.endswith(BOUNDED_ADAM) and len(betas) == 2 and None not in betas:
        return adam_move_bound(*betas, step)
    return None


@check(Scope.TRAINING, "update_exceeds_its_bound",
       f"in the optimizer step after a record, a weight of a param group of an Adam or AdamW (by class name, "
       f"hand-written ones included) moved by more than {MOVE_MARGIN:g} × the largest |m̂/√v̂| its betas allow at "
       f"that step (over every step where the optimizer keeps no step count), per unit of learning rate "
       f"(Lion: {MOVE_MARGIN:g} × 1); the decay's part lr·λ·|w| and the rounding of the "
       f"weight's dtype are not counted",
       "definition and Cauchy–Schwarz: Adam moves each weight by lr·m̂/(√v̂ + ε), and m and v average the same "
       "gradients, so |m̂|/√v̂ ≤ (1−β1)/√((1−β2)(1−β1²/β2)) at most (7.3 at β (0.9, 0.999), 1.2 at (0.9, 0.95); "
       "1 at the first step; Kingma & Ba 2015 §2.1 bound the typical move by lr); Lion moves each by lr·sign(·)",
       "the optimizer's arithmetic is not its definition: a square root missing from the denominator, bias "
       "corrections multiplied in, a moment updated with the wrong rate — or its second moment rounded to 0 "
       "(a state saved or kept in 16 bits: precision)", Cause.OPTIMIZER, direct=True,
       advice=phrase("use torch.optim.AdamW, or check a hand-written optimizer's update against its formula: "
                     "lr·m̂/(√v̂ + ε) with m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t)"))
def _update_exceeds_its_bound(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = entry.get("loop") or {}
    moves = loop.get("update_moves") or []
    lost = _number(loop.get("moments_lost")) or 0
    flags = []
    for (index, group), move in zip(_groups(entry), moves):
        bound = _move_bound(_class(entry), group, loop.get("update_step"))
        move = _number(move)
        if bound is None or move is None or move <= MOVE_MARGIN * bound:
            continue
        flags.append(finding(Level.ERROR, None, None, move, phrase(
            "{class_}'s param group {index} moved a weight by {move:.3g} × its learning rate in the step after the "
            "record at step {step}; its definition bounds a move by {bound:.3g} × the learning rate{when}{why}",
            class_=_class(entry), index=index, move=move, step=loop.get("step_gradient_at", entry.get("step")),
            bound=bound, when=phrase(" at its step {t}", t=loop["update_step"]) if loop.get("update_step") else "",
            why=phrase(": {lost:g} of its second moments are 0 where the first is not, rounded away", lost=lost)
            if lost else ""), Cause.PRECISION if lost else None))
    return flags


@check(Scope.TRAINING, "sign_update_short",
       f"in the optimizer step after a record, no sampled weight of a param group of a Lion (by class name, "
       f"hand-written ones included) moved by {SIGN_SHORT:g} × the learning rate (beyond the decay's part lr·λ·|w| "
       f"and the rounding of the weight's dtype)",
       "definition: Lion moves every weight by lr·sign(β1·m + (1 − β1)·g) (Chen et al. 2023, Algorithm 2): by "
       "exactly the learning rate wherever that interpolation is not 0, so among a few thousand sampled weights "
       "the largest move is the learning rate",
       "the optimizer's update is not a sign: sign() left out (the interpolation itself applied, a hundred times "
       "smaller than the learning rate's step), or the sign taken of a state that has become 0",
       Cause.OPTIMIZER, direct=True,
       advice=phrase("apply lr·sign(β1·m + (1 − β1)·g) in a hand-written Lion (google/automl's lion_pytorch.py), "
                     "or use a maintained implementation"))
def _sign_update_short(history: Sequence[dict], entry: dict) -> list[Finding]:
    loop = entry.get("loop") or {}
    if not _class(entry).lower().endswith(BOUNDED_SIGN):
        return []
    flags = []
    for (index, group), move in zip(_groups(entry), loop.get("update_moves") or []):
        move = _number(move)
        if move is None or move >= SIGN_SHORT:
            continue
        flags.append(finding(Level.ERROR, None, None, move, phrase(
            "{class_}'s param group {index} moved no weight by more than {move:.3g} × its learning rate in the step "
            "after the record at step {step}; its definition moves each by exactly the learning rate",
            class_=_class(entry), index=index, move=move, step=loop.get("step_gradient_at", entry.get("step")))))
    return flags


@check(Scope.TRAINING, "momentum_not_carried",
       f"at {STATE_RECORDS} records in a row, in the optimizer step after the record, the sampled update of a "
       f"param group whose momentum is above 0 is a·g + b·w to within {MEMORYLESS:g} of its size (g the gradient as "
       "the step began, w the weights; beyond their rounding), the optimizer having held state before that step",
       "definition: a momentum optimizer's update carries earlier gradients — SGD's buf = μ·buf + g, the update buf "
       "or, with Nesterov, g + μ·buf (Polyak 1964; Sutskever et al. 2013) — and minibatch gradients are never "
       "parallel step after step; only at a first step (buf = g) is the update the current gradient's alone",
       "the velocity is re-made from the current gradient at every step: a buffer created anew (zeros, or g) inside "
       "each step, state keyed by something new at each step, a momentum written to a copy — the optimizer runs as "
       "plain SGD at (1 + μ)× or 1/(1 − μ)× less effective learning rate than meant, without its smoothing",
       Cause.OPTIMIZER, direct=True,
       advice=phrase("keep the momentum buffer in the optimizer's state across steps (create it only where it does "
                     "not exist yet), as torch.optim.SGD does"))
def _momentum_not_carried(history: Sequence[dict], entry: dict) -> list[Finding]:
    recent = last_records(history, entry, STATE_RECORDS)
    if not recent:
        return []
    shares = [(record.get("loop") or {}).get("update_unexplained") or [] for record in recent]
    flags = []
    for (index, group), share in zip(_groups(entry), shares[-1]):
        momentum = _number(group.get("momentum")) or 0.0
        if momentum <= 0 or not all(_memoryless(found, index) for found in shares):
            continue
        flags.append(finding(Level.ERROR, None, None, _number(share), phrase(
            "{class_}'s param group {index} has momentum {momentum:g}, yet in the steps after the records at steps "
            "{steps} its update was the current gradient's and weights' alone (all but {share:.2g} of it)",
            class_=_class(entry), index=index, momentum=momentum, share=_number(share),
            steps=", ".join(str((record.get("loop") or {}).get("step_gradient_at", record.get("step")))
                            for record in recent))))
    return flags


def _memoryless(shares: list, index: int) -> bool:
    share = _number(shares[index]) if index < len(shares) else None
    return share is not None and share <= MEMORYLESS


@check(Scope.TRAINING, "first_moment_outgrew_gradients",
       f"at {STATE_RECORDS} records in a row, as the optimizer step after the record begins, the RMS of the "
       f"first moments (exp_avg) of an Adam or a Lion (by class name, hand-written ones included) is "
       f"{MOMENT_OVER_GRADIENT:g}× or more the RMS of the gradients they average (over the parameters whose gradient "
       "is not all 0); ADOPT, NovoGrad and other optimizers that average normalised gradients are not judged",
       "definition and the triangle inequality: the first moment is an exponential average of the gradients, "
       "m_t = (1 − β1)·Σ_s β1^(t−s)·g_s with weights summing to below 1, so ‖m‖ ≤ max_s ‖g_s‖ over its memory "
       "(~1/(1 − β1) steps); 10× the current gradients needs gradients 10× larger within that memory, at two "
       "records in a row",
       "the optimizer's state is written by something other than its average: an update computed in place on the "
       "state (Lion's exp_avg.mul_(β1).add_(g).sign_() — the state becomes ±1 and every later step repeats the first "
       "update's direction), a state loaded from another run or scaled by a loss scale it was not unscaled from",
       Cause.OPTIMIZER, direct=True,
       advice=phrase("compute the update in a new tensor (exp_avg.mul(β1).add(g, alpha=1 − β1)), never in place on "
                     "the optimizer's state, and keep the state an average of unscaled gradients"))
def _first_moment_outgrew_gradients(history: Sequence[dict], entry: dict) -> list[Finding]:
    if not any(family in _class(entry).lower() for family in RAW_AVERAGE_FAMILIES):
        return []
    recent = last_records(history, entry, STATE_RECORDS)
    ratios = [_number((record.get("loop") or {}).get("first_moment_ratio")) for record in recent]
    if not recent or not all(r is not None and r >= MOMENT_OVER_GRADIENT for r in ratios):
        return []
    return [finding(Level.ERROR, None, None, ratios[-1], phrase(
        "as the optimizer steps after the records at steps {steps} began, {class_}'s first moments were {ratio:.3g}× "
        "the gradients they average (RMS); an average of gradients is never larger than the largest of them",
        steps=", ".join(str((record.get("loop") or {}).get("step_gradient_at", record.get("step")))
                        for record in recent), class_=_class(entry), ratio=ratios[-1]))]


AVERAGE_SLACK = 2  # an average lies between its inputs; twice beyond them covers a 16-bit state's rounding
SECOND_MOMENT_FLOOR = 1e-30  # an element whose last value and new squares are all below it is not judged
# the share of judged elements outside every average: an average of g for g² leaves it wherever g < 0 (about half),
# a state overwritten by its square root almost everywhere; a few elements are left to rounding not covered
SECOND_MOMENT_OUTSIDE = 0.25
SECOND_MOMENT_JUDGED = 100  # elements judged, at least


@check(Scope.TRAINING, "second_moment_not_an_average",
       f"in the optimizer step after a record, at least {SECOND_MOMENT_OUTSIDE:.0%} of the sampled elements of the "
       f"optimizer's exp_avg_sq (of {SECOND_MOMENT_JUDGED} or more judged, where the state keeps one of the "
       f"parameter's shape, from 0 at its first step) left the range between its last value v and the new "
       f"squared gradient g² (or (g + λw)² with the group's decay λ): above {AVERAGE_SLACK:g} × the larger or below 1/"
       f"{AVERAGE_SLACK:g} of the smaller",
       "definition (Kingma & Ba 2015, Algorithm 1; torch.optim.Adam and AdamW, NAdam, RAdam, AMSGrad's v): "
       "v ← β2·v + (1 − β2)·g², a convex combination of its last value and the new square for every β2 in [0, 1), "
       "so each element lands between the two; the factor of two covers a 16-bit state's rounding",
       "the second moment is not an exponential average of squared gradients: a hand-written Adam that "
       "overwrites it in place while building the denominator (v.sqrt_()), or "
       "averages g instead of g²; the update's scale is then no longer 1/√E[g²]", Cause.OPTIMIZER, direct=True,
       advice=phrase("keep exp_avg_sq as β2·v + (1 − β2)·g² and build the denominator out of place "
                     "(denom = (v / (1 − β2^t)).sqrt() + ε), or use torch.optim.AdamW"))
def _second_moment_not_an_average(history: Sequence[dict], entry: dict) -> list[Finding]:
    outside = (entry.get("loop") or {}).get("second_moment_outside") or {}
    share, judged = _number(outside.get("share")), _number(outside.get("judged")) or 0
    if share is None or share < SECOND_MOMENT_OUTSIDE or judged < SECOND_MOMENT_JUDGED:
        return []
    return [finding(Level.ERROR, None, None, share, phrase(
        "in the optimizer step after the record at step {step}, {share:.0%} of {judged:g} sampled elements of "
        "{class_}'s exp_avg_sq left the range between their last value and the new squared gradient: no average "
        "of squared gradients does", step=(entry.get("loop") or {}).get("step_gradient_at", entry.get("step")),
        share=share, judged=judged, class_=_class(entry)))]


@check(Scope.TRAINING, "second_moment_lost",
       "as the optimizer step after a record begins, some element of the optimizer's state has exp_avg_sq exactly "
       f"0 while |exp_avg| > {FIRST_MOMENT_FLOOR:g}",
       "Cauchy–Schwarz: m and v average the same gradients, |m_t| ≤ C·√v_t (C as in update_exceeds_its_bound, "
       "below 1,000 for every β2 ≤ 0.999999), so in exact or float32 arithmetic v = 0 forces |m| < 4e-20; "
       "only rounding to 16 bits (float16's smallest value "
       "is 6e-8) zeroes a v whose m is larger",
       "Adam's second moment lost its small values to rounding: a state kept in float16, or saved in 16 bits and "
       "loaded back; the next steps divide m by ε alone and move those weights by lr·|m|/ε", Cause.PRECISION,
       direct=True,
       advice=phrase("keep the optimizer's state in float32 (and save it so); with 16-bit parameters, keep "
                     "float32 master weights and state"))
def _second_moment_lost(history: Sequence[dict], entry: dict) -> list[Finding]:
    lost = _number((entry.get("loop") or {}).get("moments_lost"))
    if not lost:
        return []
    return [finding(Level.ERROR, None, None, lost, phrase(
        "{lost:g} elements of {class_}'s state have exp_avg_sq = 0 and exp_avg ≠ 0", lost=lost,
        class_=_class(entry)))]


@check(Scope.TRAINING, "weights_zero_stuck",
       "a layer's FFN input and output matrices, or its query and key matrices (a fused qkv), are exactly 0 "
       "since the run's first record (zeroed later: weights_zeroed)",
       "calculus of the zero saddle: each matrix of such a pair is the other's gradient factor (∂L/∂W1 ∝ W2, "
       "∂L/∂W2 ∝ act(x·W1) = 0; ∂L/∂Wq ∝ Wk, ∂L/∂Wk ∝ Wq), so at 0 both get a zero gradient at every step and "
       "never move. One matrix of a pair at 0 is a published recipe (zero-initialised output projections) and "
       "passes",
       "the layer cannot learn from this point: an initialisation that zeroes every matrix (nn.init.zeros_ "
       "applied to all Linear layers), or weights zeroed by a loader", Cause.INITIALISATION, direct=True,
       advice=phrase("initialise weight matrices randomly (nn.init.normal_(std=0.02) as GPT-2 does); zero only a "
                     "residual branch's output projection if a recipe asks for it"))
def _weights_zero_stuck(history: Sequence[dict], entry: dict) -> list[Finding]:
    first = history[0] if history else entry  # the run's first record: zero there is the initialisation's
    flags = []
    for layer in entry["layers"]:
        stuck = [pair for pair in STUCK_TOGETHER if _zero(layer, pair)
                 and any(_zero(start, pair) for start in first["layers"] if start["layer"] == layer["layer"])]
        if stuck:  # (weights zeroed after the first record are weights_zeroed's)
            kinds = list(dict.fromkeys(stuck[0]))
            flags.append(finding(Level.ERROR, None, layer["layer"], 0.0,
                                 phrase("{kinds} {are} exactly 0 since the first record (step {step}): no gradient "
                                        "can move them", kinds=" and ".join(kinds),
                                        are="are" if len(kinds) > 1 else "is", step=first["step"])))
    return flags


def in_zero_saddle(layer: dict) -> bool:
    """Whether a recorded layer holds a pair of matrices that are each other's gradient factor, both exactly 0."""
    return any(_zero(layer, pair) for pair in STUCK_TOGETHER)


def _zero(layer: dict, kinds: tuple) -> bool:
    weights = layer.get("weights") or {}
    return all(_number((weights.get(kind) or {}).get("norm")) == 0 for kind in kinds)
