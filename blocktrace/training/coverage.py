"""Whether the batches the loop evaluates on are drawn from what it trains on: the share of their tokens whose id the
training batches never held, against the share a sample of the training data itself would leave unseen.

Every training forward adds its ids to a count per id (an index_add on the ids' device: no host sync); every forward
the loop makes without gradients (an evaluation; the Watch's own probes are left out) adds how many of its tokens have
a count of 0. By Good's estimate (Good 1953, from Turing), the probability mass of the ids a sample has not yet met is
the share of the sample's tokens whose id it met exactly once (N1/N): a held-out batch drawn from the training data's
distribution leaves that share of its tokens unseen. A held-out stream encoded otherwise than the training one — a
byte-level tokenizer's visible form of the text trained on and the text itself evaluated, another tokenizer's ids,
an offset vocabulary — leaves far more. Read on the host with the record's one copy.
"""

from __future__ import annotations

from typing import Optional

import torch


class IdCoverage:
    """Training ids counted per id; evaluated tokens counted, and those whose id no training batch held, since the
    last record. `vocabulary` is the model's input embedding's size (None: nothing is counted)."""

    def __init__(self, vocabulary: Optional[int]):
        self.vocabulary = vocabulary
        self.counts: Optional[torch.Tensor] = None
        self.evaluated_tokens: Optional[torch.Tensor] = None
        self.evaluated_unseen: Optional[torch.Tensor] = None

    def _index(self, ids: torch.Tensor) -> torch.Tensor:
        # ids past the table would fail the model's own lookup; clamped so that a stray one cannot fail here
        return ids.detach().reshape(-1).long().clamp(0, self.vocabulary - 1)

    def trained(self, ids: torch.Tensor) -> None:
        if not self.vocabulary:
            return
        index = self._index(ids)
        if self.counts is None or self.counts.device != index.device:
            self.counts = torch.zeros(self.vocabulary, dtype=torch.int64, device=index.device)
        self.counts.index_add_(0, index, torch.ones_like(index))

    def evaluated(self, ids: torch.Tensor) -> None:
        """A forward without gradients, after some training batch was seen."""
        if self.counts is None:
            return
        index = self._index(ids).to(self.counts.device)
        unseen = (self.counts[index] == 0).sum()
        tokens = torch.full((), index.numel(), dtype=torch.int64, device=index.device)
        self.evaluated_unseen = unseen if self.evaluated_unseen is None else self.evaluated_unseen + unseen
        self.evaluated_tokens = tokens if self.evaluated_tokens is None else self.evaluated_tokens + tokens

    def take(self) -> Optional[dict]:
        """Device values for the record — the training tokens, those whose id came once (Good's N1), and the
        evaluated tokens since the last record with those unseen in training — then the evaluation counts start
        again. None before any evaluated token."""
        if self.evaluated_tokens is None:
            return None
        found = {"trained_tokens": self.counts.sum(), "trained_once": (self.counts == 1).sum(),
                 "evaluated_tokens": self.evaluated_tokens, "evaluated_unseen": self.evaluated_unseen}
        self.evaluated_tokens = self.evaluated_unseen = None
        return found
