"""`track` over checkpoints: each checkpoint, in step order, through the whole-model check of `check --weights`
(every layer read and traced one at a time, the model's own loss, its gradients with --grad), and how far each
layer's weights moved since the previous checkpoint (‖ΔW‖/‖W‖ per tensor kind, streamed tensor by tensor: memory
does not grow with the number of checkpoints). Each checkpoint becomes one timeline record (training/timeline.py),
the same records a Watch writes, so everything after — the findings first raised, the first sign of trouble, a
training log's numbers — works on both (training/track.py)."""

from __future__ import annotations

import dataclasses
import math
from typing import Iterator, Optional, Sequence

import torch

from blocktrace.diagnose.weights import Movement, tensor_kind
from blocktrace.errors import InputError
from blocktrace.pipeline.model import check_model_request
from blocktrace.request import Analysis, RunRequest
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import model_info
from blocktrace.training.timeline import flag_entries, layer_entry, record
from blocktrace.training.track import Point


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


def checkpoint_record(point: Point, request: RunRequest, analysis: Analysis, current, before) -> dict:
    """One checkpoint as a timeline record: the whole-model check, and its weights against the previous one's.
    `current` and `before` are open Checkpoints (before: None at the first), each opened once for the whole track."""
    info = model_info(current)
    if before is not None:
        _same_model(point, current, info, before)
    report, traces, _ = check_model_request(dataclasses.replace(request, weights=point.path, training_step=point.step),
                                            analysis, checkpoint=current)
    moved = weight_movement(current, before, info.layer_prefix(0)[:-2], info.n_layers, info.family.ignored)
    grads = _block_grad_norms(report, len(traces))
    layers = [layer_entry(i, trace, grads[i], moved[i]) for i, trace in enumerate(traces)]
    return record(point.step, "checkpoint", layers, flag_entries(report.get("flags") or []),
                  report.get("diagnosis") or [],
                  loss=report.get("loss"), path=str(point.path),
                  extra={"family": info.family.name, "tokens": report["input"]["tokens"],
                         "width": traces[0].input.shape[-1] if traces else None, "vocab": info.vocab_size})


def track_checkpoints(points: Sequence[Point], request: RunRequest, analysis: Analysis) -> Iterator[dict]:
    """The records of the checkpoints, in step order, one at a time (for a progress bar)."""
    previous = None
    for point in points:
        current = Checkpoint(point.path)
        yield checkpoint_record(point, request, analysis, current, previous)
        previous = current
