"""What a Watch measures of the training loop itself, for the invariants of diagnose/invariants.py.

The Watch holds the model, the optimizer, the loss and the batch. Beyond the blocks' statistics
it measures, at each recording step:

- the gradients the first backward after an optimizer step finds already there (a hook on the
  trained forward's output, which autograd calls before any parameter's gradient is added; an
  optimizer step is seen as the parameters' version counters moving, so gradient accumulation
  over several backward passes is never mistaken for it);
- the gradients optimizer.step() finds (a step pre-hook, armed for the step after a record);
- which dropout and batch-norm modules ran in eval mode in the forward that was backpropagated;
- the share of trainable parameters the optimizer holds, and every param group's learning rate;
- what the loss is against the model's own logits and targets (probabilities where logits
  belong, a sum where a mean belongs), and how the targets sit against the inputs;
- a causal probe: one sequence of the batch, and the same with its later half changed, through
  the model in eval mode; in a causal model the earlier positions' logits do not move.

Everything stays on the device until the record's one copy to the host (tracing.assembly).
The probe runs after the training step's forward and backward, under torch.no_grad(), with
the random state forked and every module's mode restored: training is untouched. Anything that
fails inside a measurement becomes a note, never an exception in the training loop.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Optional

import torch
from torch import nn
from torch.nn import functional as F

from blocktrace.training.between import BetweenSteps
from blocktrace.training.logit_gradient import gradient_targets, temperature_slopes
from blocktrace.training.schedulers import Schedulers
from blocktrace.training.stepping import StepSample
from blocktrace.vocab import IGNORE_INDEX, Exterior

CHUNK_ELEMENTS = 1 << 24  # logits cross-entropy is recomputed in chunks of about this many elements (64 MB)
# ‖g‖ at watch.step() × the loss scale S against ‖g‖ as the backward ended: unscale_ divides by S exactly (a power of
# two), a clip after it leaves less; the slack is the float32 norms' rounding
UNSCALED_TOLERANCE = 1.001
PROBABILITY_TOLERANCE = 1e-3  # |Σ row − 1| of outputs that are probabilities (float32 sums of a softmax: ~1e-6)
EVAL_SENSITIVE = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout,
                  nn.modules.batchnorm._BatchNorm)


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


def _eval_mode_modules(model: nn.Module) -> int:
    """Dropout (p > 0) and batch-norm modules in eval mode: what model.eval() switches."""
    return sum(1 for m in model.modules() if isinstance(m, EVAL_SENSITIVE) and not m.training
               and getattr(m, "p", 1.0) > 0)


DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def largest_dropout(model: nn.Module) -> Optional[dict]:
    """The model's largest dropout rate and the module holding it (None without a dropout module): the setting the
    audit reads (diagnose/audit.py); a rate a forward passes to F.dropout itself is not seen."""
    rates = [(float(m.p), name) for name, m in model.named_modules() if isinstance(m, DROPOUTS)]
    if not rates:
        return None
    rate, name = max(rates)
    return {"p": rate, "module": name or "the model"}


def embeddings_untied(model: nn.Module) -> Optional[dict]:
    """An HF model whose config ties the output embedding to the input one (`tie_word_embeddings`): whether they are
    one tensor, as HF makes them; None for a model that says nothing of it (a hand-written one) or has no head."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "tie_word_embeddings", None) is not True:
        return None
    try:
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    weights = [getattr(module, "weight", None) for module in (head, embedding)]
    if not all(isinstance(weight, torch.Tensor) for weight in weights):
        return None
    return {"tied": weights[0] is weights[1] or weights[0].data_ptr() == weights[1].data_ptr()}


def exterior_parameters(model: nn.Module) -> dict[int, set]:
    """id(parameter) → its roles among the model's input and output layers: every nn.Embedding's weight (tokens and
    learned positions: the input layer) and HF's input embedding, the output head (HF's output embedding; without
    one, the last nn.Linear whose width is the largest embedding table's, i.e. the vocabulary). A tied head is both."""
    roles: dict[int, set] = {}

    def mark(weight, role: Exterior) -> None:
        if isinstance(weight, torch.Tensor):
            roles.setdefault(id(weight), set()).add(role)

    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    for module in embeddings:
        mark(module.weight, Exterior.EMBEDDING)
    try:  # an HF model says which are its layers (a base model has no head)
        mark(getattr(model.get_input_embeddings(), "weight", None), Exterior.EMBEDDING)
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = _hand_written_head(model, embeddings)
    mark(getattr(head, "weight", None), Exterior.HEAD)
    return roles


def _renormed_by_forward(model: nn.Module) -> frozenset:
    """ids of the embedding tables whose forward rescales the rows it looks up, in place (`max_norm`): weights the
    forward writes by definition, each row at its first look-up by as much as it exceeds the norm."""
    return frozenset(id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.max_norm is not None)


def _hand_written_head(model: nn.Module, embeddings: list[nn.Embedding]) -> Optional[nn.Module]:
    """The last nn.Linear as wide as the largest embedding table (the vocabulary); without one, that table itself:
    logits made with its own weight (nanoGPT's tied `x @ wte.weight.T`)."""
    if not embeddings:
        return None
    table = max(embeddings, key=lambda m: m.num_embeddings)
    linear = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == table.num_embeddings]
    return linear[-1] if linear else table


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


def loss_of(output) -> Optional[torch.Tensor]:
    """A model output's loss: HF's .loss, or a (logits, loss) tuple's scalar; None where it returns none."""
    loss = getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor) and isinstance(output, (tuple, list)) and len(output) > 1:
        loss = output[1]
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


@dataclasses.dataclass(frozen=True)
class RandomState:
    """The CPU generator's state, and the CUDA device's where the model lives there (dropout draws from it)."""

    cpu: torch.Tensor
    device: Optional[torch.device] = None
    on_device: Optional[torch.Tensor] = None

    @classmethod
    def now(cls, device: torch.device) -> "RandomState":
        if device.type == "cuda":
            return cls(torch.get_rng_state(), device, torch.cuda.get_rng_state(device))
        return cls(torch.get_rng_state())

    @contextlib.contextmanager
    def restored(self):
        with torch.random.fork_rng(devices=[self.device] if self.device is not None else []):
            torch.set_rng_state(self.cpu)
            if self.device is not None:
                torch.cuda.set_rng_state(self.on_device, self.device)
            yield


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

    def replay_loss(self, model: nn.Module) -> Optional[torch.Tensor]:
        """The same forward on the same batch, after the step: the same modes, the same random state (forked: the
        training's own stream is untouched), under no_grad."""
        with torch.no_grad(), self.rng.restored():
            loss = loss_of(model(*self.call.args, **self.call.kwargs))
        return None if loss is None else loss.detach().double().reshape(())


def causal_model(model: nn.Module) -> bool:
    """An HF model class for next-token prediction (its name says so)."""
    name = type(model).__name__
    return type(model).__module__.startswith("transformers.") and name.endswith(("ForCausalLM", "LMHeadModel"))


class LoopObserver:
    """The loop's evidence for one record: reset when the Watch arms, filled by the trained forward, its backward
    and the optimizer's step, read by `evidence()`."""

    def __init__(self, model: nn.Module, optimizer):
        self.model, self.optimizer = model, optimizer
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
            _torch_optimizer(optimizer), frozenset(self.exterior), _renormed_by_forward(model))
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
        self.eval_mode = _eval_mode_modules(self.model)
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
        gradients the earlier micro-batches left must still be there, to be added to."""
        if anchor is None or not anchor.requires_grad:
            return

        def backward_starts(grad):
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
                              "loss_after": replayed, "first_step": descent.first_step}
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
                            "update_step": sample.step}
        except Exception:  # never raise into the user's step: the record says nothing of it
            self.stepped = {}

    # -- the record --------------------------------------------------------------------------------------------

    def _optimizer_share(self) -> tuple[Optional[float], list[str]]:
        if self.optimizer is None:
            return None, []
        held = self.held_by_optimizer()
        wanted = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad and p.grad is not None]
        if not wanted:
            return None, []
        outside = [name for name, p in wanted if id(p) not in held]
        return 1 - len(outside) / len(wanted), outside[:3]

    def held_by_optimizer(self) -> Optional[set]:
        """The ids of the tensors the optimizer updates in place (None without an optimizer)."""
        if self.optimizer is None:
            return None
        return {id(p) for p in _held(self.optimizer)}

    def evidence(self, loss_checks: dict, micro_batches: Optional[int] = None) -> dict:
        """The record's "loop": device tensors and numbers, copied to the host with the rest of the record."""
        share, outside = self._optimizer_share()
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
                "optimizer_share": share, "outside_optimizer": outside,
                "lr_groups": [float(group["lr"]) for group in self.optimizer.param_groups
                              if isinstance(group.get("lr"), (int, float, torch.Tensor))]
                if self.optimizer is not None else None,
                "optimizer": optimizer_hyperparameters(self.optimizer, self.exterior), "descent": descended,
                "schedulers": self.schedulers.evidence(),
                "update_moves": stepped.get("update_moves"), "moments_lost": stepped.get("moments_lost"),
                "update_step": stepped.get("update_step"),
                "between_steps": self.between.evidence() if self.between is not None else None,
                "tempered": self.tempered if self.trained else None,
                "dropout": largest_dropout(self.model), "embeddings": embeddings_untied(self.model),
                "loss_scale": self.loss_scale(), "backward_factor": self.backward_factor,
                "float16_forward": self.float16 if self.trained else None,
                **loss_checks}


def computes_in_float16(model: nn.Module) -> bool:
    """Whether a forward running now computes in float16: under autocast to float16 on the device of the model's
    parameters, or with float16 parameters of its own."""
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    if parameter is None:
        return False
    return parameter.dtype is torch.float16 or _autocast_dtype(parameter.device.type) is torch.float16


def _autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast computes in on this kind of device (None: autocast is off there)."""
    try:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    except (TypeError, AttributeError, RuntimeError):  # torch < 2.4: one function per kind of device
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if device_type == "cuda" and torch.is_autocast_enabled() else None


# the hyperparameters of a param group the audit reads (diagnose/audit.py), wherever an optimizer defines them
AUDITED = ("lr", "betas", "eps", "weight_decay", "momentum", "dampening", "nesterov", "maximize", "use_muon")


def _plain(value):
    """A setting as the timeline holds it: a bool, a number, or a list of numbers (betas); None for anything else."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)  # a tensor lr (capturable optimizers), read as lr_groups reads it
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return [float(v) for v in value]
    return None


def optimizer_hyperparameters(optimizer, exterior: Optional[dict[int, set]] = None) -> Optional[dict]:
    """The optimizer's class and, per param group, every audited setting it holds (None without an optimizer), and
    whether it holds the model's embedding or head (`exterior`: exterior_parameters).
    Decoupled weight decay (AdamW's p ← p·(1 − lr·λ)) is said apart from an L2 term added to the gradient."""
    if optimizer is None:
        return None
    name = type(optimizer).__name__
    groups = []
    for group in optimizer.param_groups:
        plain = {key: _plain(group[key]) for key in AUDITED if key in group}
        settings = {key: value for key, value in plain.items() if value is not None}
        settings["decoupled_weight_decay"] = bool(group.get("decoupled_weight_decay", name.startswith("AdamW")))
        held = set().union(*((exterior or {}).get(id(p), set()) for p in group["params"]))
        settings.update({f"holds_{role.value}": role in held for role in Exterior})
        groups.append(settings)
    return {"class": name, "groups": groups}


# --- the batch: targets against inputs, the loss against the logits ----------------------------------------------

def target_match(ids: torch.Tensor, targets: torch.Tensor) -> dict:
    """Device shares of the counted target positions where the target is the input at the same position, the next
    one or the previous one; and the share of positions counted (not IGNORE_INDEX)."""
    counted = targets != IGNORE_INDEX

    def share(hits: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
        return (hits & where).sum().double() / where.sum().clamp_min(1).double()

    return {"target_match": {"same": share(targets == ids, counted),
                             "next": share(targets[:, :-1] == ids[:, 1:], counted[:, :-1]),
                             "previous": share(targets[:, 1:] == ids[:, :-1], counted[:, 1:])},
            "counted": counted.double().mean(), "targets_counted": counted.sum()}


def input_evidence(ids: torch.Tensor, kwargs: dict, kept: Optional[torch.Tensor]) -> dict:
    """Device facts about the forward's other inputs, as HF names them: whether every sequence's `position_ids`
    are one value throughout (T ≥ 2), and, for an `attention_mask` [B, T] (1 keeps a token),
    whether the ids it keeps and the ids it drops are each one repeated value (padding is one repeated id)."""
    found: dict = {}
    positions = kwargs.get("position_ids")
    if isinstance(positions, torch.Tensor) and not positions.is_floating_point() and positions.dim() in (1, 2) \
            and positions.shape[-1] >= 2:
        found["positions_constant"] = (positions == positions[..., :1]).all()
    if kept is not None:  # the positions the attention mask keeps (kept_positions)
        found["mask"] = {"kept_one_id": _one_value(ids, kept), "dropped_one_id": _one_value(ids, ~kept)}
    return found


def kept_positions(ids: torch.Tensor, kwargs: dict) -> Optional[torch.Tensor]:
    """The positions a forward's `attention_mask` [B, T] keeps (1 or True keeps a token); None without such a mask."""
    mask = kwargs.get("attention_mask")
    if not isinstance(mask, torch.Tensor) or mask.shape != ids.shape:
        return None
    return mask.bool() if mask.dtype == torch.bool else mask != 0


def padding_counted(targets: torch.Tensor, kept: torch.Tensor, shifts_inside: bool) -> torch.Tensor:
    """On the device: the most positions of one sequence that the attention mask drops while the loss counts their
    targets (not IGNORE_INDEX). A model that shifts its labels inside (HF) never predicts the first one."""
    counted = (targets != IGNORE_INDEX) & ~kept
    return (counted[:, 1:] if shifts_inside else counted).sum(dim=-1).max()


PADDING_RUN_SHARE = 8  # a trailing run of one id over at least 1/8 of a sequence (and 4 positions) is padding
PADDING_RUN_MIN = 4


def trailing_padding(ids: torch.Tensor, targets: torch.Tensor, shifts_inside: bool) -> dict:
    """On the device: how many sequences end with a run of one id — the same id in each, the largest among them —
    over at least 1/PADDING_RUN_SHARE of the sequence, with more than one of the run's targets counted by the loss;
    and that id. Text never ends half the sequences of a batch with one token repeated: right padding does."""
    tokens = ids.shape[-1]
    last = ids[:, -1]
    run = (ids == last[:, None]).flip(-1).int().cumprod(-1).sum(-1)
    long = run >= max(PADDING_RUN_MIN, tokens // PADDING_RUN_SHARE)
    padding_id = torch.where(long, last, torch.full_like(last, -1)).max()
    positions = torch.arange(tokens, device=ids.device)
    counted = (targets != IGNORE_INDEX) & (positions[None, :] >= (tokens - run)[:, None])
    counted = (counted[:, 1:] if shifts_inside else counted).sum(-1)
    padded = long & (last == padding_id) & (counted > 1)  # one counted target passes: the end-of-text one
    return {"padded_rows": padded.sum(), "padding_id": padding_id}


def _one_value(ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Whether the ids at `where` are all one value (True where there are none), without leaving the device."""
    largest = torch.where(where, ids, torch.full_like(ids, torch.iinfo(ids.dtype).min)).max()
    smallest = torch.where(where, ids, torch.full_like(ids, torch.iinfo(ids.dtype).max)).min()
    return (largest <= smallest) | ~where.any()


# Autograd nodes that only move, reshape or cast their input: a softmax behind them is what the next node was given
SHAPE_ONLY_NODES = frozenset({"ViewBackward0", "ReshapeAliasBackward0", "UnsafeViewBackward0", "CloneBackward0",
                              "ToCopyBackward0", "TransposeBackward0", "PermuteBackward0", "ExpandBackward0",
                              "SliceBackward0", "SelectBackward0", "SqueezeBackward0", "SqueezeBackward1",
                              "UnsqueezeBackward0", "AliasBackward0"})
LOSS_GRAPH_NODES = 64  # the nodes of the loss's graph searched from its top: cross-entropy sits near it


def _loss_graph(loss: Optional[torch.Tensor]):
    """The nodes of the loss's autograd graph nearest its top, breadth first, not past a log-softmax (what made
    its input is the model's); none without a graph."""
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return
    pending, seen = [loss.grad_fn], 0
    while pending and seen < LOSS_GRAPH_NODES:
        node = pending.pop(0)
        seen += 1
        yield node
        if type(node).__name__ != "LogSoftmaxBackward0":
            pending += [parent for parent, _ in node.next_functions if parent is not None]


def softmax_before_loss(loss: Optional[torch.Tensor]) -> Optional[bool]:
    """Whether the loss's own autograd graph applies log-softmax (cross-entropy's first step) to a softmax's
    output — probabilities given to the loss, made in the model or in the loop; None when no log-softmax is found
    near the graph's top (another loss, or no graph). A structural fact of the graph: no value is compared."""
    found = None
    for node in _loss_graph(loss):
        if type(node).__name__ == "LogSoftmaxBackward0":
            found = bool(found) or _behind_shape_nodes(node) == "SoftmaxBackward0"
    return found


def log_softmax_axes(loss: Optional[torch.Tensor], vocab: int, logits_node=None) -> dict:
    """For each log-softmax near the top of the loss's graph whose input has an axis of the vocabulary's size (the
    logits, whatever their layout), the size of the axis it normalises over (`log_softmax_over`), and whether
    every such one reads the model's output logits as they are, through nothing but moves, reshapes and casts
    (`log_softmax_reads_logits`; None where it cannot be told). Read from the graph's shapes and saved dim, which
    outlive the backward (its saved tensors do not); {} where the graph cannot say."""
    if not isinstance(loss, torch.Tensor) or loss.grad_fn is None:
        return {}  # a detached loss (watch.step(loss.detach())): its graph says nothing
    sizes, direct = [], []
    try:
        for node in _loss_graph(loss):
            if type(node).__name__ != "LogSoftmaxBackward0":
                continue
            shape = list(node._input_metadata[0].shape)
            if vocab not in shape:
                continue  # another softmax: over a similarity matrix, a router
            dim = int(node._saved_dim)
            dim = dim - (1 << 64) if dim >= 1 << 63 else dim  # a negative dim comes back as an unsigned 64-bit int
            sizes.append(shape[dim % len(shape)])
            if logits_node is not None:
                direct.append(_through_shape_nodes(node.next_functions[0][0]) is _through_shape_nodes(logits_node))
    except (AttributeError, IndexError, RuntimeError, TypeError):  # a torch without these node attributes
        return {}
    return {"log_softmax_over": sizes,
            "log_softmax_reads_logits": all(direct) if direct and len(direct) == len(sizes) else None}


def _through_shape_nodes(node):
    """The first node at or behind `node` that does more than move, reshape or cast its input."""
    while node is not None and type(node).__name__ in SHAPE_ONLY_NODES:
        node = node.next_functions[0][0] if node.next_functions else None
    return node


def _behind_shape_nodes(node) -> Optional[str]:
    """The name of the first node behind `node`'s input that does more than move, reshape or cast it."""
    parent = _through_shape_nodes(node.next_functions[0][0] if node.next_functions else None)
    return type(parent).__name__ if parent is not None else None


def _mean_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, shift: int) -> torch.Tensor:
    """The mean cross-entropy of logits[:, t] against targets[:, t + shift], in float32, chunk by chunk."""
    vocab = logits.shape[-1]
    rows = logits[:, : logits.shape[1] - shift].reshape(-1, vocab)
    wanted = targets[:, shift:].reshape(-1)
    # targets out of the logits' range (not a language model's) give a number the checks do not read
    wanted = torch.where(wanted == IGNORE_INDEX, wanted, wanted.clamp(0, vocab - 1))
    step = max(1, CHUNK_ELEMENTS // vocab)
    total = sum(F.cross_entropy(rows[i : i + step].float(), wanted[i : i + step], ignore_index=IGNORE_INDEX,
                                reduction="sum") for i in range(0, rows.shape[0], step))
    return total / (wanted != IGNORE_INDEX).sum().clamp_min(1)


def _cross_entropy_range(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest and the largest −log p over every row and class of the logits (logsumexp − max and logsumexp −
    min per row), in float32, chunk by chunk: a mean cross-entropy against distributions over any of these rows lies
    between them."""
    rows = logits.reshape(-1, logits.shape[-1])
    step = max(1, CHUNK_ELEMENTS // rows.shape[-1])
    best, worst = [], []
    for chunk in rows.split(step):
        chunk = chunk.float()
        total = torch.logsumexp(chunk, -1)
        best.append((total - chunk.amax(-1)).amin())
        worst.append((total - chunk.amin(-1)).amax())
    return torch.stack(best).amin(), torch.stack(worst).amax()


@torch.no_grad()
def loss_checks(logits: Optional[torch.Tensor], targets: Optional[torch.Tensor], loss: Optional[torch.Tensor],
                graph: Optional[torch.Tensor] = None, logits_node=None) -> dict:
    """Whether the outputs are probabilities, whether the loss's graph (`graph`, else `loss`) gave cross-entropy a
    softmax's output and over which axis its log-softmax normalises the logits, the loss over the smallest and the
    largest −log p of any row and class, and the loss over the mean cross-entropy of the model's own logits (at the
    targets' shift that fits best: 0 for a hand-written model's targets, 1 for HF's labels)."""
    found: dict = {"outputs_are_probabilities": None, "loss_over_cross_entropy": None,
                   "softmax_before_loss": softmax_before_loss(graph if graph is not None else loss)}
    if logits is None or logits.dim() != 3 or not logits.is_floating_point():
        return found
    logits = logits.detach()
    found.update(log_softmax_axes(graph if graph is not None else loss, logits.shape[-1], logits_node))
    found["outputs_are_probabilities"] = (logits.amin() >= 0) & \
        ((logits.sum(-1, dtype=torch.float32) - 1).abs().amax() < PROBABILITY_TOLERANCE)
    if loss is not None and logits.numel():
        best, worst = _cross_entropy_range(logits)
        value = loss.detach().double().reshape(())
        found["loss_over_worst_cross_entropy"] = value / worst.double().clamp_min(1e-12)
        found["loss_over_best_cross_entropy"] = value / best.double().clamp_min(1e-12)
    if targets is not None and loss is not None and targets.shape == logits.shape[:2] and logits.shape[1] > 1:
        best = torch.minimum(_mean_cross_entropy(logits, targets, 0), _mean_cross_entropy(logits, targets, 1))
        found["loss_over_cross_entropy"] = loss.detach().double().reshape(()) / best.double().clamp_min(1e-12)
        found["sequences"], found["positions"] = int(logits.shape[0]), int(logits.shape[1])
    return found


# --- the causal probe -------------------------------------------------------------------------------------------

@contextlib.contextmanager
def evaluating(model: nn.Module):
    """The model in eval mode (no dropout), every module's own mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def logits_of(output) -> Optional[torch.Tensor]:
    """A model output's logits: HF's .logits, a tuple's first tensor, or the tensor itself."""
    logits = getattr(output, "logits", None)
    if logits is None:
        logits = output[0] if isinstance(output, (tuple, list)) and output else output
    return logits if isinstance(logits, torch.Tensor) and logits.dim() == 3 else None


@dataclasses.dataclass
class ForwardCall:
    """How the training forward was called: its arguments as given (held until the record is made), the ids
    among them."""

    args: tuple
    kwargs: dict
    ids: torch.Tensor  # the very tensor passed (found among the arguments by identity)

    def with_ids(self, new: torch.Tensor, rows: Optional[torch.Tensor] = None) -> tuple[tuple, dict]:
        """The same call on `new` (the first `new.shape[1]` tokens of one sequence) in place of the ids: every
        other tensor of the batch cut alike — its batch dimension to the first sequence (or to `rows`, a device
        index: no host read), each later dimension as long as the sequence to the probe's length — so targets, masks
        and position ids follow the probed input."""
        batch, length = self.ids.shape[0], self.ids.shape[1]

        def cut(value):
            if value is self.ids:
                return new
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                return value
            if rows is not None and value.shape[0] == batch:
                value = value.index_select(0, rows.to(value.device))
            index = [slice(0, 1) if i == 0 and size == batch and rows is None else
                     slice(0, new.shape[1]) if i > 0 and size == length else slice(None)
                     for i, size in enumerate(value.shape)]
            return value[tuple(index)]

        return tuple(cut(v) for v in self.args), {key: cut(v) for key, v in self.kwargs.items()}
