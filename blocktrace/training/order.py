"""Whether the data comes in the same order again, and how often each sequence comes back: each training step's
batch, and each of its sequences, as two numbers, compared with every step before it.

A DistributedSampler shuffles with its seed and the epoch it is told (`sampler.set_epoch(epoch)`); never told, it
gives every epoch the first epoch's order. That shows as a period: from some step on, each batch equals the batch one
period (the epoch's length) before it. One batch met again proves nothing (a small corpus, random windows): a whole
run of consecutive steps at one period does.

Each sequence is keyed the same way: the number of sequences trained on over the number of distinct ones is how many
times the data has been repeated, an epoch count that needs no dataset length (diagnose/invariants.py:
`data_repeated_past_use`).

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
REMEMBERED_SEQUENCES = 1 << 22  # distinct sequences remembered (~500 MiB of host memory at most); past it, no count


def batch_key(ids: torch.Tensor) -> torch.Tensor:
    """Two sums of a [batch, T] id tensor, plain and weighted by position (so that a reordering shows), as int64
    on its device."""
    return sequence_keys(ids).sum(0)


def sequence_keys(ids: torch.Tensor) -> torch.Tensor:
    """Each sequence's two sums, plain and weighted by position, as a [batch, 2] int64 tensor on its device."""
    ids = ids.detach().long().reshape(-1, ids.shape[-1])
    positions = torch.arange(1, ids.shape[-1] + 1, device=ids.device)
    return torch.stack([ids.sum(-1), (ids * positions).sum(-1)], dim=-1)


class DataOrder:
    """The steps' batch keys (device tensors until the next record), the host's memory of every step's key, and
    the repeated order found so far."""

    def __init__(self):
        self.pending: list[tuple[int, torch.Tensor]] = []  # (step, [batch, 2] sequence keys) since the last record
        self.first_step_of: dict[tuple[int, int], int] = {}
        self.period: Optional[int] = None  # the period of the current run of repeats
        self.run = 0  # its length so far
        self.last_step: Optional[int] = None
        self.found: Optional[dict] = None
        self.sequences = 0  # sequences trained on (the first forward of each step)
        self.distinct: set[tuple[int, int]] = set()  # their keys, up to REMEMBERED_SEQUENCES

    def see(self, step: int, ids: torch.Tensor) -> None:
        """The first training forward of `step` was given these ids."""
        if not self.pending or self.pending[-1][0] != step:
            self.pending.append((step, sequence_keys(ids)))

    def take(self) -> Optional[dict]:
        """The keys since the last record, as device tensors, for the record's one copy to the host."""
        taken, self.pending = self.pending, []
        if not taken:
            return None
        return {"steps": [step for step, _ in taken], "keys": torch.stack([keys.sum(0) for _, keys in taken]),
                "sequences": torch.cat([keys for _, keys in taken])}

    def report(self, taken: Optional[dict]) -> Optional[dict]:
        """The keys of `take`, read on the host: the repeated order found (its period and the step it starts at),
        or None."""
        for step, key in zip(taken["steps"], taken["keys"]) if taken else ():
            self._add(step, (int(key[0]), int(key[1])))
        self._count(taken["sequences"] if taken else [])
        return self.found

    def repetition(self) -> Optional[dict]:
        """Sequences trained on and how many of them were distinct, since the Watch began (None: none seen, or more
        distinct ones than are remembered)."""
        if not self.sequences or len(self.distinct) >= REMEMBERED_SEQUENCES:
            return None
        return {"sequences": self.sequences, "distinct": len(self.distinct)}

    def _count(self, sequences) -> None:
        for key in sequences:
            self.sequences += 1
            if len(self.distinct) < REMEMBERED_SEQUENCES:
                self.distinct.add((int(key[0]), int(key[1])))

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
