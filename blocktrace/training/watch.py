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

import inspect
import math
import numbers
import struct
import warnings
from os import PathLike
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from blocktrace.diagnose.diagnosis import Context, conclude
from blocktrace.diagnose.dynamics import judge
from blocktrace.diagnose.grad import GradientReport
from blocktrace.diagnose.health import ModelEvidence, evaluate
from blocktrace.diagnose.history import History
from blocktrace.diagnose.weights import movement, snapshot, weight_moments, weight_summary
from blocktrace.errors import UsageError
from blocktrace.tracing.assembly import finish
from blocktrace.tracing.steps import detect_layout
from blocktrace.tracing.tap import BlockTap, attention_through_sdpa
from blocktrace.tracing.tracer import is_own_block
from blocktrace.phrases import phrase
from blocktrace.training.distributed import Reducer, fingerprint, is_shard, replica_rows, synchronised
from blocktrace.training.order import DataOrder
from blocktrace.training.loop import (
    Descent,
    ForwardCall,
    LoopObserver,
    RandomState,
    causal_model,
    grad_norm,
    input_evidence,
    logits_of,
    loss_checks,
    loss_of,
    probe_causality,
    target_match,
)
from blocktrace.training.rollback import healthy
from blocktrace.training.timeline import TimelineWriter, diagnosis_entries, flag_entries, layer_entry, record
from blocktrace.vocab import Level

Blocks = Union[None, str, Sequence[nn.Module]]


def _sharded(model: nn.Module) -> bool:
    """Whether FSDP2 shards some parameter: its forward gathers the shards, a collective."""
    return any(is_shard(p) for p in model.parameters())


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / DataParallel wrappers."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def _known(block: nn.Module) -> bool:
    if is_own_block(block):
        return True
    try:
        detect_layout(block)
        return True
    except UsageError:
        return False


def _first_step(writer: Optional[TimelineWriter], start: Optional[int]) -> int:
    """The step of the first forward: start=, else the step after the last record of the timeline continued
    (append=True), else 0. A start that would repeat a step the timeline holds is refused."""
    last = writer.last_step if writer is not None else None
    if start is None:
        return 0 if last is None else last + 1
    if last is not None and start <= last:
        raise UsageError(f"start={start} would repeat step {start} of {writer.path}, which holds steps up to {last}: "
                         f"give start={last + 1} or more (or leave start out to continue from there)")
    return start


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_arguments(model, path, every, start, blocks, optimizer, tensorboard, **flags) -> None:
    """Wrong types are refused with one UsageError naming the argument (never an AttributeError deep inside)."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"Watch needs the torch.nn.Module being trained, not {type(model).__name__}")
    if not isinstance(path, (str, PathLike)):
        raise UsageError(f"path must be the timeline file's path (a str or Path), not {type(path).__name__}")
    if not _is_integer(every) or every < 1:
        raise UsageError(f"every must be a positive integer, not {every!r}")
    if start is not None and (not _is_integer(start) or start < 0):
        raise UsageError(f"start must be a training step (an integer ≥ 0), not {start!r}")
    if not (blocks is None or isinstance(blocks, str) or
            (isinstance(blocks, (list, tuple, nn.ModuleList)) and blocks and
             all(isinstance(block, nn.Module) for block in blocks))):
        raise UsageError("blocks must be None (found by the Watch), the dotted path of the ModuleList holding "
                         f"them, or a non-empty list of modules; not {blocks!r:.80}")
    if optimizer is not None and not isinstance(getattr(optimizer, "param_groups", None), list):
        raise UsageError(f"optimizer must be a torch optimizer (with param_groups), not {type(optimizer).__name__}")
    if not (tensorboard is None or hasattr(tensorboard, "add_scalar") or isinstance(tensorboard, (str, PathLike))):
        raise UsageError("tensorboard must be a SummaryWriter (anything with add_scalar) or a log directory, "
                         f"not {type(tensorboard).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise UsageError(f"{name} must be True or False, not {value!r:.80}")


def _scalar(name: str, value) -> tuple[Any, Optional[str]]:
    """step()'s loss or lr as the record takes it, and what was wrong with it (None: nothing). A number of any real
    type (numpy's too) or a one-element tensor is taken as it is; a tensor of several floating elements (the
    per-device losses nn.DataParallel gathers) as its mean; anything else as not given (the model output's own
    loss, the optimizer's lr, are then taken where there are ones). Never raises: step() runs inside the loop."""
    if value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        return (None if value is None else float(value)), None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value, None
    if isinstance(value, torch.Tensor) and value.numel() > 1 and value.is_floating_point():
        return value.detach().mean(), f"{name} of shape {list(value.shape)} recorded as its mean"
    shape = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
    return None, (f"{name} must be a number or a one-element tensor (or None), not {type(value).__name__}{shape}: "
                  "ignored, as if not given")


def find_blocks(model: nn.Module, blocks: Blocks = None) -> list[nn.Module]:
    """The model's Transformer blocks: the ones named (a list, or a dotted path to a ModuleList), else the
    longest ModuleList whose modules blocktrace knows (HF GPT-2 / BERT / Llama-family layers, nanoGPT's Block,
    blocktrace's own)."""
    model = _unwrap(model)
    if isinstance(blocks, str):
        try:
            found = model.get_submodule(blocks)
        except AttributeError:
            raise UsageError(f"the model has no submodule {blocks!r} holding its blocks") from None
        if not isinstance(found, (nn.ModuleList, nn.Sequential)) or not len(found):
            raise UsageError(f"{blocks!r} is a {type(found).__name__}, not a list of blocks: give the path of the "
                             "ModuleList holding them (e.g. 'transformer.h' or 'model.layers')")
        return list(found)
    if blocks is not None:
        return list(blocks)
    candidates = [list(module) for module in model.modules()
                  if isinstance(module, nn.ModuleList) and len(module) and _known(module[0])]
    if not candidates:
        raise UsageError(f"cannot find the Transformer blocks of {type(model).__name__}: pass blocks= (a list of "
                         "modules, or the path of the ModuleList holding them, e.g. 'transformer.h')")
    return max(candidates, key=len)


FIRST_ERROR_WARNING = "blocktrace.Watch: first error at step"  # the rollback warning's opening words


class Watch:
    """Records the model's blocks every `every` training steps into a timeline file (see the module docstring)."""

    def __init__(self, model: nn.Module, path: Union[str, Path], every: int = 50, *, blocks: Blocks = None,
                 optimizer: Optional[torch.optim.Optimizer] = None, tensorboard=None, checks: bool = True,
                 track_updates: bool = True, start: Optional[int] = None, append: bool = False,
                 overwrite: bool = False):
        _check_arguments(model, path, every, start, blocks, optimizer, tensorboard,
                         checks=checks, track_updates=track_updates, append=append, overwrite=overwrite)
        self.model, self.every, self.optimizer = model, every, optimizer
        self.blocks = find_blocks(model, blocks)
        # only a forward with gradients is traced: an evaluation inside the loop runs under torch.no_grad()
        self.taps = [BlockTap(block, checks=checks, when=torch.is_grad_enabled) for block in self.blocks]
        self.track_updates, self.checks = track_updates, checks
        self.reducer = Reducer()
        self.tensorboard = _tensorboard(tensorboard) if self.reducer.is_writer else None
        self.writer = TimelineWriter(Path(path), append, overwrite) if self.reducer.is_writer else None
        try:  # the training step of the next forward (a resumed run's is past 0: start=, or the step after the last
            self.count = _first_step(self.writer, start)  # one the timeline holds)
        except BaseException:
            if self.writer is not None:
                self.writer.close()  # its lock too: the same file may be given again, rightly
            raise
        self.stopped: Optional[str] = None  # why recording stopped (the training loop goes on)
        self.snapshots: Optional[list[dict]] = None
        self.armed = None  # the context that measures sdpa attention during a recording forward
        self.warned_no_gradients = False
        self.warned_arguments: set[str] = set()  # step()'s arguments already said to be unusable
        self.last_healthy: Optional[int] = None  # the last record's step that raised no warning or error
        self.trouble_seen = False
        self.captured_loss: Optional[torch.Tensor] = None
        self.captured_graph: Optional[torch.Tensor] = None  # the model's loss as returned, its graph attached
        self.random_state: Optional[RandomState] = None  # at the recording step's training forward
        self.synchronised: Optional[bool] = None  # whether the recorded forward's backward averages gradients (DDP)
        self.batch = Batch(_shifts_labels(_unwrap(model)), _targets_position(_unwrap(model)))
        self.loop = LoopObserver(_unwrap(model), optimizer)
        # the records before, for the dynamics (diagnose/dynamics.py): the first (trends start there) and the last few
        self.history = History()
        self.order = DataOrder()  # every training step's batch, to tell an order that repeats (training/order.py)
        self.order_hook = model.register_forward_pre_hook(self._see_order, with_kwargs=True) if checks else None
        if self.count % every == 0:
            self._arm()

    @property
    def recording(self) -> bool:
        return self.armed is not None

    def _arm(self) -> None:
        """Attach everything for the next forward: it belongs to a recording step."""
        for tap in self.taps:
            tap.attach()
        self.loss_hook = self.model.register_forward_hook(self._capture_loss, with_kwargs=True)
        self.rng_hook = self.model.register_forward_pre_hook(self._remember_random_state)
        self.loop.reset()
        self.armed = attention_through_sdpa()
        self.armed.__enter__()

    def _disarm(self) -> None:
        for tap in self.taps:
            tap.detach()
        self.loss_hook.remove()
        self.rng_hook.remove()
        self.armed.__exit__(None, None, None)
        self.armed = None

    def _remember_random_state(self, module, args) -> None:
        """Before the recording step's training forward: the random state its dropout draws from (the descent
        probe replays the forward with it)."""
        if torch.is_grad_enabled() and self.batch.ids is None and self.random_state is None:
            self.random_state = RandomState.now(_device(self.blocks[0]))

    def _see_order(self, module, args, kwargs) -> None:
        """Every training forward (with gradients): the first of each step gives the step's batch key."""
        if not torch.is_grad_enabled() or self.stopped is not None:
            return
        try:
            ids = input_ids(args, kwargs)
            if ids is not None:
                self.order.see(self.count, ids)
        except Exception as error:  # inside the training forward: never raise into it
            self._stop(f"reading the batch failed at step {self.count}: {type(error).__name__}: {error}")

    def _capture_loss(self, module, args, kwargs, output):
        """The recording step's training forward — the first with gradients (an evaluation inside the loop runs
        under torch.no_grad()): its loss, its batch, and the loop's evidence of it."""
        if not torch.is_grad_enabled() or self.batch.ids is not None or self.stopped is not None:
            return
        try:
            self._see_forward(args, kwargs, output)
        except Exception as error:  # inside the training forward: never raise into it
            self._stop(f"reading the forward failed at step {self.count}: {type(error).__name__}: {error}")

    def _see_forward(self, args, kwargs, output) -> None:
        loss = loss_of(output)
        if isinstance(loss, torch.Tensor) and self.captured_loss is None:
            self.captured_loss = loss.detach()
            self.captured_graph = loss  # its autograd graph, for what the loss was computed from
        self.batch.see(args, kwargs, output)
        self.synchronised = synchronised(self.model)  # DDP inside no_sync: this backward averages nothing
        self.loop.forward(loss if isinstance(loss, torch.Tensor) else logits_of(output))

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
                descent = self._descent()
                entry = self._record(loss if loss is not None else self.captured_loss, lr)
                self.captured_loss, self.captured_graph, self.random_state = None, None, None
                self.loop.expect_step(entry["step"], descent)
            self.count += 1
            if self.count % self.every == 0:
                self._arm()
        except Exception as error:  # a monitor never takes the run down
            self._stop(f"recording failed at step {self.count}: {type(error).__name__}: {error}")
            return None
        return entry

    def _taken(self, name: str, value):
        """An argument of step() as the record takes it; what was wrong with it warned once per argument."""
        value, problem = _scalar(name, value)
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
        if self.order_hook is not None:
            self.order_hook.remove()
            self.order_hook = None
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
            return float(self.optimizer.param_groups[0]["lr"])
        return None

    def _record(self, loss, lr) -> Optional[dict]:
        """Everything measured on the device, read on the host in one copy (tracing.assembly.finish), then judged."""
        present, moved, traces, host = self._measure(loss)
        weights = [m.result(values) for m, values in zip(moved, host["moved"])] or [None] * len(self.blocks)
        for t in traces:
            t.notes += self.reducer.note()
        layers = [dict(layer_entry(index, t, host["grads"][index], weights[index]),
                       trainable=_trainable(self.blocks[index])) for index, t in zip(present, traces)]
        entry = record(self.count, "watch", layers, [], [], loss=host["loss"], lr=self._learning_rate(lr),
                       grad_norm=host["model_grad"],
                       extra={"ranks": self.reducer.world_size, "vocab": self.batch.vocab,
                              "data": _with_order(host["data"], self.order.report(host["order"])),
                              "model": type(_unwrap(self.model)).__name__,
                              "width": traces[0].input.shape[-1] if traces else None,
                              "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
                              "loop": host["loop"], "probe": host["probe"],
                              "replicas": replica_rows(host["replicas"]),
                              "blocks": self._blocks_seen(present, host["grads"])})
        self._judge(entry, traces, host)
        self._name_rollback(entry)
        self.history.add(entry)
        if self.writer is not None:
            self.writer.write(entry)
            self._to_tensorboard(entry)
        return entry

    def _measure(self, loss) -> tuple[list[int], list, list, dict]:
        """The blocks that ran, their movements, their Traces and the rest of what was measured, on the host."""
        collected = [(index, tap.result(self.reducer)) for index, tap in enumerate(self.taps)]
        present = [(index, c) for index, c in collected if c is not None]
        scale = self.loop.loss_scale()  # the gradients as the loss's own, not a loss scaler's multiple
        grads = [_unscaled(_grad_norm(block), scale) for block in self.blocks]
        self._warn_if_called_before_backward(grads)
        held = self.loop.held_by_optimizer()
        moved = [movement(block, self.snapshots[i] if self.snapshots else None, held)
                 for i, block in enumerate(self.blocks)] if self.track_updates else []
        if self.track_updates:
            self.snapshots = [snapshot(block) for block in self.blocks]
        checked_loss = self.captured_loss if self.captured_loss is not None else loss
        # the loss's graph: step()'s loss, or the model's own where step() was given a number or a detached tensor
        graph = next((t for t in (loss, self.captured_graph) if isinstance(t, torch.Tensor) and t.grad_fn is not None),
                     None)
        replicas = self._replicas(scale)  # before the batch's report, which forgets the batch
        measured = {"grads": grads, "model_grad": _unscaled(_grad_norm(self.model), scale),
                    "moved": [m.values() for m in moved],
                    "loss": self._loss(loss),
                    "loop": self.loop.evidence(loss_checks(self.batch.logits, self.batch.targets,
                                                           checked_loss if isinstance(checked_loss, torch.Tensor)
                                                           else None, graph) if self.checks else {}),
                    "probe": self._probe(), "data": self.batch.report(self.loop.trained),
                    "order": self.order.take(),
                    "weights": [weight_moments(block) for block in self.blocks] if self.checks else None}
        measured["replicas"] = replicas
        traces, host = finish([c for _, c in present], measured)
        return [index for index, _ in present], moved, traces, host

    def _replicas(self, scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """Every rank's fingerprint (training/distributed.py), gathered in one collective; None in one process."""
        if not self.reducer.active or not self.checks:
            return None
        row = fingerprint(_unwrap(self.model), self.batch.ids, self._learning_rate(None), self.count, scale,
                          self.synchronised, _device(self.blocks[0]), self.optimizer)
        self.synchronised = None
        return self.reducer.gathered(row)

    def _blocks_seen(self, present: list[int], grads: list) -> dict:
        """Every block, traced or not: how many there are, how many ran with gradients enabled in the recorded
        forward (traced), how many are trainable, and how many trainable ones got no gradient at all."""
        trainable = [_trainable(block) for block in self.blocks]
        return {"count": len(self.blocks), "traced": len(present), "trainable": sum(trainable),
                "without_gradient": sum(1 for wanted, g in zip(trainable, grads) if wanted and g is None)}

    def _descent(self) -> Optional[Descent]:
        """The recorded step's forward, to replay after its optimizer step (the descent probe): only where the
        model returns its loss (the replay must give the same quantity), one process, checks on."""
        batch = self.batch
        if not self.checks or batch.call is None or self.captured_loss is None or self.random_state is None \
                or self.reducer.world_size > 1:
            return None
        return Descent(self.count, batch.call, self.random_state, self.captured_loss.double().reshape(()))

    def _probe(self) -> Optional[dict]:
        """The causal probe on the recorded batch's first sequence; under DDP on every rank's own copy (the
        unwrapped module: no collective inside), its largest leak and its failures gathered to rank 0. Not under
        FSDP2, whose forward gathers shards: a rank whose probe failed would leave the others waiting. A failure is
        kept as a note: the probe never stops training."""
        batch = self.batch
        if not self.checks:
            return None
        if _sharded(self.model):
            return {"note": phrase("causal probe not run under FSDP2: a forward between backward() and "
                                   "optimizer.step() changes what FSDP2 trains (docs/track.md)")}
        seen = batch.ids is not None and batch.vocab is not None
        found, leak, note = {"causal_model": causal_model(_unwrap(self.model))}, None, None
        if seen:
            try:
                leak = probe_causality(_unwrap(self.model), batch.call, batch.ids, batch.vocab)
            except Exception as error:  # the model may want more than its ids: say so, and go on
                note = f"causal probe not run: {type(error).__name__}: {error}"[:200]
        if self.reducer.active:  # every rank reaches these collectives, whatever its probe did
            return {**found, **self._probe_across_ranks(leak, note, seen)}
        if not seen:
            return None
        return {**found, **(leak or {}), **({"note": note} if note else {})}

    def _probe_across_ranks(self, leak: Optional[dict], note: Optional[str], seen: bool) -> dict:
        """The largest leak over the ranks, and how many ranks could not run the probe (said by rank 0)."""
        device = _device(self.blocks[0])
        value = leak["future_leak"].double().to(device) if leak else torch.full((), -1.0, dtype=torch.float64,
                                                                                  device=device)
        failed = self.reducer.summed(torch.tensor(0.0 if leak or not seen else 1.0, dtype=torch.float64,
                                                  device=device))
        largest = self.reducer.largest(value)
        result = {"future_leak": torch.where(largest >= 0, largest, torch.full_like(largest, float("nan"))),
                  "leak_position": leak["leak_position"] if leak else None, "ranks_failed": failed}
        if note:
            result["note"] = note  # rank 0's own; ranks_failed counts every rank's
        return result

    def _judge(self, entry: dict, traces: list, host: dict) -> None:
        """The record's findings — the blocks' checks and the dynamics against the records before — concluded."""
        context = Context(post_norm=any(t.wiring.stream_normalised for t in traces), step=self.count)
        scale = (host.get("loop") or {}).get("loss_scale")
        findings = self._findings(traces, host["grads"], host["weights"], isinstance(scale, float) and scale > 1)
        if self.checks:
            findings += judge(self.history, entry)
        found = conclude(findings, context)
        entry["flags"] = flag_entries([f.to_dict() for f in found.flags])
        entry["diagnosis"] = diagnosis_entries(found.diagnosis)

    def _name_rollback(self, entry: dict) -> None:
        """At the first record with an error: the step to roll back to (training/rollback.py), in the record and in
        one warning, since a loop may run for hours past it."""
        if healthy(entry):
            self.last_healthy = entry["step"]
            return
        errors = [f for f in entry["flags"] if f["level"] == Level.ERROR.value]
        if self.trouble_seen or not errors:
            return
        self.trouble_seen = True
        entry["rollback"] = self.last_healthy
        where = (f"the last healthy record is step {self.last_healthy}: roll back to the last checkpoint saved at or "
                 "before it" if self.last_healthy is not None else "no record before it was healthy: the run was "
                 "broken from its start")
        warnings.warn(f"{FIRST_ERROR_WARNING} {entry['step']} ({errors[0]['name']}: "
                      f"{errors[0]['detail']}); {where}", RuntimeWarning, stacklevel=4)

    def _loss(self, loss) -> Optional[torch.Tensor]:
        """The loss as a device scalar, averaged over the ranks."""
        if loss is None:
            return None
        if not isinstance(loss, torch.Tensor):
            loss = torch.full((), float(loss), dtype=torch.float64, device=_device(self.blocks[0]))
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

    def _findings(self, traces: list, grads: list, weights: Optional[list], loss_scaled: bool = False) -> list:
        if not traces or not self.checks:
            return []
        gradients = GradientReport(loss=float("nan"), batches=1, step_norms=[{"parameters": g} for g in grads
                                                                             if g is not None], weight_norms=[],
                                   loss_scaled=loss_scaled)
        evidence = ModelEvidence(weights=[weight_summary(w) for w in weights], n_layers=len(traces),
                                 step=self.count, stored_dtype=_stored_dtype(self.blocks[0]),
                                 optimizer=optimizer_settings(self.optimizer), in_training=True)
        return evaluate(traces, gradients, evidence)

    def _to_tensorboard(self, entry: dict) -> None:
        if self.tensorboard is None:
            return
        step = entry["step"]
        for key in ("loss", "lr", "grad_norm"):
            if entry[key] is not None:
                self.tensorboard.add_scalar(f"blocktrace/{key}", entry[key], step)
        for layer in entry["layers"]:
            for key in ("rms", "max_logit", "min_entropy", "grad_norm"):
                if layer[key] is not None:
                    self.tensorboard.add_scalar(f"blocktrace/layer{layer['layer']}/{key}", layer[key], step)


STORED_DTYPES = {torch.float16: "F16", torch.bfloat16: "BF16"}  # safetensors' names, as checkpoints say


def _stored_dtype(block: nn.Module) -> str:
    parameter = next(block.parameters(), None)
    return STORED_DTYPES.get(parameter.dtype, "F32") if parameter is not None else "F32"


def optimizer_settings(optimizer) -> list[dict]:
    """Per parameter group and parameter dtype: the group's eps and what it becomes in that dtype."""
    if optimizer is None:
        return []
    settings = []
    for group in optimizer.param_groups:
        eps = group.get("eps")
        if not isinstance(eps, (int, float)):
            continue
        for dtype in {p.dtype for p in group["params"] if p.is_floating_point()}:
            settings.append({"dtype": str(dtype).replace("torch.", ""), "eps": float(eps),
                             "eps_in_dtype": rounded_to(float(eps), dtype)})
    return settings


def rounded_to(value: float, dtype: torch.dtype) -> float:
    """`value` as `dtype` stores it, computed on the host (a tensor's .item() would count as a read)."""
    if dtype not in (torch.float16, torch.float32, torch.bfloat16):
        return value
    try:
        if dtype == torch.float16:
            return struct.unpack("e", struct.pack("e", value))[0]
        single = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # past the format's largest value
        return math.copysign(math.inf, value)
    if dtype == torch.float32 or not math.isfinite(single):
        return single
    bits = struct.unpack("I", struct.pack("f", single))[0]
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # to the nearest bfloat16, ties to even
    return struct.unpack("f", struct.pack("I", bits))[0]




def _trainable(block: nn.Module) -> bool:
    """Whether any of the block's parameters requires a gradient (a block frozen on purpose is not judged)."""
    return any(p.requires_grad for p in block.parameters())


# the names a forward gives its targets (nanoGPT's targets, HF's labels, a tutorial's y)
TARGET_NAMES = frozenset({"targets", "target", "labels", "label", "y", "tgt", "next_tokens"})


def _targets_position(model: nn.Module) -> Optional[int]:
    """Where the forward takes its targets positionally (None: nowhere known). A second integer argument is a
    target only where the forward names it one: HF's forward(input_ids, attention_mask, …) takes a mask there."""
    try:
        parameters = [p for p in inspect.signature(model.forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    return next((i for i, p in enumerate(parameters) if p.name in TARGET_NAMES), None)


def _shifts_labels(model: nn.Module) -> bool:
    """HF models take labels equal to the inputs and shift them inside; a hand-written model takes shifted targets."""
    return type(model).__module__.startswith("transformers.")


class Batch:
    """What a recording forward was given: its input ids (kept, on their device, until the next record, to tell a
    repeated batch), whether its targets equal its inputs, and the vocabulary its logits span."""

    def __init__(self, shifts_labels: bool, targets_at: Optional[int] = None):
        self.shifts_labels = shifts_labels
        self.targets_at = targets_at  # the forward's positional argument that holds the targets, if any
        self.previous: Optional[torch.Tensor] = None
        self.ids: Optional[torch.Tensor] = None
        self.targets: Optional[torch.Tensor] = None
        self.logits: Optional[torch.Tensor] = None
        self.call: Optional[ForwardCall] = None  # how the training forward was called
        self.inputs: dict = {}  # the forward's position ids and attention mask, as device facts (loop.input_evidence)
        self.vocab: Optional[int] = None

    def see(self, args, kwargs, output) -> None:
        if self.ids is not None:
            return  # the first forward of the step is the training batch
        ids = input_ids(args, kwargs)
        if ids is None:
            return  # ids the model takes some other way (a list it converts itself): no batch seen beside them
        self.ids = ids.detach()
        self.call = ForwardCall(tuple(args), dict(kwargs), ids)  # the probe calls the model as training did
        self.inputs = input_evidence(self.ids, kwargs)
        labels = next((kwargs[name] for name in TARGET_NAMES if isinstance(kwargs.get(name), torch.Tensor)), None)
        positional = args[self.targets_at] if self.targets_at is not None and self.targets_at < len(args) else None
        self.targets = labels if labels is not None else (positional if isinstance(positional, torch.Tensor) else None)
        if self.targets is not None and self.targets.shape != self.ids.shape:
            self.targets = None  # not a target per position (a class per sequence): nothing to set beside the ids
        logits = logits_of(output)
        if logits is not None and logits.is_floating_point():
            self.logits, self.vocab = logits.detach(), int(logits.shape[-1])

    def report(self, trained: bool = True) -> Optional[dict]:
        """What the batch seen says, as device values (None when no ids were seen): whether it repeats the last
        trained batch, whether its targets equal its inputs, how they match them at each shift, the share of
        targets counted; then forget it. A batch whose output no backward reached (a forward with gradients that
        was not trained on) is not remembered as the last trained batch."""
        if self.ids is None:
            return None
        found = {"repeated": _same(self.previous, self.ids) if trained else None,
                 "labels_are_inputs": not self.shifts_labels and _same(self.targets, self.ids),
                 "shifts_inside": self.shifts_labels,
                 "language_model": self.ids.max() < self.vocab if self.vocab is not None and self.ids.numel() else None}
        if self.targets is not None:
            found.update(target_match(self.ids, self.targets))
        found.update(self.inputs)
        if trained:  # a copy: a loop that refills one buffer in place would otherwise compare the batch with itself
            self.previous = self.ids.clone()
        self.ids, self.targets, self.logits, self.call, self.inputs = None, None, None, None, {}
        return found


def _with_order(data: Optional[dict], repeats: Optional[dict]) -> Optional[dict]:
    """The batch's report with the repeated order found (training/order.py), where one was."""
    return data if repeats is None else {**(data or {}), "order_repeats": repeats}


def input_ids(args, kwargs) -> Optional[torch.Tensor]:
    """A forward's token ids: its input_ids, else its first [batch, T] integer tensor (None: none such)."""
    tensors = [*args, *kwargs.values()]
    integers = [t for t in tensors if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() == 2]
    ids = kwargs.get("input_ids", integers[0] if integers else None)
    return ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point() else None


def _same(a: Optional[torch.Tensor], b: torch.Tensor):
    """Whether two id tensors are equal: False, or a device boolean (torch.equal would wait for the device)."""
    if a is None or a.shape != b.shape or a.device != b.device:
        return False
    return (a == b).all()


def _unscaled(norm: Optional[torch.Tensor], scale: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return norm if norm is None or scale is None else norm / scale.to(norm.device)


def _grad_norm(module: nn.Module) -> Optional[torch.Tensor]:
    """‖g‖ over the module's gradients (training.loop.grad_norm)."""
    return grad_norm(module.parameters())


def _device(block: nn.Module) -> torch.device:
    parameter = next(block.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


def _tensorboard(target):
    """A TensorBoard writer: an object with add_scalar, or a log directory (needs the tensorboard package)."""
    if target is None or hasattr(target, "add_scalar"):
        return target
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("tensorboard= needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(str(target))
