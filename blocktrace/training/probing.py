"""The causal probe at a record step, as the Watch runs it: on the recorded batch's first sequence, on every
rank's own copy under DDP (the unwrapped module: no collective inside), its largest leak and its failures gathered
to rank 0. Not under FSDP2, whose forward gathers shards: a rank whose probe failed would leave the others waiting,
and a forward between backward() and optimizer.step() changes what FSDP2 trains. A failure is kept as a note: the
probe never stops training."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from blocktrace.phrases import phrase
from blocktrace.training.batch import Batch
from blocktrace.training.blocks import sharded, unwrap
from blocktrace.training.distributed import Reducer
from blocktrace.training.loop import causal_model, probe_causality


def causal_probe(model: nn.Module, batch: Batch, reducer: Reducer, device: torch.device) -> Optional[dict]:
    """The probe's finding for the record's "probe" (None: no batch seen, one process)."""
    if sharded(model):
        return {"note": phrase("causal probe not run under FSDP2: a forward between backward() and "
                               "optimizer.step() changes what FSDP2 trains (docs/track.md)")}
    seen = batch.ids is not None and batch.vocab is not None
    found, leak, note = {"causal_model": causal_model(unwrap(model))}, None, None
    if seen:
        try:
            leak = probe_causality(unwrap(model), batch.call, batch.ids, batch.vocab)
        except Exception as error:  # the model may want more than its ids: say so, and go on
            note = f"causal probe not run: {type(error).__name__}: {error}"[:200]
    if reducer.active:  # every rank reaches these collectives, whatever its probe did
        return {**found, **_across_ranks(reducer, leak, note, seen, device)}
    if not seen:
        return None
    return {**found, **(leak or {}), **({"note": note} if note else {})}


def _across_ranks(reducer: Reducer, leak: Optional[dict], note: Optional[str], seen: bool,
                  device: torch.device) -> dict:
    """The largest leak over the ranks, and how many ranks could not run the probe (said by rank 0)."""
    value = leak["future_leak"].double().to(device) if leak else torch.full((), -1.0, dtype=torch.float64,
                                                                              device=device)
    failed = reducer.summed(torch.tensor(0.0 if leak or not seen else 1.0, dtype=torch.float64, device=device))
    largest = reducer.largest(value)
    result = {"future_leak": torch.where(largest >= 0, largest, torch.full_like(largest, float("nan"))),
              "leak_position": leak["leak_position"] if leak else None, "ranks_failed": failed}
    if note:
        result["note"] = note  # rank 0's own; ranks_failed counts every rank's
    return result
