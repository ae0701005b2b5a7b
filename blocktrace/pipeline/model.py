"""A checkpoint as a whole model: every layer checked in turn, and the model's own loss.

Layers are read one at a time (a layer's tensors, traced, then released), so checking a model
costs about one layer's memory; the traced layers are all of them unless --layer / --layers
narrow it (the others still run, untraced, so the loss is the whole model's). With --grad the
forward also keeps each layer's input, and the backward of the model's own loss runs one layer at
a time from the top (diagnose.grad.layerwise_gradient_report): every step's and every
parameter's gradient, for about one layer's memory more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from blocktrace.diagnose.diagnosis import Context, conclude
from blocktrace.diagnose.grad import layerwise_gradient_report
from blocktrace.diagnose.health import ModelEvidence, evaluate
from blocktrace.diagnose.loss import LossReport, cross_entropy, loss_report, mask_for_mlm, next_token_labels, no_loss
from blocktrace.diagnose.weights import weight_statistics
from blocktrace.errors import UsageError
from blocktrace.pipeline.guard import memory_guard
from blocktrace.pipeline.report import model_report
from blocktrace.progress import tick
from blocktrace.request import Analysis, RunRequest
from blocktrace.sizing import Shape
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import SIZE_FIELDS, checkpoint_config, model_info
from blocktrace.sources.families.base import LossKind, NoLoss
from blocktrace.sources.loader import check_layer_index, embed_batch, load_block, load_head
from blocktrace.sources.source import resolve_device, token_batch, token_sequences, torch_dtype
from blocktrace.sources.tokenizer import mask_token, token_labels
from blocktrace.sources.training_step import step_named
from blocktrace.tracing.tracer import trace


@dataclass
class ModelInput:
    ids: torch.Tensor  # [B, T] what the model reads (BERT: with [MASK] at the masked positions)
    labels: Optional[torch.Tensor]  # [B, T] what it should predict (-100: nothing)
    token_mask: Optional[torch.Tensor]  # [B, T] False at padding
    labels_text: list[str]
    notes: list[str] = field(default_factory=list)
    token_types: Optional[list[list[int]]] = None  # [B, T] segment ids (BERT), padded with 0; None: none given


def _traced_range(request: RunRequest, analysis: Analysis, n_layers: int) -> range:
    """Every layer by default; --layer K alone: that layer; --layer K --layers N: N layers from K (from 0 without
    --layer)."""
    first = request.first_layer
    check_layer_index(first, n_layers)
    if analysis.stacked:
        count = analysis.depths[0]
        if first + count > n_layers:
            raise UsageError(f"--layer {first} with --layers {count} needs layers up to "
                             f"{first + count - 1}, but the checkpoint has {n_layers}: 0–{n_layers - 1}")
        return range(first, first + count)
    return range(first, first + 1) if request.layer is not None else range(n_layers)


def _model_input(checkpoint, info, request: RunRequest, head_spec) -> ModelInput:
    sequences, ids_note = token_sequences(checkpoint.directory, request.inputs, info.n_positions)
    padded, mask, types = token_batch(info, request.inputs, sequences)
    ids = torch.tensor(padded)
    labels_text, label_note = token_labels(checkpoint.directory, sequences[0])
    model_input = ModelInput(ids, None, mask, labels_text, [n for n in (ids_note, label_note) if n], types)
    if head_spec is None:
        return model_input
    if head_spec.kind is LossKind.MASKED:
        mask_id, special = mask_token(checkpoint.directory)
        if mask_id is None:
            raise NoLoss("BERT's masked-LM loss needs the [MASK] token of a tokenizer.json beside the weights")
        model_input.ids, model_input.labels = mask_for_mlm(ids, mask, mask_id, special)
        model_input.notes.append(f"masked-LM loss: {int((model_input.labels >= 0).sum())} positions (15% of the "
                                 "real tokens, from a fixed seed) replaced by [MASK] and predicted")
    else:
        model_input.labels = next_token_labels(ids, mask)
    return model_input


def _embed(checkpoint, info, model_input: ModelInput, dtype) -> torch.Tensor:
    return embed_batch(checkpoint, info, model_input.ids.tolist(), dtype, model_input.token_types)


def _head(checkpoint, info, dtype):
    try:
        return load_head(checkpoint, info, dtype)
    except NoLoss as reason:
        return None, str(reason)


def _load(checkpoint, info, layer: int, config, dtype, device, request: RunRequest, mask):
    """One layer on the device, with the request's attention chunking and the input's padding mask."""
    block = load_block(checkpoint, info, layer, config, dtype).to(device)
    block.attend_with(mask, request.attn_chunk)
    return block


def _trace_layers(checkpoint, info, config, x, model_input: ModelInput, traced: range, request: RunRequest,
                  analysis: Analysis, device, dtype, inputs: Optional[list] = None) -> tuple[list, list, torch.Tensor]:
    """Every layer in turn, one in memory at a time; the traced ones with every statistic and check. `inputs`, when
    given, receives each layer's input (what the layer-by-layer backward recomputes from)."""
    traces, weights = [], []
    mask = None if model_input.token_mask is None else model_input.token_mask.to(device)
    for layer in range(info.n_layers):
        tick("layer", layer, info.n_layers)
        if inputs is not None:
            inputs.append(x.detach())
        block = _load(checkpoint, info, layer, config, dtype, device, request, mask)
        if layer in traced:
            result = trace(block, x, checks=analysis.checks, token_mask=mask, attention_map=analysis.attention_map)
            traces.append(result)
            weights.append(weight_statistics(block))
            x = result.output
        else:
            with torch.no_grad():
                x = block(x)
        del block
    tick("layer", info.n_layers, info.n_layers)
    return traces, weights, x


def _gradients(checkpoint, info, config, inputs: list, output, model_input: ModelInput, head, request: RunRequest,
               device, dtype, kind: str):
    mask = None if model_input.token_mask is None else model_input.token_mask.to(device)
    labels = model_input.labels.to(device)

    def load(layer: int):
        tick("gradient of layer", info.n_layers - layer, info.n_layers)
        return _load(checkpoint, info, layer, config, dtype, device, request, mask)

    return layerwise_gradient_report(load, inputs, output, lambda x: cross_entropy(head(x), labels), loss_kind=kind)


def check_model_request(request: RunRequest, analysis: Analysis, checkpoint=None) -> tuple[dict, list, object]:
    """`check --weights`: the model's layers (all by default), its loss, gradients with --grad.
    `checkpoint`: request.weights already open (track reads each checkpoint once)."""
    given = request.inputs.given()
    if len(given) != 1 or not given[0].through_checkpoint:
        raise UsageError("checking a checkpoint takes its input as token ids: one of --token-ids, --token-ids-file, "
                         "--text or --text-file")
    dtype, device = torch_dtype(request.dtype), resolve_device(request.device)
    checkpoint = checkpoint if checkpoint is not None else Checkpoint(request.weights)
    with checkpoint.reading_ahead():  # every layer will be read: the kernel reads the files ahead of them
        return _checked(checkpoint, request, analysis, dtype, device)


def _checked(checkpoint, request: RunRequest, analysis: Analysis, dtype, device) -> tuple[dict, list, object]:
    info = model_info(checkpoint)
    overrides = {key: value for key, value in request.config_fields.items() if key in request.explicit}
    config = checkpoint_config(checkpoint, info, {k: v for k, v in overrides.items() if k in SIZE_FIELDS})
    traced = _traced_range(request, analysis, info.n_layers)
    head, spec = _head(checkpoint, info, dtype)
    try:
        model_input = _model_input(checkpoint, info, request, spec if head is not None else None)
    except NoLoss as reason:
        head, spec = None, str(reason)
        model_input = _model_input(checkpoint, info, request, None)
    # One layer in memory at a time, with its gradients under --grad, which also keeps every layer's input.
    fits = memory_guard(request, analysis, 1, kept_streams=info.n_layers + 1 if analysis.grad else 0)
    fits(config, Shape(*model_input.ids.shape))
    x0 = _embed(checkpoint, info, model_input, dtype).to(device)
    inputs = [] if analysis.grad and head is not None else None
    traces, weights, x = _trace_layers(checkpoint, info, config, x0, model_input, traced, request, analysis, device,
                                       dtype, inputs)
    loss = _loss(head, spec, x, model_input, device)
    grads = None
    if inputs is not None:
        grads = _gradients(checkpoint, info, config, inputs, x, model_input, head.to(device), request, device,
                           dtype, spec.kind.value)
    evidence = ModelEvidence(loss=loss, weights=weights, first_layer=traced.start, n_layers=info.n_layers,
                             stored_dtype=_stored_dtype(checkpoint, info), config=config,
                             step=_training_step(request, checkpoint))
    context = Context(post_norm=config.post_norm, activation=config.ffn.value, step=evidence.step)
    found = conclude(evaluate(traces, grads, evidence), context) if analysis.checks else None
    report = model_report(checkpoint, info, config, traces, model_input, loss, grads, found, evidence,
                          str(request.weights))
    return report, traces, None


def _training_step(request: RunRequest, checkpoint) -> Optional[int]:
    """The step the user gave (track --steps), else the one stored in the file, else the one in its name."""
    for step in (request.training_step, checkpoint.step):
        if step is not None:
            return step
    return step_named(checkpoint.path)  # the file itself was read already: checkpoint.step


def _loss(head, spec, x: torch.Tensor, model_input: ModelInput, device) -> LossReport:
    if head is None:
        return no_loss(spec)
    with torch.no_grad():
        logits = head.to(device)(x)
    next_token = spec.kind is LossKind.NEXT_TOKEN  # which shift it learned: a next-token model's question
    return loss_report(logits, model_input.labels.to(device), spec.kind.value,
                       model_input.ids.to(device) if next_token else None, model_input.token_mask)


def _stored_dtype(checkpoint, info) -> str:
    """The dtype the checkpoint's layers are stored in (F16 models overflow beyond ±65504)."""
    prefix = info.layer_prefix(0)
    key = next((k for k in checkpoint.keys if k.startswith(prefix)), None)
    return checkpoint.dtype(key) if key is not None else "F32"
