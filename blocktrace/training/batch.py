"""What the Watch sees of a recording forward's batch: its ids, its targets (however the forward takes them), its
logits' vocabulary, and what they say together (a batch repeated, targets equal to the inputs, how they are shifted)."""

from __future__ import annotations

import inspect
from typing import Optional

import torch
from torch import nn

from blocktrace.training.forward_call import ForwardCall, logits_of
from blocktrace.vocab import IGNORE_INDEX


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


# the names a forward gives its targets (nanoGPT's targets, HF's labels, a tutorial's y)
TARGET_NAMES = frozenset({"targets", "target", "labels", "label", "y", "tgt", "next_tokens"})


def targets_position(model: nn.Module) -> Optional[int]:
    """Where the forward takes its targets positionally (None: nowhere known). A second integer argument is a
    target only where the forward names it one: HF's forward(input_ids, attention_mask, …) takes a mask there."""
    try:
        parameters = [p for p in inspect.signature(model.forward).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    return next((i for i, p in enumerate(parameters) if p.name in TARGET_NAMES), None)


def shifts_labels(model: nn.Module) -> bool:
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
        self.logits_node = None  # the autograd node that made the logits: what the loss's graph reads them from
        self.call: Optional[ForwardCall] = None  # how the training forward was called
        self.inputs: dict = {}  # the forward's position ids and attention mask, as device facts (loop.input_evidence)
        self.kept: Optional[torch.Tensor] = None  # the positions its attention mask keeps, if it has one
        self.vocab: Optional[int] = None
        self.decoded = False  # the forward was given decoder inputs (an encoder-decoder)

    def see(self, args, kwargs, output) -> None:
        if self.ids is not None:
            return  # the first forward of the step is the training batch
        ids = input_ids(args, kwargs)
        if ids is None:
            return  # ids the model takes some other way (a list it converts itself): no batch seen beside them
        self.ids = ids.detach()
        self.call = ForwardCall(tuple(args), dict(kwargs), ids)  # the probe calls the model as training did
        # an encoder-decoder's logits are the decoder's positions, not the ids': no target is set beside the ids
        self.decoded = any(name.startswith("decoder_") for name in kwargs)
        self.kept = kept_positions(self.ids, kwargs)
        self.inputs = input_evidence(self.ids, kwargs, self.kept)
        labels = next((kwargs[name] for name in TARGET_NAMES if isinstance(kwargs.get(name), torch.Tensor)), None)
        positional = args[self.targets_at] if self.targets_at is not None and self.targets_at < len(args) else None
        self.targets = labels if labels is not None else (positional if isinstance(positional, torch.Tensor) else None)
        if self.targets is not None and self.targets.shape != self.ids.shape:
            self.targets = None  # not a target per position (a class per sequence): nothing to set beside the ids
        logits = logits_of(output)
        if logits is not None and logits.is_floating_point():
            self.logits, self.vocab, self.logits_node = logits.detach(), int(logits.shape[-1]), logits.grad_fn

    def report(self, trained: bool = True, from_gradient: Optional[tuple] = None) -> Optional[dict]:
        """What the batch seen says, as device values (None when no ids were seen): whether it repeats the last
        trained batch, whether its targets equal its inputs, how they match them at each shift, the share of
        targets counted; then forget it. A batch whose output no backward reached (a forward with gradients that
        was not trained on) is not remembered as the last trained batch. Where the forward was given no targets,
        `from_gradient` (training/logit_gradient.gradient_targets) gives the ones the loss used at the logits'
        positions, with the share of rows that name one (`hard_rows`: the checks judge them only where it is
        whole) and the share with any logit pulled up (`pulled_rows`)."""
        if self.ids is None:
            return None
        targets, shifts_inside = self.targets, self.shifts_labels
        found = {"repeated": same_ids(self.previous, self.ids) if trained else None,
                 "labels_are_inputs": not self.shifts_labels and same_ids(self.targets, self.ids),
                 "language_model": self.ids.max() < self.vocab if self.vocab is not None and self.ids.numel() else None}
        if targets is None and from_gradient is not None and from_gradient[0].shape == self.ids.shape \
                and not self.decoded:
            targets, shifts_inside = from_gradient[0], False  # at the logits' own positions: no shift inside
            found["hard_rows"], found["pulled_rows"] = from_gradient[1], from_gradient[2]
        found["shifts_inside"] = shifts_inside
        if targets is not None:
            found.update(target_match(self.ids, targets))
            if self.kept is not None:
                found["padding_counted"] = padding_counted(targets, self.kept, shifts_inside)
            found.update(trailing_padding(self.ids, targets, shifts_inside), rows=int(self.ids.shape[0]))
        found.update(self.inputs)
        if trained:  # a copy: a loop that refills one buffer in place would otherwise compare the batch with itself
            self.previous = self.ids.clone()
        self.ids, self.targets, self.logits, self.call, self.inputs, self.kept = None, None, None, None, {}, None
        self.logits_node = None
        return found


def with_order(data: Optional[dict], repeats: Optional[dict], repetition: Optional[dict] = None,
               coverage: Optional[dict] = None) -> Optional[dict]:
    """The batch's report with the repeated order found, the sequences trained on against the distinct ones
    (training/order.py) and the evaluated tokens against the ids trained on (training/coverage.py), where there
    are."""
    extra = {**({"order_repeats": repeats} if repeats is not None else {}),
             **({"repetition": repetition} if repetition is not None else {}),
             **({"coverage": coverage} if coverage is not None else {})}
    return {**(data or {}), **extra} if extra else data


def input_ids(args, kwargs) -> Optional[torch.Tensor]:
    """A forward's token ids: its input_ids, else its first [batch, T] integer tensor (None: none such)."""
    tensors = [*args, *kwargs.values()]
    integers = [t for t in tensors if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.dim() == 2]
    ids = kwargs.get("input_ids", integers[0] if integers else None)
    return ids if isinstance(ids, torch.Tensor) and ids.dim() == 2 and not ids.is_floating_point() else None


def same_ids(a: Optional[torch.Tensor], b: torch.Tensor):
    """Whether two id tensors are equal: False, or a device boolean (torch.equal would wait for the device)."""
    if a is None or a.shape != b.shape or a.device != b.device:
        return False
    return (a == b).all()
