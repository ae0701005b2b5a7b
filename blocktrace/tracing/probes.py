"""Measurements the health checks need, taken inside the trace's hooks (checks=True only).

Each probe reads what it needs from an explicit ProbeContext — the block, its layout, the
residual scale, the padding mask — and returns small device tensors or numbers: nothing here
reads a value on the host (the trace copies every probe at once, see blocktrace.host). What is
worth measuring only in rare cases — the median |x| behind a massive activation, the flat
region of a mostly dead FFN — is measured after that copy, from the values the trace holds
(`massive_median`, `flat_fraction`), in a second copy that a healthy trace never makes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from blocktrace.tracing.stats import real_token_mask
from blocktrace.tracing.steps import Layout, StepSpec, resolve
from blocktrace.vocab import FFNKind

MASSIVE_ABS = 100.0  # Sun et al. 2024: massive activations exceed 100 in magnitude
RESIDUAL_TOKENS = 256  # the residual identity holds at every token: this many spread over the input suffice


@dataclass
class ProbeContext:
    """What the probes of one traced block may read, and the little state they share."""

    block: torch.nn.Module
    layout: Layout
    residual_scale: float  # α multiplying the stream in each residual add (DeepNorm), else 1
    update_scale: float  # m multiplying each sublayer's output in its residual add (Granite), else 1
    activation: FFNKind  # what the FFN hidden values are: decides what "active" means
    token_mask: Optional[torch.Tensor] = None  # [B, T], False at padding
    refs: dict = field(default_factory=dict)  # step outputs the residual checks still need
    ffn_activity: dict = field(default_factory=dict)  # from the FFN hidden, until the ffn step reads it

    @classmethod
    def of(cls, block, layout: Layout, own: bool, token_mask=None) -> "ProbeContext":
        if own:
            config = block.config
            return cls(block, layout, config.residual_scale, config.residual_multiplier, config.ffn, token_mask)
        multiplier = 1.0 if layout.residual_multiplier is None else float(getattr(block, layout.residual_multiplier))
        return cls(block, layout, 1.0, multiplier, _user_activation(block, layout), token_mask)

    @property
    def final_step(self) -> str:
        """The step whose output is the block's output."""
        return self.layout.wiring.output

    @property
    def sources(self) -> dict:
        return self.layout.wiring.residual_sources

    ffn_hidden: Optional[torch.Tensor] = None  # the FFN's hidden values, held for flat_fraction


def _user_activation(block, layout: Layout) -> FFNKind:
    if not layout.hidden:
        return FFNKind.GELU
    module = resolve(block, StepSpec("ffn", layout.hidden))
    return FFNKind.RELU if "relu" in type(module).__name__.lower() else FFNKind.GELU


def _norm(t: torch.Tensor) -> torch.Tensor:
    """Frobenius norm, accumulated in float32 at least (a relative 1e-3 test needs no more)."""
    return torch.linalg.vector_norm(t if t.dtype in (torch.float32, torch.float64) else t.float())


def _spread(t: torch.Tensor) -> torch.Tensor:
    """At most RESIDUAL_TOKENS tokens, evenly spaced, of a [..., T, d] tensor (a view)."""
    every = max(1, t.shape[-2] // RESIDUAL_TOKENS)
    return t if every == 1 else t[..., ::every, :]


def residual_probe(context: ProbeContext, name: str, value: torch.Tensor) -> dict:
    """Whether the step's output is α·stream + m·update (an identity that holds token by token, so tokens
    spread over a long input test it as well as all of them), and the size of what is added (m·update) against the
    stream's."""
    stream_name, update_name = context.sources[name]
    stream, update = context.refs.get(stream_name), context.refs.get(update_name)
    probe = {}
    if stream is not None and update is not None and stream.shape == value.shape == update.shape:
        stream, update, value = _spread(stream), _spread(update), _spread(value)
        if context.update_scale != 1.0:
            update = update * context.update_scale
        expected = torch.add(update, stream, alpha=context.residual_scale)
        plain = _norm(expected.sub_(value)) / _norm(value).clamp_min(1e-30)
        # dropout acts only in training (in eval it is the identity, by torch's contract): there the add may hold
        # as dropout's arithmetic; in eval it must hold plainly (a block that still drops — F.dropout's default
        # training=True — is no residual), and the fit's dozen passes over the stream are not paid
        probe["residual_mismatch"] = torch.minimum(plain, _dropped_out_mismatch(
            stream, update, value, context.residual_scale)) if context.block.training else plain
        probe["update_ratio"] = _norm(update) / _norm(stream).clamp_min(1e-30)
    for used in (stream_name, update_name):  # compared: no reason to hold them any longer
        context.refs.pop(used, None)
    return probe


DROPOUT_SHARE_TOLERANCE = 0.05  # the dropped share against 1 − 1/scale: thousands of elements put its noise at ~0.005


def _dropped_out_mismatch(stream: torch.Tensor, update: torch.Tensor, value: torch.Tensor,
                          alpha: float) -> torch.Tensor:
    """The residual identity with dropout between the update and the add (x + dropout(f(x)), in training): each
    element of output − α·stream is 0 (dropped) or the update × c (kept, c = 1/(1 − p)). Its mismatch, with c fitted
    over the kept elements; infinite where c is not above 1 or the dropped share is not 1 − 1/c — dropout's own
    arithmetic, so a stream dropped with its update (dropout(x + f(x))) or any other tensor is not taken for it."""
    added = value.float() - alpha * stream.float()
    update = update.float()
    kept = (added != 0) | (update == 0)
    scale = (added * update * kept).sum() / (update * update * kept).sum().clamp_min(1e-30)
    share = 1 - kept.float().mean()
    dropout = (scale > 1) & ((share - (1 - 1 / scale.clamp_min(1e-30))).abs() <= DROPOUT_SHARE_TOLERANCE)
    mismatch = _norm(added - scale * update * kept) / _norm(value).clamp_min(1e-30)
    return torch.where(dropout, mismatch, torch.full_like(mismatch, float("inf")))


def _at_real_tokens(value: torch.Tensor, token_mask: Optional[torch.Tensor], fill: float) -> torch.Tensor:
    """`value` with `fill` at padded tokens."""
    real = real_token_mask(value, token_mask)
    return value if real is None else value.masked_fill(~real, fill)


def _median_token_size(value: torch.Tensor, token_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The median over real tokens of ‖x‖²/d: the stream's size, blind to a few sink tokens with huge norms."""
    norms = torch.linalg.vector_norm(value.detach().float(), dim=-1)
    return _at_real_tokens(norms, token_mask, float("nan")).flatten().nanmedian().square() / value.shape[-1]


def massive_median(value: torch.Tensor, token_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """The median |x| at real tokens: what max |x| is compared with once it exceeds MASSIVE_ABS (a sort, paid
    only then)."""
    return _at_real_tokens(value.detach().abs().float(), token_mask, float("nan")).flatten().nanmedian()


DEAD_WORTH_A_LOOK = 0.5  # the flat-region fraction (info) is measured only past this dead fraction
GATED_ACTIVE = 1e-6  # a gated unit's output counts as active above this size


def ffn_probe(context: ProbeContext, output) -> None:
    """Each hidden unit's largest activation over the real tokens (its dead fraction follows, once every rank's
    largest is known), and the hidden values, held for the flat-region fraction."""
    hidden = (output[0] if isinstance(output, (tuple, list)) else output).detach()
    gated = context.activation.signed_hidden  # signed output: active when not ~0; else active when positive
    size = hidden.abs() if gated else hidden
    peak = _at_real_tokens(size, context.token_mask, 0.0 if gated else -float("inf"))
    peak = peak.reshape(-1, peak.shape[-1]).amax(dim=0)  # one pass: a unit's largest value
    real = real_token_mask(hidden, context.token_mask)
    tokens = real.sum() if real is not None else hidden.reshape(-1, hidden.shape[-1]).shape[0]
    context.ffn_activity = {"unit_peak": peak, "gated": gated, "units": hidden.shape[-1], "tokens": tokens}
    context.ffn_hidden = hidden


def dead_fraction(unit_peak: torch.Tensor, gated: bool, reducer=None) -> torch.Tensor:
    """The share of units never active for any token (of any rank, with a reducer), from ffn_probe's unit peaks."""
    peak = unit_peak if reducer is None else reducer.largest(unit_peak)
    return (peak <= (GATED_ACTIVE if gated else 0.0)).float().mean()


def flat_fraction(hidden: torch.Tensor, gated: bool, token_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """Share of activations at real tokens where the nonlinearity has ~zero slope (~0 output on the negative
    side)."""
    region = hidden.abs() <= GATED_ACTIVE if gated else (hidden <= 0) & (hidden > -1e-3)
    real = _at_real_tokens(torch.ones_like(hidden[..., :1], dtype=torch.bool), token_mask, False)
    return (region & real).sum(dtype=torch.float64) / (real.sum(dtype=torch.float64) * hidden.shape[-1]).clamp_min(1)


def step_probe(context: ProbeContext, name: str, value: torch.Tensor) -> dict:
    """Everything the health checks need from one step, as device tensors (massive_median follows if needed)."""
    probe = {}
    if name == context.final_step:
        probe["token_sq_median"] = _median_token_size(value, context.token_mask)
    if name in context.sources:  # a residual sum: where the stream and an update are added
        probe.update(residual_probe(context, name, value))
    if name == "ffn" and context.ffn_activity:
        probe.update(context.ffn_activity)
    if name in context.layout.wiring.summands:
        context.refs[name] = value
    return probe
