"""What a report keeps of a long run: a bounded, deterministic selection of its records, so that `track` over 10⁶
records holds a few thousand — while every finding, sign and rollback is judged over all of them (training/track.py).

The selection is every k-th record seen (k = 1 until more than TRACK_POINTS are held; then k doubles, and the
records held that are not a multiple of the new k are dropped), plus every record marked to keep (the ones that
raised a new finding, the first sign's, the rollback point's) and the last one. Up to TRACK_POINTS records nothing
is dropped: a short run's report is every record, as it always was.
"""

from __future__ import annotations

from typing import Generic, Optional, TypeVar

from blocktrace.phrases import phrase

TRACK_POINTS = 2048  # records kept for the tables and charts beyond the marked ones: a chart's width in points
Item = TypeVar("Item")


def how_thinned(every: int) -> str:
    """The selection in words, for the report that was thinned."""
    return phrase("one record in {every} (the interval doubles whenever more than {bound} are held), with the last, "
                  "and every record that raised a new finding, the first sign's and the rollback point's", every=every,
                  bound=TRACK_POINTS)


class Kept(Generic[Item]):
    """A stream's items, thinned to every `every`-th (doubling as needed) plus the ones marked; in stream order."""

    def __init__(self, bound: Optional[int] = None):
        self.bound = TRACK_POINTS if bound is None else bound  # read when made: a test may lower TRACK_POINTS
        self.every = 1
        self.seen = 0
        self.series: dict[int, Item] = {}  # stream index -> item, the indices multiples of `every`
        self.marked: dict[int, Item] = {}
        self.last: Optional[tuple[int, Item]] = None

    def add(self, item: Item, keep: bool = False) -> int:
        """The item seen next (kept whatever the thinning when `keep`); its index in the stream."""
        index, self.seen = self.seen, self.seen + 1
        self.last = (index, item)
        if keep:
            self.marked[index] = item
        if index % self.every == 0:
            self.series[index] = item
            if len(self.series) > self.bound:
                self.every *= 2
                self.series = {i: kept for i, kept in self.series.items() if i % self.every == 0}
        return index

    def keep(self, index: int, item: Item) -> None:
        """An item seen before (its index from add), kept whatever the thinning."""
        self.marked[index] = item

    @property
    def thinned(self) -> bool:
        return self.every > 1

    def items(self) -> list[Item]:
        held = {**self.series, **self.marked, **dict([self.last] if self.last else [])}
        return [held[index] for index in sorted(held)]
