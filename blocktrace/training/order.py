"""Whether the data comes in the same order again: each training step's batch as two numbers, compared with every
step before it.

A DistributedSampler shuffles with its seed and the epoch it is told (`sampler.set_epoch(epoch)`); never told, it
gives every epoch the first epoch's order. That shows as a period: from some step on, each batch equals the batch one
period (the epoch's length) before it. One batch met again proves nothing (a small corpus, random windows): a whole
run of consecutive steps at one period does.

The numbers are taken at every step (two sums over the ids, on their device; no host sync), kept on the device until
the next record, and read on the host with it (tracing.assembly.finish's one copy).
"""

from __future__ import annotations

from typing import Optional

import torch

# Consecutive steps, each equal to the step one period before, that make a repeated order (or the whole period,
# when it is shorter): a chance repeat of this many in a row, at one period, is not what a shuffled loader gives.
ORDER_RUN = 8
REMEMBERED_STEPS = 1 << 20  # steps whose batch is remembered: the longest epoch it can tell (16 MiB of host memory)


def batch_key(ids: torch.Tensor) -> torch.Tensor:
    """Two sums of a [batch, T] id tensor, plain and weighted by position (so that a reordering shows), as int64
    on its device."""
    ids = ids.detach().long()
    positions = torch.arange(1, ids.shape[-1] + 1, device=ids.device)
    return torch.stack([ids.sum(), (ids * positions).sum()])


class DataOrder:
    """The steps' batch keys (device tensors until the next record), the host's memory of every step's key, and
    the repeated order found so far."""

    def __init__(self):
        self.pending: list[tuple[int, torch.Tensor]] = []  # (step, key) since the last record
        self.first_step_of: dict[tuple[int, int], int] = {}
        self.period: Optional[int] = None  # the period of the current run of repeats
        self.run = 0  # its length so far
        self.last_step: Optional[int] = None
        self.found: Optional[dict] = None

    def see(self, step: int, ids: torch.Tensor) -> None:
        """The first training forward of `step` was given these ids."""
        if not self.pending or self.pending[-1][0] != step:
            self.pending.append((step, batch_key(ids)))

    def take(self) -> Optional[dict]:
        """The keys since the last record, as device tensors, for the record's one copy to the host."""
        taken, self.pending = self.pending, []
        return {"steps": [step for step, _ in taken], "keys": torch.stack([key for _, key in taken])} if taken else None

    def report(self, taken: Optional[dict]) -> Optional[dict]:
        """The keys of `take`, read on the host: the repeated order found (its period and the step it starts at),
        or None."""
        for step, key in zip(taken["steps"], taken["keys"]) if taken else ():
            self._add(step, (int(key[0]), int(key[1])))
        return self.found

    def _add(self, step: int, key: tuple[int, int]) -> None:
        before = self.first_step_of.get(key)
        period = step - before if before is not None else None
        continued = period is not None and period == self.period and self.last_step == step - 1
        self.period, self.run = period, (self.run + 1 if continued else (1 if period is not None else 0))
        self.last_step = step
        if period is not None and period > 1 and self.run >= min(ORDER_RUN, period) and self.found is None:
            self.found = {"period": period, "since": step - self.run + 1}
        if before is None and len(self.first_step_of) < REMEMBERED_STEPS:
            self.first_step_of[key] = step
