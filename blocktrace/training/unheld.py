"""The parameters that get a gradient and that no optimizer holds: never updated, whatever the loop does.

The Watch is given one optimizer; a loop may have several (a second one for the embeddings, a GAN's two). Where the
given one lacks parameters that got a gradient, the other torch optimizers alive in the process are found through
Python's garbage collector (one walk over the tracked objects, taken again only when the parameters it lacks change)
and the parameters none of them holds are named. Whether such a parameter sits in a block whose other parameters an
optimizer does hold tells a filter's mistake (a norm's gain left out of the groups by a name list) from whole
modules left out (a fine-tune of the head that leaves the body requiring gradients).
"""

from __future__ import annotations

import gc
from typing import Optional, Sequence

import torch
from torch import nn

NAMED = 3  # parameters named in the record (those the given optimizer lacks, those no optimizer holds)


class Unheld:
    """The ids of the parameters other optimizers hold, found once for a given set of lacking parameters."""

    def __init__(self):
        self.asked: Optional[frozenset] = None
        self.held_elsewhere: set[int] = set()

    def evidence(self, lacking: list[tuple[str, torch.Tensor]], held: set[int], blocks: Sequence[nn.Module],
                 given) -> dict:
        """Of the parameters with a gradient that the given optimizer lacks (name, parameter; it holds the ids in
        `held`): those no optimizer holds (`unheld`, a count, and the first names), and how many blocks hold some of
        them beside parameters an optimizer holds (`partial_blocks`)."""
        asked = frozenset(id(p) for _, p in lacking)
        if asked != self.asked:
            self.asked, self.held_elsewhere = asked, _held_by_other_optimizers(given)
        unheld = [(name, p) for name, p in lacking if id(p) not in self.held_elsewhere]
        if not unheld:
            return {"unheld": 0, "unheld_names": [], "partial_blocks": 0}
        orphans = {id(p) for _, p in unheld}
        partial = sum(1 for block in blocks
                      if any(id(p) in orphans for p in block.parameters())
                      and any(id(p) in held or id(p) in self.held_elsewhere for p in block.parameters()))
        return {"unheld": len(unheld), "unheld_names": [name for name, _ in unheld[:NAMED]],
                "partial_blocks": partial}


def _held_by_other_optimizers(given) -> set[int]:
    """The ids of the tensors every other live torch optimizer holds (the given one and the ones it wraps aside)."""
    inner, mine = given, {id(given)}
    while isinstance(getattr(inner, "optimizer", None), torch.optim.Optimizer):
        inner = inner.optimizer
        mine.add(id(inner))
    others = [candidate for candidate in gc.get_objects()
              if isinstance(candidate, torch.optim.Optimizer) and id(candidate) not in mine]
    # an optimizer that never ran Optimizer.__init__, or whose groups hold no "params", holds nothing we can read
    return {id(p) for candidate in others for group in getattr(candidate, "param_groups", None) or ()
            if isinstance(group, dict) for p in group.get("params", ())}
