"""What happens to the weights between two optimizer steps: in a correct loop, nothing.

The optimizer writes the weights it holds inside its step; between the end of one step and the start of the next,
the loop runs a forward and a backward, which read them. Whatever writes them in that gap is outside the optimizer:
a checkpoint loaded (a resume), an average swapped in and not swapped back, a weight constraint or a hand-written
decay, a pruning mask. A constraint or a decay moves a weight by a fraction of a step (lr·λ·|w| against Adam's ~lr),
and a pruning mask sets weights to exactly 0 and does nothing else; any other change larger than the optimizer's
own last step is weights replaced. How much the change grew each fingerprinted tensor's RMS says whether the
weights were replaced by weights of their kind (an average, a checkpoint, a re-drawn initialisation, a shrink: a
small factor) or scaled up several-fold (a multiplier folded into the live tensor by an export). A replacement that
is exactly a state this run had earlier (the weights after an earlier recorded step's update, or as the Watch's
first step began) is the run gone back in time while its step count, its learning rate and its data went on: a
resume from an older checkpoint.

Measured on a fingerprint: a strided sample of each of the optimizer's few largest plain tensors and of the model's
embedding and head (where loops write between steps, however small those are next to the blocks), taken as every
step begins and as it ends (two small gathers a step), and at each record, so that a change made before a
recorded step is in that step's record. Everything stays on the device, accumulated without a host
read, until the record's one copy.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional

import torch

FINGERPRINTED = 4  # tensors fingerprinted: the optimizer's largest (a reload or a swap writes every tensor)
FINGERPRINT = 256  # elements sampled (strided) from each
KEPT_STATES = 64  # the fingerprints after recorded steps' updates kept to compare a replacement with
NOTHING = -1.0  # "no change seen" on the device


def _chosen(optimizer, always: frozenset, never: frozenset) -> list[torch.Tensor]:
    """The optimizer's largest floating plain tensors and those whose id is in `always` (the embedding and the head:
    where loops write between steps, FGM's perturbation, a tied table re-tied); not those in `never` (written by the
    forward itself), nor a sharded DTensor (sampling it would gather)."""
    held = [p for group in optimizer.param_groups for p in group["params"]
            if p.is_floating_point() and type(p.detach()) is torch.Tensor and p.numel() and id(p) not in never]
    largest = sorted(held, key=lambda p: -p.numel())[:FINGERPRINTED]
    chosen = {id(p): p for p in largest + [p for p in held if id(p) in always]}
    return list(chosen.values())


class BetweenSteps:
    """The weights' fingerprint at each optimizer step's start and end, and what changed them in between."""

    def __init__(self, optimizer, always: frozenset = frozenset(), never: frozenset = frozenset()):
        self.optimizer = optimizer
        # ids of the tensors fingerprinted whatever their size, and of those never fingerprinted (the forward
        # writes them)
        self.always, self.never = always, never
        self.tensors: Optional[list[torch.Tensor]] = None
        self.segments: Optional[torch.Tensor] = None  # each fingerprint element's tensor, by index into self.tensors
        self.step: Optional[int] = None  # the training step whose optimizer.step() runs next (the Watch sets it)
        self.began: Optional[torch.Tensor] = None  # the fingerprint as the last step began
        self.left: Optional[torch.Tensor] = None  # as it ended (or as a record after it saw the weights)
        self.moved: Optional[torch.Tensor] = None  # the largest change the last step made to a sampled weight
        self.kept: OrderedDict[int, torch.Tensor] = OrderedDict()  # state after step r's update → its fingerprint
        self.keep_next = False  # the step about to run follows a record: keep what it leaves
        self._clear()

    def _clear(self) -> None:
        self.changed_at: Optional[torch.Tensor] = None  # the first step since the last record found changed
        self.change = self.step_move = self.found = self.growth = None

    def _fingerprint(self) -> torch.Tensor:
        device = self.tensors[0].device
        parts = [t.detach().reshape(-1)[:: max(1, t.numel() // FINGERPRINT)].to(device, torch.float64)
                 for t in self.tensors]
        if self.segments is None:
            self.segments = torch.cat([torch.full((len(part),), i, device=device) for i, part in enumerate(parts)])
        return torch.cat(parts)

    def _growth(self, now: torch.Tensor) -> torch.Tensor:
        """The largest factor by which a fingerprinted tensor's RMS grew since the last step ended (device)."""
        before = torch.zeros(len(self.tensors), dtype=now.dtype, device=now.device)
        after = before.index_add(0, self.segments, now * now)
        before = before.index_add(0, self.segments, self.left * self.left)
        return (after / before.clamp_min(torch.finfo(now.dtype).tiny)).sqrt().amax()

    @torch.no_grad()
    def step_begins(self) -> None:
        """The optimizer's pre-hook: compare with what the last step left; the first change is kept."""
        if self.step is None:
            return
        if self.tensors is None:
            self.tensors = _chosen(self.optimizer, self.always, self.never)
        if not self.tensors:
            return
        now = self._fingerprint()
        if self.left is None:
            self.kept.setdefault(self.step - 1, now)  # the state the Watch first saw: "after step s − 1"
        else:
            self._compare(now, self.step)
        self.began = now

    @torch.no_grad()
    def record_taken(self, step: int) -> None:
        """At a record (the Watch's step(), after its backward and before its optimizer step): a change since the last
        step ended is seen in this record, not in the next one; the pre-hook then compares with the state seen here,
        so one change is found once."""
        if self.left is None or self.tensors is None:
            return
        now = self._fingerprint()
        self._compare(now, step)
        self.left = now

    def _compare(self, now: torch.Tensor, step: int) -> None:
        change, move = (now - self.left).abs().amax(), self.moved
        zeroed = ((now == self.left) | (now == 0)).all()
        if self.changed_at is None:
            self.changed_at = torch.full((), NOTHING, dtype=torch.float64, device=now.device)
            self.change, self.step_move, self.found = torch.zeros_like(change), torch.zeros_like(move), now
            self.growth = torch.zeros_like(change)
        # the first change that is not a mask's (a mask's are passed over, and one after them is still seen)
        first = (change > 0) & (self.changed_at < 0) & ~zeroed  # on the device: no host read at a step
        self.changed_at = torch.where(first, float(step), self.changed_at)
        self.change = torch.where(first, change, self.change)
        self.step_move = torch.where(first, move, self.step_move)
        self.growth = torch.where(first, self._growth(now), self.growth)
        self.found = torch.where(first, now, self.found)

    @torch.no_grad()
    def step_ends(self) -> None:
        """The optimizer's post-hook: what the step left; kept when the step follows a record."""
        if self.began is None:
            return
        self.left = self._fingerprint()
        self.moved = (self.left - self.began).abs().amax()
        if self.keep_next and self.step is not None:
            self.kept[self.step] = self.left
            while len(self.kept) > KEPT_STATES:
                self.kept.popitem(last=False)
        self.keep_next = False

    def evidence(self) -> Optional[dict]:
        """Device values for the record (None when nothing was compared since the last one); then cleared."""
        if self.changed_at is None:
            return None
        earlier = [(step, state) for step, state in self.kept.items() if state.shape == self.found.shape]
        matches = torch.stack([(state == self.found).all() for _, state in earlier]) if earlier else None
        found = {"changed_at": self.changed_at, "change": self.change, "step_move": self.step_move,
                 "growth": self.growth, "kept": [step for step, _ in earlier], "matches": matches}
        self._clear()
        return found


def settled(found: Optional[dict]) -> Optional[dict]:
    """The record's between-steps fact, read on the host: the first step found changed (None: none), how much, the
    optimizer's own move in the step before, the largest factor a tensor's RMS grew by, and the earlier step whose
    updated weights the change restored."""
    if not found:
        return None
    changed_at = found["changed_at"]
    if changed_at is None or changed_at < 0:
        return {"changed_at": None, "change": 0.0, "step_move": None, "growth": None, "returned_to": None}
    matches = found.get("matches") or []
    restored = [step for step, equal in zip(found.get("kept") or [], matches) if equal and step < changed_at - 1]
    return {"changed_at": int(changed_at), "change": found["change"], "step_move": found["step_move"],
            "growth": found.get("growth"),
            "returned_to": max(restored) if restored else None}
