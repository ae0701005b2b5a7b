"""`track`: a model over training, as the report every command returns (`track_request`).

Checkpoints go, in step order, through the whole-model check of `check --weights` (every layer read and traced one
at a time, the model's own loss, its gradients with --grad), with how far each layer's weights moved since the
previous checkpoint (‖ΔW‖/‖W‖ per tensor kind, streamed tensor by tensor: memory does not grow with the number of
checkpoints). Each checkpoint becomes one timeline record (training/timeline.py), the same records a Watch writes,
so everything after — the findings over training, the findings first raised, the first sign of trouble, the step to
roll back to, a training log's numbers, a healthy run beside it — works on both (training/)."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Iterator, Optional, Sequence

import torch

from blocktrace.diagnose.weights import Movement, tensor_kind
from blocktrace.errors import InputError, UsageError
from blocktrace.pipeline.model import check_model_request
from blocktrace.progress import tick
from blocktrace.request import Analysis, RunRequest, TrackRequest, is_timeline
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import model_info
from blocktrace.training.against import compared_runs
from blocktrace.training.timeline import (NotInStepOrder, flag_entries, in_step_order, layer_entry, read_timeline,
                                          record, stream_timeline)
from blocktrace.training.track import Point, Story, expand, last_sign, order, read_log
from blocktrace.vocab import SCHEMA_VERSION, ReportKind


def _layer_of(key: str, prefix: str) -> Optional[int]:
    """The layer index of a tensor named `<prefix><layer>.…` (prefix: the family's path to its layers)."""
    if not key.startswith(prefix):
        return None
    head = key[len(prefix):].split(".", 1)[0]
    return int(head) if head.isdigit() else None


def weight_movement(current, previous, layers_prefix: str, n_layers: int, ignored: tuple = ()) -> list[dict]:
    """Per layer, per tensor kind: ‖W‖ now and ‖W − W_previous‖/‖W_previous‖ (diagnose.weights.Movement). One
    tensor of each checkpoint in memory at a time, read in float32."""
    layers = [Movement() for _ in range(n_layers)]
    for key in current.keys:
        layer = _layer_of(key, layers_prefix)
        if layer is None or layer >= n_layers or key[len(layers_prefix):].split(".", 1)[1] in ignored:
            continue  # not a layer's tensor, or a buffer (a stored causal mask), not a weight
        now = current.get(key, torch.float32)
        before = previous.get(key, torch.float32) if previous is not None and key in previous \
            and tuple(previous.shape(key)) == tuple(now.shape) else None
        layers[layer].add(tensor_kind(key[len(layers_prefix):].split(".", 1)[1]), now, before)
    return [movement.result() for movement in layers]


def _block_grad_norms(report: dict, n_layers: int) -> list[Optional[float]]:
    gradients = report.get("gradients")
    if not gradients:
        return [None] * n_layers
    norms = []
    for layer in gradients["layers"]:
        parameters = layer.get("parameters") or {}
        norms.append(math.sqrt(sum(p["grad"] ** 2 for p in parameters.values())) if parameters else None)
    return norms


def _same_model(point: Point, current, info, before) -> None:
    """Two checkpoints of one model over training: the same family and depth, and every tensor they share of the
    same shape (a wider model or another vocabulary is another model, whose ‖ΔW‖ would mean nothing)."""
    earlier = model_info(before)
    if (earlier.family.name, earlier.n_layers) != (info.family.name, info.n_layers):
        raise InputError(f"{point.path} is a {info.n_layers}-layer {info.family.name} model but {before.path} is "
                         f"a {earlier.n_layers}-layer {earlier.family.name}: track follows one model over training")
    for key in current.keys:
        if key in before and tuple(current.shape(key)) != tuple(before.shape(key)):
            raise InputError(f"{point.path} and {before.path} hold {key} of different shapes "
                             f"({list(current.shape(key))} and {list(before.shape(key))}): a model of another width "
                             "or vocabulary; track follows one model over training")


def checkpoint_record(point: Point, request: RunRequest, analysis: Analysis, current, before,
                      before_record: Optional[dict] = None) -> dict:
    """One checkpoint as a timeline record: the whole-model check, and its weights against the previous one's.
    `current` and `before` are open Checkpoints (before: None at the first), each opened once for the whole track;
    `before_record` is the record made of `before`."""
    info = model_info(current)
    if before is not None:
        _same_model(point, current, info, before)
    checked = check_model_request(dataclasses.replace(request, weights=point.path, training_step=point.step),
                                  analysis, checkpoint=current, before=before_record)
    report, traces = checked.report, checked.traces
    moved = weight_movement(current, before, info.layer_prefix(0)[:-2], info.n_layers, info.family.ignored)
    grads = _block_grad_norms(report, len(traces))
    layers = [layer_entry(i, trace, grads[i], moved[i]) for i, trace in enumerate(traces)]
    return record(point.step, "checkpoint", layers, flag_entries(report.get("flags") or []),
                  report.get("diagnosis") or [],
                  loss=report.get("loss"), path=str(point.path),
                  extra={"family": info.family.name, "tokens": report["input"]["tokens"],
                         "width": traces[0].input.shape[-1] if traces else None, "vocab": info.vocab_size})


def track_checkpoints(points: Sequence[Point], request: RunRequest, analysis: Analysis) -> Iterator[dict]:
    """The records of the checkpoints, in step order, one at a time (each one ticked: progress.tick)."""
    previous, previous_record = None, None
    for done, point in enumerate(points):
        tick("tracking", done, len(points))
        current = Checkpoint(point.path)
        previous_record = checkpoint_record(point, request, analysis, current, previous, previous_record)
        yield previous_record
        previous = current


def _checkpoint_records(request: TrackRequest, sources: Sequence, steps) -> list[dict]:
    points = order(expand(list(sources)), steps)
    return list(track_checkpoints(points, request.run, Analysis(checks=True, grad=request.grad)))


def _compared(run: Iterable[dict], reference: Iterable[dict], name) -> dict:
    """The run against its reference, refused when they are runs of different models or share no step."""
    comparison = compared_runs(run, reference, name)
    if not comparison["matched"]:
        raise InputError(f"--against {name}: no step in common with the run (the run's steps "
                         f"{_span(comparison['run_only'])}, the reference's {_span(comparison['reference_only'])}): "
                         "record both at the same steps")
    return comparison


def _span(steps: list[int]) -> str:
    return f"{steps[0]}–{steps[-1]}"


def _against_timeline(run_path, reference_path) -> dict:
    """The run's timeline against the reference's, each streamed in step order so that memory does not grow with
    either; a file written out of order is read whole and sorted (read_timeline), the comparison made again."""
    unordered: set = set()
    while True:
        run, reference = (read_timeline(path) if path in unordered else stream_timeline(path)
                          for path in (run_path, reference_path))
        try:
            return _compared(run, reference, reference_path)
        except NotInStepOrder as error:
            unordered.add(error.args[0])


def _against(request: TrackRequest, records: Optional[list[dict]]) -> dict:
    """The run beside the healthy run --against names: a timeline when the run is one, else checkpoints traced on
    the same input (`records`, the run's, few)."""
    path = request.against
    if request.timeline != is_timeline(path):
        raise UsageError(f"--against {path}: compare like with like — a timeline against a timeline, checkpoints "
                         "against checkpoints (traced on the same input)")
    if request.timeline:
        return _against_timeline(request.sources[0], path)
    reference = _checkpoint_records(request, (path,), None)
    if not reference:
        raise InputError(f"--against {path} holds no checkpoint")
    return _compared(records, reference, path)


def track_request(request: TrackRequest) -> tuple[dict, list[int]]:
    """`track`'s report — the records judged over training, each one's new findings and training-log numbers, the
    first and last sign of trouble at request.fail_on, the step to roll back to, the run beside a healthy one — and
    the numbers of the timeline's lines cut short (left out, for the caller to say). A timeline is streamed: the
    report keeps a bounded selection of its records (training/thinning.py) and says so when it left some out."""
    log = read_log(request.log) if request.log is not None else None  # a bad log fails before any checkpoint
    torn: list[int] = []
    records = None if request.timeline else _checkpoint_records(request, request.sources, request.steps)
    if request.timeline:
        story = in_step_order(request.sources[0], torn, lambda read: Story(request.fail_on, log).told(read))
    else:
        story = Story(request.fail_on, log).told(records)
    comparison = _against(request, records) if request.against is not None else None
    thinning = story.thinning()
    report = {"schema": SCHEMA_VERSION, "kind": ReportKind.TRACK.value, "records": story.kept.items(),
              "first_sign": story.first, "last_flags": last_sign([story.last], request.fail_on),
              "rollback": story.rollback, **({"against": comparison} if comparison is not None else {}),
              **({"thinning": thinning} if thinning is not None else {})}
    return report, torn
