"""Tracing: hook every step of a block, run it once, return what each step produced.

Works on blocktrace's own TransformerBlock and on any nn.Module block: a known layout
(HF GPT2Block, BertLayer, LlamaDecoderLayer, nanoGPT's Block, the tutorials' ln1/attn/ln2/ffn)
or steps the caller names (see tracing.steps). Hooks are registered for one call only and
removed in `finally`, also when the forward raises. Statistics are computed inside the
hooks, on the device; the step outputs are held (references, not copies) until the trace's one
copy to the host — a non-finite step's NaN and Inf are counted from them then — and dropped.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.errors import InputError
from blocktrace.tracing.assembly import Collected, finish
from blocktrace.tracing.behaviour import measure_causality, measure_norm
from blocktrace.tracing.calling import Call, eager_attention, huggingface_call, is_huggingface
from blocktrace.tracing.recorder import HookFailure, Recorder, first_tensor
from blocktrace.tracing.records import Trace
from blocktrace.tracing.steps import Layout, own_layout, resolve, user_layout
from blocktrace.vocab import NORM_STEPS, Placement


def is_own_block(block: nn.Module) -> bool:
    """blocktrace's own TransformerBlock (six step modules and a BlockConfig)."""
    return hasattr(block, "step_modules") and isinstance(getattr(block, "config", None), BlockConfig)


def trace(
    block: nn.Module,
    x: torch.Tensor,
    *,
    keep_tensors: bool = False,
    sample_token: int = 0,
    sample_size: int = 0,
    attn_chunk: Optional[int] = None,
    checks: bool = False,
    steps: Optional[dict[str, str]] = None,
    placement: Placement = Placement.PRE,
    forward_kwargs: Optional[dict] = None,
    token_mask: Optional[torch.Tensor] = None,
    expect_causal: Optional[bool] = None,
    attention_map: bool = False,
) -> Trace:
    """Run `block` on `x` once with every step hooked; return the steps in execution order.

    keep_tensors: keep each step's output (for `--save`); otherwise only statistics survive.
    sample_token / sample_size: keep the first `sample_size` values of that token's vector
    (first sequence of a batch) at every step, as the tutorials print `x[0, 0, :10]`.
    attn_chunk: query rows our attention computes at once (None: as many as fit its memory
    budget, see layers.attention_chunk_bytes); bounds the `[B, H, rows, T]` temporaries.
    checks: also measure what the health checks need (blocktrace.diagnose.health).
    steps / placement: for a user's block of unknown layout, its norm1/attn/norm2/ffn
    submodule paths and its wiring (Placement.PRE or POST); the residual steps are recovered.
    forward_kwargs: extra arguments of the block's forward (masks, position embeddings).
    token_mask: [B, T] bool, False at padding: statistics and attention diagnostics leave the
    padded positions out (our attention also gives padded keys no weight: see key_mask).
    expect_causal: what a user's block is meant to be, when its layout does not say (a known
    decoder layout is meant to be causal); with checks, a measured leak in a block meant to be
    causal is an error.
    attention_map: for an input longer than the text heatmap shows, pool the first sequence's
    attention weights into a map (recorder.MAP_CELLS; the HTML page draws it).

    An exception from the block's own forward (a user's block) is raised as InputError naming
    it; one from blocktrace's hooks is a bug in blocktrace and propagates as it is.
    """
    own = is_own_block(block)
    layout = own_layout(block) if own else user_layout(block, steps, Placement(placement))
    if expect_causal is not None and not own:
        layout = dataclasses.replace(layout, causal=expect_causal)
    call = _call(block, layout, own, x, forward_kwargs, token_mask)
    if call.batched and x.dim() == 2:
        x = x.unsqueeze(0)
    if sample_size and not -x.shape[-2] <= sample_token < x.shape[-2]:
        raise IndexError(f"token index {sample_token} is out of range for {x.shape[-2]} tokens")
    recorder = Recorder(block, layout, own, keep_tensors=keep_tensors, sample_token=sample_token,
                        sample_size=sample_size, checks=checks, token_mask=token_mask, attention_map=attention_map)
    output = _run_hooked(block, recorder, own, x, call, attn_chunk)
    behaviour = _behaviour(block, layout, own, x, call, output) if checks else {}
    (traced,), _ = finish([Collected(block, layout, own, recorder, output, behaviour, notes=call.notes)])
    return traced


def _run_hooked(block: nn.Module, recorder: Recorder, own: bool, x: torch.Tensor, call: Call,
                attn_chunk: Optional[int]):
    """The block's forward once with the recorder's hooks attached (and our attention's chunk set), both undone
    after it whatever happens."""
    recorder.start(x)
    saved_chunk = block.attn.query_chunk if own else None
    try:
        recorder.attach()
        if own and attn_chunk is not None:
            block.attn.query_chunk = attn_chunk
        with eager_attention(call):
            return _forward(block, x, call.kwargs, own)
    finally:
        if own:
            block.attn.query_chunk = saved_chunk
        recorder.detach()


def _call(block, layout: Layout, own: bool, x, forward_kwargs: Optional[dict], token_mask) -> Call:
    """The block's calling convention: ours, the caller's arguments, or the one its model uses."""
    if own:
        return Call()
    if forward_kwargs is not None:
        return Call(kwargs=forward_kwargs, batched=layout.batched)
    if is_huggingface(block):
        return huggingface_call(block, x, token_mask)
    notes = ["called with a batch of one, as the block's own code expects [B, T, d]"] \
        if layout.batched and x.dim() == 2 else []
    return Call(batched=layout.batched, notes=notes)


def measured_norms(block, layout: Layout, width: int) -> dict:
    """How every norm step behaves, by step name (tracing.behaviour: measured on the device, read with the trace)."""
    measured = {}
    for spec in layout.specs:
        if spec.name in NORM_STEPS:
            norm = measure_norm(resolve(block, spec), width)
            if norm is not None:
                measured[spec.name] = norm
    return measured


def _behaviour(block, layout: Layout, own: bool, x, call: Call, output) -> dict:
    """Measured causality (a user's block) and the behaviour of every norm, by step name."""
    measured = measured_norms(block, layout, x.shape[-1])
    # A user's block, or ours with a mixer that has no attention weights to read the mask from: measured
    if not own or block.config.token_mixer is not None:
        def forward(value):
            with eager_attention(call):
                return _forward(block, value, call.kwargs, own)
        measured["attn"] = measure_causality(forward, x, output)
    return measured


def _forward(block: nn.Module, x: torch.Tensor, kwargs: dict, own: bool) -> torch.Tensor:
    try:
        with torch.no_grad():
            result = block(x, **kwargs)
    except HookFailure as failure:
        raise failure.original  # a bug in blocktrace: never blamed on the block
    except Exception as error:
        if own:
            raise
        raise InputError(f"the block's forward raised {type(error).__name__}: {str(error)[:300]}") from None
    output = first_tensor(result)
    if output is None or not output.is_floating_point():
        raise InputError(f"the block's forward returned {type(result).__name__}; blocktrace needs the output "
                         "hidden states: a tensor, or a tuple whose first item is that tensor")
    return output
