"""What a Watch measures of the training loop itself, for the invariants of diagnose/invariants.py: the observer
of one record's forward, backward and optimizer step.

The Watch holds the model, the optimizer, the loss and the batch. Beyond the blocks' statistics
it measures, at each recording step:

- the gradients the first backward after an optimizer step finds already there (a hook on the
  trained forward's output, which autograd calls before any parameter's gradient is added; an
  optimizer step is seen as the parameters' version counters moving, so gradient accumulation
  over several backward passes is never mistaken for it);
- the gradients optimizer.step() finds (a step pre-hook, armed for the step after a record), what
  that step did (training/stepping.py) and its effect on its own batch (the descent probe);
- what wrote the weights between two optimizer steps (training/between.py), the loss's gradient at
  the logits (training/logit_gradient.py) and the schedulers driving the optimizer;
- the share of trainable parameters the optimizer holds, every param group's learning rate and
  setting (training/settings.py), and the model's own facts (training/model_facts.py).

What the loss is against its logits is training/loss_facts.py's; the batch's targets against its
inputs, training/batch.py's; the held forward call, training/forward_call.py's.

Everything stays on the device until the record's one copy to the host (tracing.assembly).
Anything that fails inside a measurement becomes a note, never an exception in the training loop.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import torch
from torch import nn

from blocktrace.training.between import BetweenSteps
from blocktrace.training.forward_call import ForwardCall, RandomState, logits_of, loss_of, targets_cross_entropy
from blocktrace.training.logit_gradient import gradient_targets, temperature_slopes
from blocktrace.training.model_facts import computes_in_float16, eval_mode_modules, embeddings_untied, \
    FrozenAtZero, ZeroTokenEmbedding, exterior_parameters, largest_dropout, renormed_by_forward, \
    requires_grad_attributes, stale_autocast_casts
from blocktrace.training.schedulers import Schedulers
from blocktrace.training.settings import optimizer_hyperparameters
from blocktrace.training.stepping import StepSample
from blocktrace.training.unheld import NAMED, Unheld

# ‖g‖ at watch.step() × the loss scale S against ‖g‖ as the backward ended: unscale_ divides by S exactly (a power of
# two), a clip after it leaves less; the slack is the float32 norms' rounding
UNSCALED_TOLERANCE = 1.001


def grad_norm(parameters) -> Optional[torch.Tensor]:
    """‖g‖ over the parameters' gradients as a float64 device scalar (None when none has one): one fused norm per
    device and dtype, no read on the host. A sharded gradient's norm covers every shard (its DTensor reduces)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for parameter in parameters:
        if parameter.grad is not None:
            grad = parameter.grad.detach()
            groups.setdefault((grad.device, grad.dtype), []).append(grad)
    if not groups:
        return None
    norms = [norm.double() for grads in groups.values() for norm in torch._foreach_norm(grads)]
    device = norms[0].device
    return torch.linalg.vector_norm(torch.stack([norm.to(device) for norm in norms]))


def _zero_if_none(norm: Optional[torch.Tensor]) -> torch.Tensor:
    return norm if norm is not None else torch.zeros((), dtype=torch.float64)


def _trainable(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _held(optimizer) -> list[torch.Tensor]:
    """The tensors an optimizer updates, over all its param groups."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _versions(parameters: list[torch.Tensor]) -> int:
    """The sum of the parameters' version counters: every in-place change (an optimizer step) moves it."""
    return sum(p._version for p in parameters)


def _torch_optimizer(optimizer):
    """The torch optimizer inside wrappers that hold one as `.optimizer` (accelerate's is an Optimizer without
    hooks of its own; Lightning's)."""
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def _step_pre_hook(optimizer, hook):
    """A hook before the torch optimizer's step; None where there is none to hook."""
    try:
        return _torch_optimizer(optimizer).register_step_pre_hook(hook)
    except AttributeError:  # not a torch optimizer, or one that never ran Optimizer.__init__
        return None


def _step_post_hook(optimizer, hook):
    """A hook after the torch optimizer's step; None where there is none to hook."""
    try:
        return _torch_optimizer(optimizer).register_step_post_hook(hook)
    except AttributeError:
        return None


def _gradient_dot_weights(parameters: list[torch.Tensor]) -> Optional[torch.Tensor]:
    """Σ g·w over the parameters with a gradient, in float64 on the device (None when none has one): taken before
    and after a step, the difference is g·Δw without a copy of the weights (float64 keeps the difference, ~lr·‖g‖²,
    far above the rounding of the two sums, ~1e-16·‖g‖‖w‖)."""
    dots = [torch.dot(p.grad.detach().reshape(-1).double(), p.detach().reshape(-1).double())
            for p in parameters if p.grad is not None and p.grad.shape == p.shape]
    if not dots:
        return None
    device = dots[0].device
    return torch.stack([dot.to(device) for dot in dots]).sum()


def _not_run(error: Exception) -> str:
    return f"descent probe not run: {type(error).__name__}: {error}"[:200]


def descent_read(found: Optional[dict]) -> Optional[dict]:
    """On the host: the probe as recorded, or a note where the loop's loss named no target to replay (its
    cross-entropy over no row is not a number)."""
    if not found or found.get("loss_given") is None or math.isfinite(found.get("loss_before", math.nan)):
        return found
    return {"at": found.get("at"), "note": "descent probe not run: the loss's gradient at the logits names no "
                                           "target to replay its cross-entropy with"}


@dataclasses.dataclass
class Descent:
    """A recorded step's effect on its own batch (the descent probe): the forward to replay, its random state and
    loss, and Σ g·w before the optimizer's step."""

    step: int
    call: ForwardCall
    rng: RandomState  # at the training forward: dropout draws the same masks again
    loss_before: torch.Tensor
    dot_before: Optional[torch.Tensor] = None
    first_step: bool = False  # the optimizer held no state before this step: no momentum could turn it
    # where the model returns no loss: the targets the loop's loss used (read off its gradient at the logits), whose
    # cross-entropy the replay computes, and the loss the loop gave (the probe is the loop's where the two agree)
    targets: Optional[torch.Tensor] = None
    loss_given: Optional[torch.Tensor] = None

    def replay_loss(self, model: nn.Module) -> Optional[torch.Tensor]:
        """The same forward on the same batch, after the step: the same modes, the same random state (forked: the
        training's own stream is untouched), under no_grad."""
        with torch.no_grad(), self.rng.restored():
            output = model(*self.call.args, **self.call.kwargs)
            if self.targets is not None:
                return targets_cross_entropy(logits_of(output), self.targets)
            loss = loss_of(output)
        return None if loss is None else loss.detach().double().reshape(())


class LoopObserver:
    """The loop's evidence for one record: reset when the Watch arms, filled by the trained forward, its backward
    and the optimizer's step, read by `evidence()`."""

    def __init__(self, model: nn.Module, optimizer, blocks: Sequence[nn.Module] = ()):
        self.model, self.optimizer, self.blocks = model, optimizer, list(blocks)
        self.unheld = Unheld()  # the parameters with a gradient that no optimizer holds (training/unheld.py)
        self.frozen = FrozenAtZero()  # the frozen matrices that hold only zeros (training/model_facts.py)
        self.zero_embedding = ZeroTokenEmbedding()  # whether the token embedding starts at 0 (the same)
        self.step_hook = _step_pre_hook(optimizer, self._at_optimizer_step)
        self.after_step_hook = _step_post_hook(optimizer, self._after_optimizer_step)
        self.step_due: Optional[int] = None  # the training step whose optimizer.step() is to be measured
        self.step_gradient: Optional[torch.Tensor] = None
        self.step_gradient_at: Optional[int] = None
        self.descent: Optional[Descent] = None  # the recorded step whose update is probed (at its optimizer step)
        self.descended: Optional[dict] = None  # what the probe found, for the next record
        self.step_sample: Optional[StepSample] = None  # the weights sampled as the record's optimizer step began
        self.stepped: dict = {}  # what that step did (training/stepping.py), for the next record
        self.optimizer_steps = 0  # optimizer.step() calls since the last record (a host count: no device read)
        self.ever_stepped = False  # whether any optimizer.step() ran since the Watch began
        # the weights between one optimizer step and the next (training/between.py); the Watch tells it the step
        self.exterior = exterior_parameters(model)  # which parameters are the embedding and the head (the audit's)
        self.between = None if self.step_hook is None else BetweenSteps(
            _torch_optimizer(optimizer), frozenset(self.exterior), renormed_by_forward(model))
        # whether a training forward ran since the optimizer's last step (its step is still to come: the Watch's
        # forward hook says so), and what to do once that step ends (the Watch arms for its next record there)
        self.forward_since_step = False
        self.steps_ended = 0  # the optimizer's steps that have ended since the Watch began
        self.on_step_end = None
        # the schedulers that drive it (the audit reads their step counts)
        self.schedulers = Schedulers(_torch_optimizer(optimizer) if optimizer is not None else None)
        self.reset()

    def reset(self, stepped: bool = False) -> None:
        """Armed for a recording step: what the parameters were before it, nothing seen yet (`stepped`: armed as an
        optimizer step ended, so the step the recorded forward follows is known to have run)."""
        self.versions = None if stepped else _versions(_trainable(self.model))
        self.trained = False  # the taken forward's output was backpropagated
        self.grads_before: Optional[torch.Tensor] = None
        # the later training forwards of the step (micro-batches): ‖.grad‖ as each one's backward started, the
        # largest; None where no later backward ran
        self.grads_before_later: Optional[torch.Tensor] = None
        self.backwards_ended = 0  # backward() calls of the step that have ended (autograd's end-of-backward callback)
        # d(what backward differentiated)/d(the model's loss): a loss scaler's scale (GradScaler's 2^16), 1/k for a
        # loss divided over k micro-batches; None where the anchor is not the scalar loss
        self.backward_factor: Optional[torch.Tensor] = None
        # ‖.grad‖ as the step's last backward ended, to tell gradients the loop unscaled before watch.step()
        self.grads_after_backward: Optional[torch.Tensor] = None
        self.eval_mode: Optional[int] = None
        self.float16: Optional[bool] = None  # whether the recording forward computed in float16
        self.tempered: Optional[dict] = None  # the loss's temperature, read off its gradient at the logits
        self.gradient_targets: Optional[tuple] = None  # the targets it used there, and the share of rows naming one

    def close(self) -> None:
        for hook in (self.step_hook, self.after_step_hook):
            if hook is not None:
                hook.remove()
        self.step_hook = self.after_step_hook = self.on_step_end = None

    def forward_started(self) -> None:
        """A training forward (with gradients) began: the step it belongs to has its optimizer step to come."""
        self.forward_since_step = True

    def step_pending(self) -> bool:
        """Whether the step under way has its optimizer step still to come: a training forward ran since the last
        one (watch.step() called after the backward, as documented), and the optimizer given is seen stepping (one
        that never steps — not the loop's — is waited for by nothing)."""
        return self.step_hook is not None and self.ever_stepped and self.forward_since_step

    # -- the recording step's forward and backward -------------------------------------------------------------

    def forward(self, anchor: Optional[torch.Tensor]) -> None:
        """The first forward with gradients of a recording step: its modes, and a hook on its output (`anchor`:
        the loss, or the logits) that runs when the backward starts, before any parameter's gradient is added."""
        self.eval_mode = eval_mode_modules(self.model)
        self.float16 = computes_in_float16(self.model)
        if anchor is None or not anchor.requires_grad:
            return
        # an optimizer step since the Watch armed (or it armed as one ended)
        stepped = self.versions is None or _versions(_trainable(self.model)) != self.versions

        def backward_starts(grad):
            if not self.trained:
                self.trained = True
                if grad.numel() == 1:
                    self.backward_factor = grad.detach().reshape(()).double()
                if stepped:
                    self.grads_before = self._gradient_now()
            self._measure_when_backward_ends()
            return None

        anchor.register_hook(backward_starts)

    def watch_logits(self, logits: Optional[torch.Tensor]) -> None:
        """The recording forward's logits: when the backward hands them their gradient, the temperature the loss
        read them at and the targets it used (training/logit_gradient.py)."""
        if logits is None or not logits.requires_grad or not logits.is_floating_point():
            return
        held = logits.detach()

        def reached(grad):
            if self.tempered is None:
                try:  # inside the user's backward: never raise into it
                    self.tempered = temperature_slopes(held, grad)
                    self.gradient_targets = gradient_targets(grad)
                except Exception:
                    self.tempered = self.gradient_targets = None
            return None

        logits.register_hook(reached)

    def later_forward(self, anchor: Optional[torch.Tensor]) -> None:
        """A later training forward of the recording step (another micro-batch): when its backward starts, the
        gradients the earlier micro-batches left must still be there, to be added to — where it is a backward of its
        own, begun after the first one ended; several forwards under one backward (R-Drop's two dropout passes, a
        contrastive pair) are one micro-batch."""
        if anchor is None or not anchor.requires_grad:
            return

        def backward_starts(grad):
            if self.backwards_ended == 0:
                return None  # within the first forward's backward: one backward over several forwards (R-Drop)
            found = self._gradient_now()
            before = self.grads_before_later
            self.grads_before_later = found if before is None else torch.maximum(before, found)
            self._measure_when_backward_ends()
            return None

        anchor.register_hook(backward_starts)

    def loss_scale(self) -> Optional[torch.Tensor]:
        """The factor a loss scaler put between the model's loss and the gradients (above 1; else 1), on the device:
        the gradients divided by it are the loss's own. A loss divided for accumulation (a factor below 1) is the
        loop's average, not a scale: left as it is. None where the backward's start was not seen on the loss."""
        factor = self.backward_factor
        if factor is None:
            return None
        return torch.where(factor > 1, factor, torch.ones_like(factor))

    def gradient_scale(self, distributed: bool) -> Optional[torch.Tensor]:
        """The factor the gradients still carry now (at watch.step()), on the device: the loss scale, or 1 where the
        loop already divided them — scaler.unscale_ before watch.step() leaves ‖g‖ at (at most, after a clip) 1/S
        of what the backward left, where a loop at the Watch's documented place leaves it as it was. A clip on
        still-scaled gradients looks the same by norms (the clipped_before_unscaling bug): read as unscaled. Under
        DDP/FSDP the backward's end is seen before the gradients are reduced, so the ratio is not read there."""
        scale = self.loss_scale()
        after = self.grads_after_backward
        if scale is None or after is None or distributed:
            return scale
        now = self._gradient_now().to(after.device)
        unscaled = now.double() * scale.to(after.device) <= after.double() * UNSCALED_TOLERANCE
        return torch.where(unscaled, torch.ones_like(scale), scale)

    def _measure_when_backward_ends(self) -> None:
        """Inside a backward hook: ‖.grad‖ once this backward has added every gradient (autograd's end-of-backward
        callback, the one DDP's reducer uses)."""
        def ended():
            self.grads_after_backward = self._gradient_now()
            self.backwards_ended += 1

        torch.autograd.Variable._execution_engine.queue_callback(ended)

    def _gradient_now(self) -> torch.Tensor:
        """‖.grad‖ over the parameters a step updates, 0 where none has one (a device scalar)."""
        return _zero_if_none(grad_norm(self._stepped_parameters()))

    def _stepped_parameters(self) -> list[torch.Tensor]:
        """The parameters an optimizer step updates, whose gradients optimizer.zero_grad() clears: the optimizer's
        (a parameter it does not hold keeps its gradient through zero_grad, and no step uses it); without an
        optimizer, every trainable parameter (model.zero_grad() clears them all)."""
        if self.optimizer is None:
            return _trainable(self.model)
        return _held(self.optimizer)

    # -- the optimizer's step after a record ---------------------------------------------------------------------

    def expect_step(self, step: int, descent: Optional[Descent] = None) -> None:
        """Measure the gradients at the next optimizer.step() (the one after this record's backward), and, given
        the recorded forward to replay, that step's effect on its own batch."""
        self.step_due, self.descent = step, descent
        if self.between is not None:
            self.between.keep_next = True

    def _at_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_steps += 1
        stepped_before, self.ever_stepped = self.ever_stepped, True
        self._between(BetweenSteps.step_begins)
        if self.step_due is None:
            return
        self.step_gradient, self.step_gradient_at = _zero_if_none(grad_norm(_held(optimizer))), self.step_due
        self.step_due = None
        try:  # inside the user's optimizer.step(): never raise into it
            self.step_sample = StepSample(_torch_optimizer(optimizer), first_step=not stepped_before)
        except Exception:  # an optimizer whose groups are not torch's: its moves are not measured
            self.step_sample = None
        if self.descent is not None:
            try:  # inside the user's optimizer.step(): never raise into it
                self.descent.dot_before = _gradient_dot_weights(_held(optimizer))
                # no velocity can exist: the first step this Watch saw, and the optimizer holds no state (a
                # hand-written one may keep its momentum elsewhere: only its first step counts)
                self.descent.first_step = not stepped_before and not _torch_optimizer(optimizer).state
            except Exception as error:
                self.descent, self.descended = None, {"at": self.step_gradient_at, "note": _not_run(error)}

    def _after_optimizer_step(self, optimizer, args, kwargs) -> None:
        """What the step did, and the Watch armed for its next record where it waited for this step to end."""
        self._between(BetweenSteps.step_ends)
        self._measure_step(optimizer)
        self._probe_descent(optimizer)
        self.forward_since_step = False
        self.steps_ended += 1
        then, self.on_step_end = self.on_step_end, None
        if then is not None:  # last: the probe's replayed forward is not the next step's
            then()

    def _probe_descent(self, optimizer) -> None:
        """g·Δw, the first-order change of the loss the update predicts, and, where it climbs, the batch's loss
        after the update. A failure is a note: the probe never stops training."""
        descent, self.descent = self.descent, None
        if descent is None or descent.dot_before is None:
            return
        try:
            predicted = _gradient_dot_weights(_held(optimizer)) - descent.dot_before
            # the replay (a third of a step, once a record): whether the step lowered its own batch's loss, whichever
            # way the prediction points; both stay on the device until the record's one copy
            replayed = descent.replay_loss(self.model)
            self.descended = {"at": descent.step, "predicted": predicted, "loss_before": descent.loss_before,
                              "loss_after": replayed, "first_step": descent.first_step,
                              "loss_given": descent.loss_given}
        except Exception as error:  # the replayed forward may fail where the training one did not: said, not raised
            self.descended = {"at": descent.step, "note": _not_run(error)}

    def record_taken(self, step: int) -> None:
        """A record is being taken at this step (after its backward, before its optimizer step)."""
        self._between(lambda between: between.record_taken(step))

    def _between(self, at_step) -> None:
        """The between-steps fingerprint at a step's start or end; inside the user's optimizer.step(): never
        raises (what fails is not measured from then on)."""
        if self.between is None:
            return
        try:
            at_step(self.between)
        except Exception:
            self.between = None

    def _measure_step(self, optimizer) -> None:
        """Each group's largest move per unit of learning rate, and Adam's moments' agreement (training/stepping)."""
        sample, self.step_sample = self.step_sample, None
        if sample is None:
            return
        try:
            self.stepped = {"update_moves": sample.moves(), "moments_lost": sample.moments_lost,
                            "update_step": sample.step, "update_unexplained": sample.memory(),
                            "first_moment_ratio": sample.first_moment_ratio,
                            "second_moment_outside": sample.second_moment_outside()}
        except Exception:  # never raise into the user's step: the record says nothing of it
            self.stepped = {}

    # -- the record --------------------------------------------------------------------------------------------

    def _optimizer_share(self) -> tuple[Optional[float], list[tuple[str, torch.Tensor]], Optional[set]]:
        """The share of the parameters with a gradient that the optimizer holds, the ones it lacks (name,
        parameter), and the ids of the ones it holds."""
        if self.optimizer is None:
            return None, [], None
        held = self.held_by_optimizer()
        wanted = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad and p.grad is not None]
        if not wanted:
            return None, [], held
        lacking = [(name, p) for name, p in wanted if id(p) not in held]
        return 1 - len(lacking) / len(wanted), lacking, held

    def held_by_optimizer(self) -> Optional[set]:
        """The ids of the tensors the optimizer updates in place (None without an optimizer)."""
        if self.optimizer is None:
            return None
        return {id(p) for p in _held(self.optimizer)}

    def evidence(self, loss_checks: dict, micro_batches: Optional[int] = None) -> dict:
        """The record's "loop": device tensors and numbers, copied to the host with the rest of the record."""
        share, lacking, held = self._optimizer_share()
        step_gradient, at = self.step_gradient, self.step_gradient_at
        self.step_gradient = self.step_gradient_at = None
        descended, self.descended = self.descended, None
        stepped, self.stepped = self.stepped, {}
        steps, self.optimizer_steps = self.optimizer_steps, 0
        return {"optimizer_steps": steps if self.step_hook is not None else None,
                "grads_before_backward": self.grads_before, "grads_before_later_backward": self.grads_before_later,
                "micro_batches": micro_batches,
                "step_gradient": step_gradient, "step_gradient_at": at,
                "eval_mode_modules": self.eval_mode if self.trained else None,
                "optimizer_share": share, "outside_optimizer": [name for name, _ in lacking[:NAMED]],
                "unheld": self.unheld.evidence(lacking, held, self.blocks, self.optimizer) if lacking else None,
                "lr_groups": [float(group["lr"]) for group in self.optimizer.param_groups
                              if isinstance(group.get("lr"), (int, float, torch.Tensor))]
                if self.optimizer is not None else None,
                "optimizer": optimizer_hyperparameters(self.optimizer, self.exterior), "descent": descended,
                "schedulers": self.schedulers.evidence(),
                "update_moves": stepped.get("update_moves"), "moments_lost": stepped.get("moments_lost"),
                "update_step": stepped.get("update_step"), "update_unexplained": stepped.get("update_unexplained"),
                "first_moment_ratio": stepped.get("first_moment_ratio"),
                "second_moment_outside": stepped.get("second_moment_outside"),
                "between_steps": self.between.evidence() if self.between is not None else None,
                "tempered": self.tempered if self.trained else None, **self._model_settings(),
                "loss_scale": self.loss_scale(), "backward_factor": self.backward_factor,
                "float16_forward": self.float16 if self.trained else None,
                **loss_checks}

    def _model_settings(self) -> dict:
        """What the audit reads of the model's own modules at each record (training/model_facts.py)."""
        return {"dropout": largest_dropout(self.model), "embeddings": embeddings_untied(self.model),
                "frozen_zero": self.frozen.evidence(self.model),
                "token_embedding_zero": self.zero_embedding.evidence(self.model),
                "requires_grad_attributes": requires_grad_attributes(self.model),
                "autocast_stale": stale_autocast_casts(self.model)}
