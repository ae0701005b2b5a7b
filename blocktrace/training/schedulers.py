"""The learning-rate schedulers that drive the optimizer the Watch was given, found without being handed to it.

A torch scheduler holds its optimizer (`scheduler.optimizer`); the optimizer holds no reference back. The objects
that refer to the optimizer are asked of Python's garbage collector (`gc.get_referrers`: one walk over the tracked
objects, ~25 ms for 350,000 of them), at a few records only, and only once a torch scheduler has marked the
optimizer's groups (`initial_lr`, which every LRScheduler built from step 0 sets): a loop without one pays nothing.
ReduceLROnPlateau sets no mark and is not sought: it takes the loss by definition. The schedulers found are held
weakly, so a scheduler the loop drops is not kept alive.
"""

from __future__ import annotations

import gc
import math
import weakref
from typing import Optional

from torch.optim.lr_scheduler import LRScheduler

SEARCHES = 3  # records at which the referrers are walked while no scheduler has been found


class Schedulers:
    """The optimizer's torch schedulers, and what each one's step count holds at a record."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.found: list[weakref.ref] = []
        self.searches_left = SEARCHES if optimizer is not None else 0

    def _search(self) -> None:
        if self.found or self.searches_left <= 0 or not _marked_by_a_scheduler(self.optimizer):
            return
        self.searches_left -= 1
        self.found = [weakref.ref(s) for s in gc.get_referrers(self.optimizer)
                      if isinstance(s, LRScheduler) and getattr(s, "optimizer", None) is self.optimizer]

    def evidence(self) -> Optional[list[dict]]:
        """Each live scheduler's class and step count (`last_epoch`) as plain numbers; None where none was found."""
        self._search()
        live = [s for s in (ref() for ref in self.found) if s is not None]
        if not live:
            return None
        return [{"class": type(s).__name__, "last_epoch": _plain(getattr(s, "last_epoch", None))} for s in live]


def _marked_by_a_scheduler(optimizer) -> bool:
    return any("initial_lr" in group for group in getattr(optimizer, "param_groups", ()))


def _plain(value) -> Optional[float]:
    """A step count as a number for the record (a tensor or a numpy scalar read once; anything else: None)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
