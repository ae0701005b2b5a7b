"""What the loss is against the logits of the forward it came from: whether the outputs are probabilities, what its
autograd graph applies (a log-softmax to a softmax's output, over which axis), and the loss against the range and
the mean of the cross-entropies those logits allow. Device values; the graph is read from its node names, shapes and
saved dims, which outlive the backward."""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F

from blocktrace.vocab import IGNORE_INDEX

CHUNK_ELEMENTS = 1 << 24  # logits cross-entropy is recomputed in chunks of about this many elements (64 MB)


PROBABILITY_TOLERANCE = 1e-3  # |Σ row − 1| of outputs that are probabilities (float32 sums of a softmax: ~1e-6)


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


def _cross_entropy_range(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The smallest and the largest −log p over every row and class of the logits (logsumexp − max and logsumexp −
    min per row), and the mean over rows of each row's largest, in float32, chunk by chunk: a mean cross-entropy
    against distributions over any of these rows lies between the first two, and one of one class per row (hard
    labels at every row) is at most the third."""
    rows = logits.reshape(-1, logits.shape[-1])
    step = max(1, CHUNK_ELEMENTS // rows.shape[-1])
    best, worst, worst_sum = [], [], []
    for chunk in rows.split(step):
        chunk = chunk.float()
        total = torch.logsumexp(chunk, -1)
        row_worst = total - chunk.amin(-1)
        best.append((total - chunk.amax(-1)).amin())
        worst.append(row_worst.amax())
        worst_sum.append(row_worst.sum(dtype=torch.float64))
    return torch.stack(best).amin(), torch.stack(worst).amax(), torch.stack(worst_sum).sum() / max(rows.shape[0], 1)


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
        best, worst, mean_worst = _cross_entropy_range(logits)
        value = loss.detach().double().reshape(())
        found["loss_over_worst_cross_entropy"] = value / worst.double().clamp_min(1e-12)
        found["loss_over_best_cross_entropy"] = value / best.double().clamp_min(1e-12)
        found["loss_over_mean_worst_cross_entropy"] = value / mean_worst.clamp_min(1e-12)
    if targets is not None and loss is not None and targets.shape == logits.shape[:2] and logits.shape[1] > 1:
        best = torch.minimum(_mean_cross_entropy(logits, targets, 0), _mean_cross_entropy(logits, targets, 1))
        found["loss_over_cross_entropy"] = loss.detach().double().reshape(()) / best.double().clamp_min(1e-12)
        found["sequences"], found["positions"] = int(logits.shape[0]), int(logits.shape[1])
    return found
