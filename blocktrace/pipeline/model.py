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

from blocktrace.phrases import phrase
from blocktrace.config import BlockConfig
from blocktrace.diagnose.diagnosis import Context, conclude
from blocktrace.diagnose.grad import layerwise_gradient_report
from blocktrace.diagnose.health import ModelEvidence, evaluate
from blocktrace.diagnose.loss import LossReport, cross_entropy, loss_report, mask_for_mlm, next_token_labels, no_loss
from blocktrace.diagnose.weights import weight_statistics
from blocktrace.errors import UsageError
from blocktrace.pipeline.guard import memory_guard
from blocktrace.pipeline.report import Traced, model_report
from blocktrace.progress import tick
from blocktrace.request import Analysis, RunRequest
from blocktrace.sizing import Shape
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import SIZE_FIELDS, checkpoint_config, model_info
from blocktrace.sources.families.base import HeadSpec, LossKind, ModelInfo, NoLoss
from blocktrace.sources.loader import check_layer_index, embed_batch, load_block, load_head
from blocktrace.sources.source import resolve_device, token_batch, token_sequences, torch_dtype
from blocktrace.sources.tokenizer import mask_token, token_labels
from blocktrace.sources.training_step import step_named
from blocktrace.tracing.tracer import trace
from blocktrace.training.timeline import compare_logits


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


@dataclass
class OpenedModel:
    """A checkpoint opened as a whole model: what every stage of a check reads, passed as one value."""
    checkpoint: Checkpoint
    info: ModelInfo
    config: BlockConfig
    request: RunRequest
    dtype: torch.dtype
    device: torch.device

    def load(self, layer: int, mask: Optional[torch.Tensor]) -> torch.nn.Module:
        """One layer on the device, with the request's attention chunking and the input's padding mask."""
        block = load_block(self.checkpoint, self.info, layer, self.config, self.dtype).to(self.device)
        block.attend_with(mask, self.request.attn_chunk)
        return block


@dataclass
class Head:
    """The model's output head: its module and spec, or why there is none (a bare encoder, a layout without one)."""
    module: Optional[torch.nn.Module]
    spec: Optional[HeadSpec]
    reason: Optional[str] = None

    @classmethod
    def of(cls, checkpoint, info, dtype) -> "Head":
        try:
            return cls(*load_head(checkpoint, info, dtype))
        except NoLoss as reason:
            return cls.none(reason)

    @classmethod
    def none(cls, reason) -> "Head":
        return cls(None, None, str(reason))


def _model_input(checkpoint, info, request: RunRequest, head_spec: Optional[HeadSpec]) -> ModelInput:
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
            raise NoLoss(phrase("BERT's masked-LM loss needs the [MASK] token of a tokenizer.json beside the weights"))
        model_input.ids, model_input.labels = mask_for_mlm(ids, mask, mask_id, special)
        model_input.notes.append(f"masked-LM loss: {int((model_input.labels >= 0).sum())} positions (15% of the "
                                 "real tokens, from a fixed seed) replaced by [MASK] and predicted")
    else:
        model_input.labels = next_token_labels(ids, mask)
    return model_input


def _input_and_head(model: OpenedModel) -> tuple[ModelInput, Head]:
    """The input, labelled for the head's loss; without a loss (NoLoss while labelling) the head is set aside."""
    head = Head.of(model.checkpoint, model.info, model.dtype)
    try:
        return _model_input(model.checkpoint, model.info, model.request, head.spec), head
    except NoLoss as reason:
        return _model_input(model.checkpoint, model.info, model.request, None), Head.none(reason)


def _embed(model: OpenedModel, model_input: ModelInput) -> torch.Tensor:
    return embed_batch(model.checkpoint, model.info, model_input.ids.tolist(), model.dtype,
                       model_input.token_types).to(model.device)


@dataclass
class Layers:
    """What the forward through every layer leaves: the traced layers' traces and weight statistics, the output,
    and (for a layer-by-layer backward) each layer's input."""
    traces: list
    weights: list
    output: torch.Tensor
    inputs: Optional[list]


def _padding_mask(model: OpenedModel, model_input: ModelInput) -> Optional[torch.Tensor]:
    return None if model_input.token_mask is None else model_input.token_mask.to(model.device)


def _trace_layers(model: OpenedModel, x: torch.Tensor, model_input: ModelInput, traced: range, analysis: Analysis,
                  keep_inputs: bool) -> Layers:
    """Every layer in turn, one in memory at a time; the traced ones with every statistic and check."""
    n_layers, mask = model.info.n_layers, _padding_mask(model, model_input)
    done = Layers([], [], x, [] if keep_inputs else None)
    for layer in range(n_layers):
        tick("layer", layer, n_layers)
        if done.inputs is not None:
            done.inputs.append(x.detach())
        block = model.load(layer, mask)
        if layer in traced:
            result = trace(block, x, checks=analysis.checks, token_mask=mask, attention_map=analysis.attention_map)
            done.traces.append(result)
            done.weights.append(weight_statistics(block, x.shape[-1]))
            x = result.output
        else:
            with torch.no_grad():
                x = block(x)
        del block
    tick("layer", n_layers, n_layers)
    done.output = x
    return done


def _gradients(model: OpenedModel, layers: Layers, model_input: ModelInput, head: Head):
    n_layers, mask = model.info.n_layers, _padding_mask(model, model_input)
    labels, output_head = model_input.labels.to(model.device), head.module.to(model.device)

    def load(layer: int):
        tick("gradient of layer", n_layers - layer, n_layers)
        return model.load(layer, mask)

    return layerwise_gradient_report(load, layers.inputs, layers.output,
                                     lambda x: cross_entropy(output_head(x), labels), loss_kind=head.spec.kind.value)


def check_model_request(request: RunRequest, analysis: Analysis, checkpoint=None,
                        before: Optional[dict] = None) -> Traced:
    """`check --weights`: the model's layers (all by default), its loss, gradients with --grad.
    `checkpoint`: request.weights already open (track reads each checkpoint once); `before`: the timeline record of
    the checkpoint before it (track), whose attention logits the logit checks judge growth against."""
    given = request.inputs.given()
    if len(given) != 1 or not given[0].through_checkpoint:
        raise UsageError("checking a checkpoint takes its input as token ids: one of --token-ids, --token-ids-file, "
                         "--text or --text-file")
    checkpoint = checkpoint if checkpoint is not None else Checkpoint(request.weights)
    with checkpoint.reading_ahead():  # every layer will be read: the kernel reads the files ahead of them
        return _checked(_opened(checkpoint, request), analysis, before)


def _opened(checkpoint: Checkpoint, request: RunRequest) -> OpenedModel:
    info = model_info(checkpoint)
    overrides = {key: value for key, value in request.config_fields.items() if key in request.explicit}
    config = checkpoint_config(checkpoint, info, {k: v for k, v in overrides.items() if k in SIZE_FIELDS})
    return OpenedModel(checkpoint, info, config, request, torch_dtype(request.dtype), resolve_device(request.device))


def _checked(model: OpenedModel, analysis: Analysis, before: Optional[dict]) -> Traced:
    checkpoint, info, config, request = model.checkpoint, model.info, model.config, model.request
    traced = _traced_range(request, analysis, info.n_layers)
    model_input, head = _input_and_head(model)
    # One layer in memory at a time, with its gradients under --grad, which also keeps every layer's input.
    fits = memory_guard(request, analysis, 1, kept_streams=info.n_layers + 1 if analysis.grad else 0)
    fits(config, Shape(*model_input.ids.shape))
    with_gradients = analysis.grad and head.module is not None
    layers = _trace_layers(model, _embed(model, model_input), model_input, traced, analysis, with_gradients)
    compare_logits(layers.traces, traced, before)
    loss = _loss(head, layers.output, model_input, model.device)
    grads = _gradients(model, layers, model_input, head) if with_gradients else None
    evidence = ModelEvidence(loss=loss, weights=layers.weights, first_layer=traced.start, n_layers=info.n_layers,
                             stored_dtype=_stored_dtype(checkpoint, info), config=config,
                             step=_training_step(request, checkpoint))
    context = Context(post_norm=config.post_norm, activation=config.ffn.value, step=evidence.step)
    found = conclude(evaluate(layers.traces, grads, evidence), context) if analysis.checks else None
    report = model_report(checkpoint, info, config, layers.traces, model_input, loss, grads, found, evidence,
                          str(request.weights))
    return Traced(report, layers.traces, report["tokens"])


def _training_step(request: RunRequest, checkpoint) -> Optional[int]:
    """The step the user gave (track --steps), else the one stored in the file, else the one in its name."""
    for step in (request.training_step, checkpoint.step):
        if step is not None:
            return step
    return step_named(checkpoint.path)  # the file itself was read already: checkpoint.step


def _loss(head: Head, x: torch.Tensor, model_input: ModelInput, device) -> LossReport:
    if head.module is None:
        return no_loss(head.reason)
    with torch.no_grad():
        logits = head.module.to(device)(x)
    next_token = head.spec.kind is LossKind.NEXT_TOKEN  # which shift it learned: a next-token model's question
    return loss_report(logits, model_input.labels.to(device), head.spec.kind.value,
                       model_input.ids.to(device) if next_token else None, model_input.token_mask)


def _stored_dtype(checkpoint, info) -> str:
    """The dtype the checkpoint's layers are stored in (F16 models overflow beyond ±65504)."""
    prefix = info.layer_prefix(0)
    key = next((k for k in checkpoint.keys if k.startswith(prefix)), None)
    return checkpoint.dtype(key) if key is not None else "F32"
