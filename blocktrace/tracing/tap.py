"""Taps on the blocks of a running model: what each block saw during a forward someone else runs.

`trace()` calls a block itself; a training watch cannot — the training loop runs the model. A
BlockTap hooks one block (its input, its steps, its output) for the duration of one forward
and assembles what it saw into the same Trace. Attention that runs through
torch.nn.functional.scaled_dot_product_attention — HF's default and nanoGPT's — returns no
weights; while taps are attached, `attention_through_sdpa` wraps that function so every call
made inside a tapped block also yields its logits' maximum, the entropy per head and the
weight on later tokens, computed from the very q, k and mask the block passed (then the
original kernel computes the output, so training is untouched). Nothing is attached between
recording steps: the taps cost nothing then.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Optional

import torch
from torch import nn
from torch.nn import functional as F

from blocktrace.tracing.recorder import Recorder, first_tensor
from blocktrace.tracing.steps import detect_layout, own_layout
from blocktrace.tracing.assembly import Collected
from blocktrace.tracing.tracer import is_own_block, measured_norms

_CURRENT: list["BlockTap"] = []  # the tapped block whose forward is running (a stack: blocks may nest)


class BlockTap:
    """Hooks on one block for one forward; `result()` is the Trace of the first call it saw (of the first call
    `when()` allows, when given: the Watch traces only forwards with gradients, not an evaluation under no_grad)."""

    def __init__(self, block: nn.Module, checks: bool = True, when: Optional[Callable[[], bool]] = None):
        self.block, self.own = block, is_own_block(block)
        self.layout = own_layout(block) if self.own else detect_layout(block)
        self.checks, self.when = checks, when
        self.recorder: Optional[Recorder] = None
        self.output: Optional[torch.Tensor] = None
        self.entered: Optional[torch.Tensor] = None  # the input of the call traced, as given (not a copy)
        self.bypassed = False  # the call traced returned its very input: the block was skipped (LayerDrop)
        self.handles: list = []
        self.notes: list[str] = []
        self.recording = False  # inside the call being traced: the recorder's hooks are on

    def attach(self) -> None:
        self.recorder = Recorder(self.block, self.layout, self.own, checks=self.checks, tolerant=self.when is not None)
        self.output = self.entered = None
        self.bypassed = False
        self.handles = [self.block.register_forward_pre_hook(self._enter, with_kwargs=True),
                        self.block.register_forward_hook(self._leave, with_kwargs=True)]

    def detach(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if self.recorder is not None:
            self.recorder.detach()
        self._stop()

    def _enter(self, module, args, kwargs):
        """The recorder's hooks go on for the call traced only: a block called twice (gradient accumulation) is
        read at its first call, and a call `when` refuses is not read at all."""
        if self.recorder.input is not None or self.recording or (self.when is not None and not self.when()):
            return
        x = args[0] if args else kwargs.get("hidden_states")
        if isinstance(x, torch.Tensor):
            self.entered = x
            self.recorder.attach()
            self.recording = True
            _CURRENT.append(self)
            self.recorder.guard(self.recorder.start)(x)

    def _leave(self, module, args, kwargs, output):
        if not self.recording:
            return
        returned = first_tensor(output)
        # the block's input itself came back (a hook or a wrapper threw the block's computation away: LayerDrop,
        # stochastic depth): the block took no part in this forward, and what its steps computed is not its output
        self.bypassed = returned is self.entered
        self.output = None if self.bypassed else returned.detach()
        self.entered = None
        self.recorder.detach()
        self._stop()

    def _stop(self) -> None:
        if self.recording and _CURRENT and _CURRENT[-1] is self:
            _CURRENT.pop()
        self.recording = False

    def result(self, reducer=None) -> Optional[Collected]:
        """What the block did, still on the device (tracing.assembly.finish makes it a Trace), or None if it did
        not run while tapped."""
        if self.recorder is not None and self.recorder.failure is not None:
            raise self.recorder.failure  # the Watch stops recording on it (the forward it happened in went on)
        if self.recorder is None or self.recorder.input is None or self.output is None:
            return None
        behaviour = {}
        if self.checks:
            with _whole(self.block):
                behaviour = measured_norms(self.block, self.layout, self.output.shape[-1])
        notes = list(self.notes)
        if self.recorder.attention.chunks and all(c["max_logit"] is None for c in self.recorder.attention.chunks):
            notes.append("largest attention logit not visible: the attention returns its weights, not its "
                         "scores (HF's eager attention); with sdpa attention the watch measures it")
        return Collected(self.block, self.layout, self.own, self.recorder, self.output, behaviour, reducer, notes)


@contextlib.contextmanager
def _whole(block: nn.Module):
    """The block with whole weights while its norms are measured: a block sharded by FSDP2 holds only its rank's
    shards between forwards, so it gathers them (every rank records, so every rank gathers) and drops them after."""
    gather, drop = getattr(block, "unshard", None), getattr(block, "reshard", None)
    if not (callable(gather) and callable(drop)):
        yield
        return
    gather()
    try:
        yield
    finally:
        drop()


def _masked_scores(scores: torch.Tensor, mask: Optional[torch.Tensor], is_causal: bool) -> torch.Tensor:
    """The scores as sdpa weighs them: is_causal hides the keys after each query's index, aligned top-left when
    there are more keys than queries (torch's docs: 'the upper left causal bias', CausalBias), a boolean mask hides
    where it is False, a float mask is added (its -inf hides; a bias such as ALiBi shifts)."""
    hidden = torch.finfo(scores.dtype).min
    if is_causal:
        rows, keys = scores.shape[-2:]
        keep = torch.ones(rows, keys, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~keep, hidden)
    if mask is None:
        return scores
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, hidden)
    return (scores + mask.to(scores.dtype)).clamp_min(hidden)


def _observe(tap: BlockTap, query, key, attn_mask, is_causal: bool, scale: Optional[float]) -> None:
    """The scores and weights this sdpa call computes, measured into the tap's attention accumulator."""
    with torch.no_grad():
        q, k = query.detach().float(), key.detach().float()
        if k.shape[-3] != q.shape[-3]:  # grouped-query attention
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        scores = torch.matmul(q, k.transpose(-1, -2)) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        scores = _masked_scores(scores, attn_mask, is_causal)
        accumulator = tap.recorder.attention
        accumulator.scores = scores
        # keys beyond the queries' count come first (memory, a prefix, a cache): the queries are the last T of S
        accumulator.add(torch.softmax(scores, dim=-1), slice(0, q.shape[-2]),
                        keys_before=max(k.shape[-2] - q.shape[-2], 0))


class _SdpaPatch:
    """The one wrapper around F.scaled_dot_product_attention, shared by every user: installed by the first,
    removed by the last, whatever order they leave in (two Watches on one model may close in any order)."""

    def __init__(self):
        self.users = 0
        self.original = None

    def measured(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kwargs):
        tap = _CURRENT[-1] if _CURRENT else None
        if tap is not None and tap.output is None and query.dim() >= 3:  # a recomputed forward is not counted twice
            try:
                _observe(tap, query, key, attn_mask, is_causal, scale)
            except Exception as error:  # the measurement must never break the training step: say so instead
                tap.notes.append(f"attention not measured: {type(error).__name__}: {error}")
        return self.original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                             scale=scale, **kwargs)

    def enter(self) -> None:
        if self.users == 0:
            self.original = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = self.measured
        self.users += 1

    def leave(self) -> None:
        self.users -= 1
        if self.users == 0:
            if F.scaled_dot_product_attention == self.measured:  # someone patching on top keeps their patch
                F.scaled_dot_product_attention = self.original


_SDPA = _SdpaPatch()


@contextlib.contextmanager
def attention_through_sdpa():
    """While active, sdpa calls made inside a tapped block are measured (see the module docstring)."""
    _SDPA.enter()
    try:
        yield
    finally:
        _SDPA.leave()
