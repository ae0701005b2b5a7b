"""The records before the one judged, as the checks over training read them — kept in bounded memory, so that
judging a run is linear in its records (a Watch at every=10 over 10⁶ steps holds 10⁵).

The checks read the first record (where trends start), the last few (the loss-spike window and the record
before), and one statistic over all of them (the largest learning rate recorded before). A Watch and `track`
over its timeline keep the same History, so both reach the same findings.
"""

from __future__ import annotations

import collections
import math
from typing import Optional, Sequence

HISTORY = 17  # records kept for the dynamics: the loss-spike window (16 before) and the record before


class History(Sequence):
    """The first record, the last HISTORY, and the largest finite learning rate over every record added."""

    def __init__(self, keep: int = HISTORY):
        self.first: Optional[dict] = None
        self.recent: collections.deque = collections.deque(maxlen=keep)
        self.largest_lr: Optional[float] = None
        self.lr_count = 0  # records with a finite learning rate
        self.size = 0  # records held (the first and the recent): len() is asked dozens of times per record judged

    def add(self, record: dict) -> None:
        if self.first is None:
            self.first = record
        else:
            self.recent.append(record)
        self.size = 1 + len(self.recent)
        lr = record.get("lr")
        if isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr):
            self.lr_count += 1
            self.largest_lr = lr if self.largest_lr is None else max(self.largest_lr, lr)

    def _records(self) -> list[dict]:
        return ([self.first] if self.first is not None else []) + list(self.recent)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._records()[index]
        # one record, without building the list: the checks read history[-1] and history[0] at every record
        position = index + self.size if index < 0 else index
        if not 0 <= position < self.size:
            raise IndexError("History index out of range")
        return self.first if position == 0 else self.recent[position - 1]


def learning_rates_before(history: Sequence[dict]) -> tuple[int, Optional[float]]:
    """(how many records before hold a finite learning rate, the largest of them), over every record a History
    has seen (a plain list: over its records)."""
    if isinstance(history, History):
        return history.lr_count, history.largest_lr
    rates = [r["lr"] for r in history if isinstance(r.get("lr"), (int, float)) and not isinstance(r.get("lr"), bool)
             and math.isfinite(r["lr"])]
    return len(rates), (max(rates) if rates else None)
