"""The causal probe at a record step, as the Watch runs it: on the recorded batch's first sequence, on every
rank's own copy under DDP (the unwrapped module: no collective inside), its largest leak and its failures gathered
to rank 0. Under FSDP2, whose forward gathers shards (a collective), every rank probes alike, before the recording
step's training forward: a forward between backward() and optimizer.step() changes what FSDP2 trains (an ad-hoc
run with 2 gloo ranks, not kept as a test: the weights three steps later were not the same), one before the training
forward changes nothing (the FSDP2 timeline equals one process's on the whole batch: tests/test_distributed.py). There the ranks first agree
that each can probe (its ids, and the vocabulary of its input embedding), so that none waits alone in the gathers.
A failure is kept as a note: the probe never stops training."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from blocktrace.phrases import phrase
from blocktrace.training.batch import Batch, input_ids
from blocktrace.training.embedding_rows import input_vocabulary
from blocktrace.training.blocks import sharded, unwrap
from blocktrace.training.distributed import Reducer
from blocktrace.training.independence import probe_causality, probe_padding_and_batch
from blocktrace.training.forward_call import ForwardCall
from blocktrace.training.model_facts import causal_model


@dataclass
class ProbeResult:
    """What one rank's probe found: its leak (None: not run), why not, and whether it had a sequence to probe."""
    leak: Optional[dict] = None
    note: Optional[str] = None
    seen: bool = False


def probe(model: nn.Module, call: Optional[ForwardCall], ids: Optional[torch.Tensor],
          vocab: Optional[int]) -> ProbeResult:
    """One rank's probe of `model` called as `call` on the first sequence of `ids`."""
    if ids is None or vocab is None:
        return ProbeResult()
    try:
        return ProbeResult(probe_causality(model, call, ids, vocab), seen=True)
    except Exception as error:  # the model may want more than its ids: say so, and go on
        return ProbeResult(note=f"causal probe not run: {type(error).__name__}: {error}"[:200], seen=True)


def probe_before_forward(model: nn.Module, args: tuple, kwargs: dict, reducer: Reducer,
                         device: torch.device) -> ProbeResult:
    """FSDP2: the probe on the batch about to be trained, before its forward, on every rank alike — or on none, when
    some rank has no ids or no vocabulary (a collective first, so that no rank gathers shards alone)."""
    ids, vocab = input_ids(args, kwargs), input_vocabulary(unwrap(model))
    ready = ids is not None and vocab is not None
    every = reducer.summed(torch.tensor(1.0 if ready else 0.0, dtype=torch.float64, device=device))
    if float(every) < reducer.world_size:  # one host read, at a record step
        return ProbeResult(note=phrase("causal probe not run under FSDP2: a rank had no token ids or no input "
                                       "embedding to probe with"), seen=ready)
    return probe(model, ForwardCall(tuple(args), dict(kwargs), ids), ids, vocab)


def causal_probe(model: nn.Module, batch: Batch, reducer: Reducer, device: torch.device,
                 before: Optional[ProbeResult] = None, called: Optional[nn.Module] = None) -> Optional[dict]:
    """The probe's finding for the record's "probe" (None: no batch seen, one process). Under FSDP2, `before` is
    what probe_before_forward found before the training forward (None: it did not run). `called`: the part of the
    model the loop calls instead of the model (training/entry.py), probed as the loop called it, on its hidden
    states, with the vocabulary of the model's input embedding."""
    found = {"causal_model": causal_model(unwrap(model))}
    if sharded(model):
        done = before if before is not None else ProbeResult(note=phrase(
            "causal probe not run under FSDP2: the recording step's forward was not seen before it ran"))
        return {**found, **_across_ranks(reducer, done.leak, done.note, done.seen, device)}
    vocab = batch.vocab if called is None else input_vocabulary(unwrap(model))
    target = unwrap(model if called is None else called)
    seen = batch.ids is not None and vocab is not None
    done = probe(target, batch.call, batch.ids, vocab) if seen else ProbeResult()
    leak, note = done.leak, done.note
    if reducer.active:  # every rank reaches these collectives, whatever its probe did
        return {**found, **_across_ranks(reducer, leak, note, seen, device)}
    if not seen:
        return None
    others, others_note = _padding_and_batch(target, batch, vocab)
    notes = "; ".join(text for text in (note, others_note) if text)
    return {**found, **(leak or {}), **others, **({"note": notes} if notes else {})}


def _padding_and_batch(model: nn.Module, batch: Batch, vocab: int) -> tuple[dict, Optional[str]]:
    """The padding and batch probes (one process): whether changing the padding a [B, T] attention mask drops, or
    another sequence of the batch, moves a sequence's logits. Not run for an encoder-decoder (its mask is the
    encoder's, its logits the decoder's)."""
    if batch.decoded or batch.call is None:
        return {}, None
    try:
        return probe_padding_and_batch(model, batch.call, batch.ids, batch.kept, vocab), None
    except Exception as error:  # the model may refuse a smaller batch: say so, and go on
        return {}, f"padding and batch probes not run: {type(error).__name__}: {error}"[:200]


def _across_ranks(reducer: Reducer, leak: Optional[dict], note: Optional[str], seen: bool,
                  device: torch.device) -> dict:
    """The largest leak over the ranks, and how many ranks could not run the probe (said by rank 0)."""
    value = leak["future_leak"].double().to(device) if leak else torch.full((), -1.0, dtype=torch.float64,
                                                                              device=device)
    failed = reducer.summed(torch.tensor(0.0 if leak or not seen else 1.0, dtype=torch.float64, device=device))
    largest = reducer.largest(value)
    result = {"future_leak": torch.where(largest >= 0, largest, torch.full_like(largest, float("nan"))),
              "leak_position": leak["leak_position"] if leak else None,
              "nondeterministic": leak.get("nondeterministic") if leak else None, "ranks_failed": failed}
    if note:
        result["note"] = note  # rank 0's own; ranks_failed counts every rank's
    return result
