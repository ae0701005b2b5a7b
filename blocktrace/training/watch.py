"""A watch inside the training loop: two lines, and the blocks' story over training lands in a file.

    watch = Watch(model, "run.jsonl", every=50)   # finds the blocks itself
    ...
    loss.backward()
    watch.step(loss)        # after backward, before optimizer.step()
    optimizer.step()

Every `every` steps (0, every, 2·every, …) the watch records, from the forward that training runs
anyway (no second forward): the six steps' statistics of every block on that step's own batch,
attention logit maximum and entropy per head, per-block gradient norms, ‖ΔW‖/‖W‖ per tensor kind
since the last record, the loss and the learning rate, and the findings with a diagnosis — one
JSON line per record (training/timeline.py), flushed. Hooks are attached only for the forward of a
recording step: between records the watch costs nothing. Everything is measured on the device and
read on the host in one copy per record, whatever the depth (tracing.assembly). Under
torch.distributed (DDP or FSDP2) the statistics are reduced across ranks (training/distributed.py)
and only rank 0 writes.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Optional, Union

import torch
from torch import nn

from blocktrace.diagnose.history import History
from blocktrace.diagnose.weights import movement, snapshot, weight_moments
from blocktrace.tracing.assembly import finish
from blocktrace.tracing.tap import BlockTap, attention_through_sdpa
from blocktrace.training.arguments import Blocks, check_arguments, first_step, scalar_argument
from blocktrace.training.batch import Batch, input_ids, shifts_labels, targets_position, with_order
from blocktrace.training.between import settled
from blocktrace.training.blocks import device_of, find_blocks, is_trainable, sharded, unwrap
from blocktrace.training.distributed import Reducer, fingerprint, replica_rows, synchronised
from blocktrace.training.judging import FIRST_ERROR_WARNING, Rollback, judge_record
from blocktrace.training.forward_call import RandomState, logits_of, loss_of, probing, targets_cross_entropy
from blocktrace.training.loop import Descent, LoopObserver, descent_read, grad_norm
from blocktrace.training.loss_facts import loss_checks
from blocktrace.training.order import DataOrder
from blocktrace.training.probing import ProbeResult, causal_probe, probe_before_forward
from blocktrace.training.coverage import IdCoverage
from blocktrace.training.embedding_rows import input_vocabulary, rows_reached, softmax_over_vocabulary
from blocktrace.training.entry import Entry
from blocktrace.training.logit_gradient import row_weights
from blocktrace.training.logit_gradient import settled as tempered_rows
from blocktrace.training.tensorboard import open_tensorboard, write_scalars
from blocktrace.training.timeline import TimelineWriter, compare_logits, layer_entry, record

__all__ = ["FIRST_ERROR_WARNING", "Watch", "find_blocks"]


class Watch:
    """Records the model's blocks every `every` training steps into a timeline file (see the module docstring)."""

    def __init__(self, model: nn.Module, path: Union[str, Path], every: int = 50, *, blocks: Blocks = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, tensorboard=None, checks: bool = True,
                 track_updates: bool = True, start: Optional[int] = None, append: bool = False,
                 overwrite: bool = False):
        check_arguments(model, path, every, start, blocks, optimizer, tensorboard,
                         checks=checks, track_updates=track_updates, append=append, overwrite=overwrite)
        self.model, self.every, self.optimizer = model, every, optimizer
        self.blocks = find_blocks(model, blocks)
        # only a forward with gradients is traced: an evaluation inside the loop runs under torch.no_grad()
        self.taps = [BlockTap(block, checks=checks, when=torch.is_grad_enabled) for block in self.blocks]
        self.track_updates, self.checks = track_updates, checks
        self.reducer = Reducer()
        self._open_outputs(Path(path), tensorboard, append, overwrite, start)
        self._observe_loop(model, optimizer)
        self.entry = Entry(model, self.blocks[0] if self.blocks else None, self._forward_starts, self._entry_moved)
        if self.count % every == 0:
            self._arm()

    def _open_outputs(self, path: Path, tensorboard, append: bool, overwrite: bool, start: Optional[int]) -> None:
        """The timeline (and TensorBoard) on the writing rank, and the step of the next forward."""
        self.tensorboard = open_tensorboard(tensorboard) if self.reducer.is_writer else None
        self.writer = TimelineWriter(path, append, overwrite) if self.reducer.is_writer else None
        try:  # the training step of the next forward (a resumed run's is past 0: start=, or the step after the last
            self.count = first_step(self.writer, start)  # one the timeline holds)
        except BaseException:
            if self.writer is not None:
                self.writer.close()  # its lock too: the same file may be given again, rightly
            raise

    def _observe_loop(self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer]) -> None:
        """What the Watch holds between records: the loop's own evidence, the history, the rollback point."""
        self.stopped: Optional[str] = None  # why recording stopped (the training loop goes on)
        self.snapshots: Optional[list[dict]] = None
        self.armed = None  # the context that measures sdpa attention during a recording forward
        self.warned_no_gradients = False
        self.warned_arguments: set[str] = set()  # step()'s arguments already said to be unusable
        self.rollback = Rollback()  # the last healthy record, and the step to roll back to at the first error
        self.captured_loss: Optional[torch.Tensor] = None
        self.captured_graph: Optional[torch.Tensor] = None  # the model's loss as returned, its graph attached
        self.random_state: Optional[RandomState] = None  # at the recording step's training forward
        self.sharded_probe: Optional[ProbeResult] = None  # FSDP2: the probe made before the recording forward
        self.synchronised: Optional[bool] = None  # whether the recorded forward's backward averages gradients (DDP)
        self.batch = Batch(shifts_labels(unwrap(model)), targets_position(unwrap(model)))
        self.loop = LoopObserver(unwrap(model), optimizer, self.blocks)
        # the records before, for the dynamics (diagnose/dynamics.py): the first (trends start there) and the last few
        self.history = History()
        self.order = DataOrder()  # every training step's batch, to tell an order that repeats (training/order.py)
        self.coverage = IdCoverage(input_vocabulary(unwrap(model)))  # training ids against evaluated ones
        self.forwards = 0  # training forwards (with gradients) since the last watch.step(): the step's micro-batches
        # the optimizer's ended steps as step() returned, where that step's own optimizer step was still to come: the
        # forwards before it ends are that step's (adversarial training's, SAM's second pass), not the next one's
        self.step_still_due: Optional[int] = None

    @property
    def recording(self) -> bool:
        return self.armed is not None

    def _arm(self, stepped: bool = False) -> None:
        """Attach everything for the next forward: it belongs to a recording step (`stepped`: armed as an optimizer
        step ended)."""
        for tap in self.taps:
            tap.attach()
        self._hook_entry(self.entry.module)
        # FSDP2: the causal probe runs before the training forward, on every rank alike (training/probing.py)
        self.probe_hook = self.model.register_forward_pre_hook(self._probe_before_forward, with_kwargs=True) \
            if self.checks and self.reducer.active and sharded(self.model) else None
        self.loop.reset(stepped)
        self.armed = attention_through_sdpa()
        self.armed.__enter__()

    def _hook_entry(self, module: nn.Module) -> None:
        """The recording step's hooks on the module the loop calls."""
        self.loss_hook = module.register_forward_hook(self._capture_loss, with_kwargs=True)
        self.rng_hook = module.register_forward_pre_hook(self._remember_random_state)

    def _entry_moved(self, old: nn.Module, new: nn.Module, args, kwargs) -> None:
        """The loop calls a part of the model (training/entry.py): the recording hooks move there, this call's
        random state taken now (its pre-hooks have run)."""
        if self.recording:
            self.loss_hook.remove()
            self.rng_hook.remove()
            self._hook_entry(new)
            self._remember_random_state(new, args)

    def _arm_for_next_step(self) -> None:
        """The next step's first training forward is recorded. Where this step's optimizer step is still to come (a
        training forward since the last one: step() called after the backward, as documented), the forwards until
        it ends are this step's — a second forward and backward of adversarial training (FGM, Miyato et al. 2017)
        or of sharpness-aware minimisation (SAM, Foret et al. 2021) — and the taps go on as that step ends."""
        if self.loop.step_pending():
            self.loop.on_step_end = self._arm_as_step_ends
        else:
            self._arm()

    def _arm_as_step_ends(self) -> None:
        """Inside the user's optimizer.step(): never raises into it."""
        try:
            if self.stopped is None:
                self._arm(stepped=True)
        except Exception as error:
            self._stop(f"arming failed after step {self.count - 1}: {type(error).__name__}: {error}")

    def _disarm(self) -> None:
        for tap in self.taps:
            tap.detach()
        self.loss_hook.remove()
        self.rng_hook.remove()
        if self.probe_hook is not None:
            self.probe_hook.remove()
        self.armed.__exit__(None, None, None)
        self.armed = None

    def _remember_random_state(self, module, args) -> None:
        """Before the recording step's training forward: the random state its dropout draws from (the descent
        probe replays the forward with it)."""
        if torch.is_grad_enabled() and self.batch.ids is None and self.random_state is None:
            self.random_state = RandomState.now(device_of(self.blocks[0]))

    def _probe_before_forward(self, module, args, kwargs) -> None:
        """FSDP2, the recording step's training forward about to run: the causal probe on its batch first."""
        if not torch.is_grad_enabled() or self.sharded_probe is not None or self.stopped is not None:
            return  # the probe's own forwards run under no_grad: they do not come back here
        try:
            self.sharded_probe = probe_before_forward(self.model, args, kwargs, self.reducer, device_of(self.blocks[0]))
        except Exception as error:  # inside the training forward: never raise into it
            self._stop(f"the causal probe failed at step {self.count}: {type(error).__name__}: {error}")

    def _forward_starts(self, module, args, kwargs) -> None:
        """Every forward of the module the loop calls (training/entry.py), the one hook the Watch keeps between
        records. A training forward (with gradients): a step is under way for the loop; with the checks on, the
        step's micro-batches are counted and the first gives its batch key — unless the forward comes before the
        optimizer step of the step already recorded. A forward without gradients that is not one of the Watch's
        own probes is the loop's evaluation: its tokens are counted against the ids trained on."""
        if self.stopped is not None:
            return
        if not torch.is_grad_enabled():
            if self.checks and not probing():
                self._see_evaluation(args, kwargs)
            return
        before_its_step = self._before_the_steps_optimizer_step()
        self.loop.forward_started()
        if self.checks and not before_its_step:
            self._see_order(args, kwargs)

    def _see_order(self, args, kwargs) -> None:
        """A training forward of the step: counted, and the first gives the step's batch key."""
        self.forwards += 1
        try:
            ids = input_ids(args, kwargs)
            if ids is not None:
                self.order.see(self.count, ids)
                self.coverage.trained(ids)
        except Exception as error:  # inside the training forward: never raise into it
            self._stop(f"reading the batch failed at step {self.count}: {type(error).__name__}: {error}")

    def _see_evaluation(self, args, kwargs) -> None:
        """A forward without gradients that is not the Watch's own: its tokens against the ids trained on."""
        try:
            ids = input_ids(args, kwargs)
            if ids is not None:
                self.coverage.evaluated(ids)
        except Exception as error:  # inside the loop's evaluation: never raise into it
            self._stop(f"reading an evaluation batch failed at step {self.count}: {type(error).__name__}: {error}")

    def _before_the_steps_optimizer_step(self) -> bool:
        """Whether a forward runs after step() and before the optimizer step of the same training step."""
        return self.step_still_due is not None and self.loop.steps_ended == self.step_still_due

    def _capture_loss(self, module, args, kwargs, output):
        """The recording step's training forward — the first with gradients (an evaluation inside the loop runs
        under torch.no_grad()): its loss, its batch, and the loop's evidence of it."""
        if not torch.is_grad_enabled() or self.stopped is not None:
            return
        try:
            if self.batch.ids is not None:  # a later micro-batch of the step
                self.loop.later_forward(self.entry.anchor(output))
                return
            self._see_forward(args, kwargs, output)
        except Exception as error:  # inside the training forward: never raise into it
            self._stop(f"reading the forward failed at step {self.count}: {type(error).__name__}: {error}")

    def _see_forward(self, args, kwargs, output) -> None:
        anchor = self.entry.anchor(output)  # before the output is narrowed: a decoder's hidden states anchor too
        output = self.entry.model_output(output)
        loss = loss_of(output)
        if isinstance(loss, torch.Tensor) and self.captured_loss is None:
            self.captured_loss = loss.detach()
            self.captured_graph = loss  # its autograd graph, for what the loss was computed from
        self.batch.see(args, kwargs, output)
        self.synchronised = synchronised(self.model)  # DDP inside no_sync: this backward averages nothing
        self.loop.forward(anchor)
        self.loop.watch_logits(logits_of(output))

    def step(self, loss: Optional[torch.Tensor] = None, lr: Optional[float] = None) -> Optional[dict]:
        """Call after loss.backward() and before optimizer.step(); returns the record written, if any. Whatever
        goes wrong while recording (a full disk, a folder gone read-only, a statistic that fails), the training
        loop goes on: one warning, and the Watch stops recording; the timeline keeps every record written."""
        if self.stopped is not None:
            return None
        loss, lr = self._taken("loss", loss), self._taken("lr", lr)
        entry = None
        try:
            if self.recording:
                self._disarm()
                descent = self._descent(loss)
                entry = self._record(loss if loss is not None else self.captured_loss, lr)
                self.captured_loss, self.captured_graph, self.random_state = None, None, None
                self.sharded_probe = None
                self.loop.expect_step(entry["step"], descent)
            if self.loop.between is not None:
                self.loop.between.step = self.count  # the step whose optimizer.step() comes next
            # an arm left waiting for an optimizer step that never came (a loss scaler skipped it): wait again
            skipped, self.loop.on_step_end = self.loop.on_step_end is not None, None
            self.step_still_due = self.loop.steps_ended if self.loop.step_pending() else None
            self.count, self.forwards = self.count + 1, 0
            if skipped or self.count % self.every == 0:
                self._arm_for_next_step()
        except Exception as error:  # a monitor never takes the run down
            self._stop(f"recording failed at step {self.count}: {type(error).__name__}: {error}")
            return None
        return entry

    def _taken(self, name: str, value):
        """An argument of step() as the record takes it; what was wrong with it warned once per argument."""
        value, problem = scalar_argument(name, value)
        if problem is not None and name not in self.warned_arguments:
            self.warned_arguments.add(name)
            warnings.warn(f"blocktrace.Watch: watch.step(): {problem} (said once); training goes on", RuntimeWarning,
                          stacklevel=3)
        return value

    def _stop(self, why: str) -> None:
        """Recording ends here, said once; the hooks come off, the file is closed with every whole record in it."""
        self.stopped = why
        warnings.warn(f"blocktrace.Watch stopped recording ({why}); training goes on and the timeline keeps the "
                      "records written before", RuntimeWarning, stacklevel=3)
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Detach everything and close the file (also `with Watch(...) as watch:`); never raises. A step() after
        close() records nothing."""
        if self.recording:
            self._disarm()
        self.entry.close()
        self.loop.close()
        if self.stopped is None:
            self.stopped = "closed"
        if self.writer is not None:
            try:
                self.writer.close()
            except OSError as error:
                warnings.warn(f"blocktrace.Watch: closing {self.writer.path} failed: {error}", RuntimeWarning,
                              stacklevel=2)

    def _learning_rate(self, lr: Optional[float]) -> Optional[float]:
        if lr is not None:
            return float(lr)
        if self.optimizer is not None and self.optimizer.param_groups:
            value = self.optimizer.param_groups[0].get("lr")
            # None where the optimizer sets its own step size: transformers' Adafactor with relative_step=True
            return float(value) if isinstance(value, (int, float, torch.Tensor)) else None
        return None

    def _record(self, loss, lr) -> Optional[dict]:
        """Everything measured on the device, read on the host in one copy (tracing.assembly.finish), then judged."""
        present, moved, traces, host = self._measure(loss)
        _settle_loop(host["loop"])
        host["loop"]["frozen_zero"] = self.loop.frozen.settle(host["loop"].get("frozen_zero"))
        host["loop"]["token_embedding_zero"] = self.loop.zero_embedding.settle(host["loop"].get("token_embedding_zero"))
        for t in traces:
            t.notes += self.reducer.note()
        layers = self._layers(present, traces, moved, host)
        entry = record(self.count, "watch", layers, [], [], loss=host["loss"], lr=self._learning_rate(lr),
                       grad_norm=host["model_grad"],
                       extra={"ranks": self.reducer.world_size, "vocab": self.batch.vocab,
                              "data": with_order(host["data"], self.order.report(host["order"]),
                                                 self.order.repetition(), host["coverage"]),
                              "model": type(unwrap(self.model)).__name__,
                              "entry": None if self.entry.is_model else self.entry.name,
                              "width": traces[0].input.shape[-1] if traces else None,
                              "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
                              "loop": host["loop"], "probe": host["probe"],
                              "replicas": replica_rows(host["replicas"]),
                              "blocks": self._blocks_seen(present, host["grads"])})
        compare_logits(traces, present, self.history[-1] if len(self.history) else None)
        judge_record(entry, traces, host, self.history, self.checks, self.blocks, self.optimizer)
        self.rollback.name(entry)
        self.history.add(entry)
        if self.writer is not None:
            self.writer.write(entry)
            if self.tensorboard is not None:
                write_scalars(self.tensorboard, entry)
        return entry

    def _layers(self, present: list[int], traces: list, moved: list, host: dict) -> list[dict]:
        """The record's layers: each traced block's statistics, gradient norm and weights' movement, whether it
        trains, and the kinds of its tensors that do not."""
        weights = [m.result(values) for m, values in zip(moved, host["moved"])] or [None] * len(self.blocks)
        return [dict(layer_entry(index, t, host["grads"][index], weights[index]),
                     trainable=is_trainable(self.blocks[index]),
                     frozen_kinds=moved[index].frozen_kinds() if moved else [])
                for index, t in zip(present, traces)]

    def _measure(self, loss) -> tuple[list[int], list, list, dict]:
        """The blocks that ran, their movements, their Traces and the rest of what was measured, on the host."""
        collected = [(index, tap.result(self.reducer)) for index, tap in enumerate(self.taps)]
        present = [(index, c) for index, c in collected if c is not None]
        scale = self.loop.loss_scale()
        carried = self.loop.gradient_scale(self.reducer.active)  # the gradients as the loss's own, not S × them
        grads = [_unscaled(_grad_norm(block), carried) for block in self.blocks]
        self._warn_if_called_before_backward(grads)
        held = self.loop.held_by_optimizer()
        moved = [movement(block, self.snapshots[i] if self.snapshots else None, held)
                 for i, block in enumerate(self.blocks)] if self.track_updates else []
        if self.track_updates:
            self.snapshots = [snapshot(block) for block in self.blocks]
        replicas = self._replicas(scale)  # before the batch's report, which forgets the batch
        self.loop.record_taken(self.count)  # weights written since the last optimizer step: seen in this record
        measured = {"grads": grads, "model_grad": _unscaled(_grad_norm(self.model), carried),
                    "moved": [m.values() for m in moved],
                    "loss": self._loss(loss),
                    "loop": self._loop_evidence(loss),
                    "probe": causal_probe(self.model, self.batch, self.reducer, device_of(self.blocks[0]),
                                          self.sharded_probe, None if self.entry.is_model else self.entry.module)
                    if self.checks else None,
                    "data": self.batch.report(self.loop.trained, self.loop.gradient_targets),
                    "order": self.order.take(),
                    "coverage": self.coverage.take() if self.checks else None,
                    "weights": [weight_moments(block) for block in self.blocks] if self.checks else None}
        measured["replicas"] = replicas
        traces, host = finish([c for _, c in present], measured)
        return [index for index, _ in present], moved, traces, host

    def _loop_evidence(self, loss) -> dict:
        """The loop's evidence (training/loop.py) and the token embedding's rows the gradient reached."""
        rows = rows_reached(unwrap(self.model), self.batch.ids) if self.checks and self.loop.trained else None
        if rows is not None:
            rows["softmax_over_vocabulary"] = softmax_over_vocabulary(unwrap(self.model), self._loss_graph(loss))
        return {**self.loop.evidence(self._loss_checks(loss) if self.checks else {}, self.forwards or None),
                "embedding_rows": rows}

    def _loss_checks(self, loss) -> dict:
        """What the loss says against the batch's logits and targets, and what its autograd graph was given."""
        checked = self.captured_loss if self.captured_loss is not None else loss
        graph = self._loss_graph(loss)
        return loss_checks(self.batch.logits, self.batch.targets,
                           checked if isinstance(checked, torch.Tensor) else None, graph, self.batch.logits_node)

    def _loss_graph(self, loss) -> Optional[torch.Tensor]:
        """The loss's graph: step()'s loss, or the model's own where step() was given a number or a detached
        tensor."""
        return next((t for t in (loss, self.captured_graph) if isinstance(t, torch.Tensor) and t.grad_fn is not None),
                    None)

    def _replicas(self, scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Every rank's fingerprint (training/distributed.py), gathered in one collective; None in one process."""
        if not self.reducer.active or not self.checks:
            return None
        row = fingerprint(unwrap(self.model), self.batch.ids, self._learning_rate(None), self.count, scale,
                          self.synchronised, device_of(self.blocks[0]), self.optimizer)
        self.synchronised = None
        return self.reducer.gathered(row)

    def _blocks_seen(self, present: list[int], grads: list) -> dict:
        """Every block, traced or not: how many there are, how many ran with gradients enabled in the recorded
        forward (traced), how many were skipped in it (returned their input: LayerDrop), how many of the others are
        trainable, and how many of those got no gradient at all."""
        trainable = [is_trainable(block) for block in self.blocks]
        skipped = [tap.bypassed for tap in self.taps]
        return {"count": len(self.blocks), "traced": len(present), "skipped": sum(skipped),
                "trainable": sum(wanted and not gone for wanted, gone in zip(trainable, skipped)),
                "without_gradient": sum(1 for wanted, gone, g in zip(trainable, skipped, grads)
                                        if wanted and not gone and g is None)}

    def _descent(self, loss) -> Optional[Descent]:
        """The recorded step's forward, to replay after its optimizer step (the descent probe), one process, checks
        on: where the model returns its loss, that loss; else, where the loop gave its loss and the loss's gradient at
        the logits named targets, their cross-entropy — the same quantity as the loop's where the two agree (the
        record keeps both)."""
        batch = self.batch
        if not self.checks or batch.call is None or self.random_state is None or self.reducer.world_size > 1:
            return None
        if self.captured_loss is not None:
            return Descent(self.count, batch.call, self.random_state, self.captured_loss.double().reshape(()))
        targets = self.loop.gradient_targets[0] if self.loop.gradient_targets is not None else None
        before = targets_cross_entropy(batch.logits, targets) if targets is not None else None
        if before is None or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return None
        return Descent(self.count, batch.call, self.random_state, before, targets=targets,
                       loss_given=loss.detach().double().reshape(()).to(before.device))

    def _loss(self, loss) -> Optional[torch.Tensor]:
        """The loss as a device scalar, averaged over the ranks."""
        if loss is None:
            return None
        if not isinstance(loss, torch.Tensor):
            loss = torch.full((), float(loss), dtype=torch.float64, device=device_of(self.blocks[0]))
        return self.reducer.mean(loss.detach().reshape(()).double())

    def _warn_if_called_before_backward(self, grads: list) -> None:
        """Once: a recording step where no block has a gradient although its parameters require one."""
        wanted = any(p.requires_grad for block in self.blocks for p in block.parameters())
        if self.warned_no_gradients or not wanted or any(g is not None for g in grads) or not self.model.training:
            return
        self.warned_no_gradients = True
        warnings.warn(f"blocktrace.Watch: the recording step {self.count} found no gradients on parameters that "
                      "require them: call watch.step() after loss.backward() and before optimizer.step() and "
                      "zero_grad() (gradient norms are recorded as null until then)", RuntimeWarning, stacklevel=3)


def _settle_loop(loop: dict) -> None:
    """The loop's evidence as read on the host, each piece put in its record's form."""
    loop["between_steps"] = settled(loop.get("between_steps"))
    loop["descent"] = descent_read(loop.get("descent"))
    loop["row_weights"] = row_weights(loop.get("tempered"))
    loop["tempered"] = tempered_rows(loop.get("tempered"))


def _unscaled(norm: Optional[torch.Tensor], scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return norm if norm is None or scale is None else norm / scale.to(norm.device)


def _grad_norm(module: nn.Module) -> Optional[torch.Tensor]:
    """‖g‖ over the module's gradients (training.loop.grad_norm)."""
    return grad_norm(module.parameters())
