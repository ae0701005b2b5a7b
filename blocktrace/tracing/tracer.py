"""Tracing: hook every step of a block, run it once, return what each step produced.

Works on blocktrace's own TransformerBlock and on any nn.Module block: a known layout
(HF GPT2Block, BertLayer, LlamaDecoderLayer, nanoGPT's Block, the tutorials' ln1/attn/ln2/ffn)
or steps the caller names (see blocktrace.tracing.steps). Hooks are registered for one call only and
removed in `finally`, also when the forward raises. Statistics are computed inside the
hooks, so no full activation outlives its step unless the caller asks to keep tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from blocktrace.config import STEP_NAMES, BlockConfig
from blocktrace.tracing.stats import (STAT_NAMES, attention_chunk_stats, stats_from_moments, tensor_moments,
                              weights_only_stats)
from blocktrace.tracing.steps import Layout, StepSpec, own_layout, resolve, user_layout

PREVIEW_MAX_TOKENS = 16  # attention matrices up to this size are kept for the text heatmap
ROPE_SUBSTEPS = ("q", "k", "q_rope", "k_rope")  # rotary embeddings' traced sub-steps inside attn
ROPE_OPERATIONS = {
    "attn.q": "q = heads(q_proj(x_in))", "attn.k": "k = heads(k_proj(x_in))",
    "attn.q_rope": "q_rope = RoPE(q, positions)", "attn.k_rope": "k_rope = RoPE(k, positions)",
}


@dataclass
class Stats:
    mean: float
    std: float
    min: float
    max: float
    rms: float
    absmax: float
    nan: int
    inf: int

    @classmethod
    def from_values(cls, values: list[float]) -> "Stats":
        data = dict(zip(STAT_NAMES, values))
        data["nan"], data["inf"] = int(data["nan"]), int(data["inf"])
        return cls(**data)

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in STAT_NAMES}


@dataclass
class StepRecord:
    name: str
    operation: str
    shape: tuple[int, ...]
    dtype: str
    stats: Stats
    tensor: Optional[torch.Tensor] = None  # only when the trace keeps tensors
    sample: Optional[list[float]] = None  # the first values of one token's vector
    probe: Optional[dict] = None  # health-check measurements (checks=True)


@dataclass
class AttentionSummary:
    shape: tuple[int, ...]
    causal: Optional[bool]  # None: unknown (the user's block applies its own mask)
    future_weight_sum: float
    entropy_per_head: list[float]
    max_weight: float
    max_logit: Optional[float]  # largest pre-softmax score (masked entries excluded); None if not visible
    preview: Optional[list] = None  # [H][T][T] weights of the first sequence, for small T
    tensor: Optional[torch.Tensor] = None


@dataclass
class Trace:
    config: Optional[BlockConfig]  # None for a user's block
    input: StepRecord  # the block input x, as a pseudo-step
    steps: list[StepRecord] = field(default_factory=list)  # in execution order
    attention: Optional[AttentionSummary] = None
    output: Optional[torch.Tensor] = None
    layout: str = "blocktrace TransformerBlock"
    placement: str = "pre"
    missing: list[str] = field(default_factory=list)  # steps whose hooks never fired
    notes: list[str] = field(default_factory=list)  # what could not be seen, and why
    substeps: list[StepRecord] = field(default_factory=list)  # inside attn: q and k around RoPE

    def step(self, name: str) -> StepRecord:
        for record in self.steps:
            if record.name == name:
                return record
        raise KeyError(name)

    @property
    def shape_preserved(self) -> bool:
        return tuple(self.output.shape) == self.input.shape

    def describe(self) -> dict:
        """The block's settings: its config, or what is known of a user's block."""
        if self.config is not None:
            return self.config.to_dict()
        causal = self.attention.causal if self.attention is not None else None
        return {"module": self.layout, "placement": self.placement, "causal": causal}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Kept tensors by their step names, plus `x` and `attn_weights` (needs keep_tensors)."""
        kept = {"x": self.input.tensor, **{s.name: s.tensor for s in [*self.steps, *self.substeps]}}
        if self.attention is not None:
            kept["attn_weights"] = self.attention.tensor
        missing = [name for name, tensor in kept.items() if tensor is None]
        if missing:
            raise ValueError(f"tensors were not kept for {missing}: trace with keep_tensors=True")
        return kept


@dataclass
class _Pending:
    """What a hook saw, still as tensors: copied to Python once, after the forward."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    stats: torch.Tensor
    tensor: Optional[torch.Tensor]
    sample: Optional[torch.Tensor]
    probe: dict = field(default_factory=dict)


def _first_tensor(value) -> Optional[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)):
        return next((v for v in value if isinstance(v, torch.Tensor)), None)
    return None


class _AttentionAccumulator:
    """Attention diagnostics summed over the chunks of query rows the attention computes."""

    def __init__(self, keep_tensors: bool, token_mask: Optional[torch.Tensor] = None):
        self.keep_tensors = keep_tensors
        self.token_mask = token_mask  # [B, T], False at padding
        self.scores = None  # the current chunk's scores, until its weights arrive
        self.chunks: list[dict] = []
        self.kept: list[torch.Tensor] = []
        self.shape_lead = None

    def add(self, weights: torch.Tensor, rows: Optional[slice]) -> None:
        weights = weights.detach()
        if self.scores is not None:
            self.chunks.append(attention_chunk_stats(weights, self.scores, rows, self.token_mask))
        else:
            self.chunks.append(weights_only_stats(weights))
        self.scores = None
        self.shape_lead = tuple(weights.shape[:-2]), weights.shape[-1]
        if self.keep_tensors or weights.shape[-1] <= PREVIEW_MAX_TOKENS:
            self.kept.append(weights)

    def result(self) -> dict:
        if not self.chunks:
            return {}
        lead, t = self.shape_lead
        rows = sum(chunk["rows"] for chunk in self.chunks)
        logits = [c["max_logit"] for c in self.chunks if c["max_logit"] is not None]
        merged = {
            "shape": (*lead, t, t),
            "future_weight_sum": torch.stack([c["future_weight_sum"] for c in self.chunks]).sum(),
            "entropy_per_head": torch.stack([c["entropy_sum"] for c in self.chunks]).sum(0) / rows,
            "max_weight": torch.stack([c["max_weight"] for c in self.chunks]).amax(),
            "max_logit": torch.stack(logits).amax() if logits else None,
        }
        if self.kept:
            full = torch.cat(self.kept, dim=-2)
            merged["tensor"] = full if self.keep_tensors else None
            if t <= PREVIEW_MAX_TOKENS:
                merged["preview"] = full.reshape(-1, *full.shape[-3:])[0]
        return merged


class _Recorder:
    def __init__(self, block, layout: Layout, own: bool, keep_tensors, sample_token, sample_size, checks,
                 token_mask=None):
        self.block, self.layout, self.own = block, layout, own  # own: blocktrace's TransformerBlock
        self.keep_tensors, self.checks = keep_tensors, checks
        self.sample_token, self.sample_size = sample_token, sample_size
        self.token_mask = token_mask  # [B, T], False at padding: left out of every statistic
        self.steps: list[_Pending] = []
        self.substeps: list[_Pending] = []
        self.attention = _AttentionAccumulator(keep_tensors, token_mask)
        self.refs: dict[str, torch.Tensor] = {}  # step outputs the residual checks still need

    def observe(self, name: str, value: torch.Tensor, inputs=()) -> _Pending:
        value = value.detach()
        sample = None
        if self.sample_size:
            row = value.reshape(-1, value.shape[-2], value.shape[-1])[0, self.sample_token]
            sample = row[: self.sample_size].clone()
        moments, finite = tensor_moments(self._real_tokens(value))
        pending = _Pending(name, tuple(value.shape), str(value.dtype).replace("torch.", ""), moments,
                           value if self.keep_tensors else None, sample)
        if not finite:  # cheap, and only here: which inputs were still finite?
            pending.probe["inputs_finite"] = [bool(torch.isfinite(t).all()) for t in inputs
                                              if isinstance(t, torch.Tensor)]
        if self.checks:
            from blocktrace.tracing import probes

            pending.probe.update(probes.step_probe(self, name, value, moments))
        return pending

    def _real_tokens(self, value: torch.Tensor) -> torch.Tensor:
        """The values at real (not padding) tokens, when the batch is padded."""
        mask = self.token_mask
        if mask is None or value.dim() < 3 or tuple(value.shape[:2]) != tuple(mask.shape):
            return value
        return value[mask.to(value.device)]

    def record(self, name: str, value, inputs=()) -> None:
        value = _first_tensor(value)
        if value is None or any(p.name == name for p in self.steps):
            return  # a module called twice is traced at its first call
        self.steps.append(self.observe(name, value, inputs))

    def hooks(self) -> list:
        handles = []
        for spec in self.layout.specs:
            module = resolve(self.block, spec)
            if spec.capture == "input":
                handles.append(module.register_forward_pre_hook(
                    lambda m, args, name=spec.name: self.record(name, args[0] if args else None, args)))
            else:
                handles.append(module.register_forward_hook(
                    lambda m, args, out, name=spec.name: self.record(name, out, args)))
        handles += self._attention_hooks()
        if self.checks and self.layout.hidden:
            from blocktrace.tracing import probes

            hidden = resolve(self.block, StepSpec("ffn", self.layout.hidden))
            handles.append(hidden.register_forward_hook(lambda m, a, out: probes.ffn_probe(self, out)))
        return handles

    def _attention_hooks(self) -> list:
        if self.own:  # our attention exposes its scores and weights through hook points
            attention = self.block.attn

            def on_scores(module, inputs, scores):
                self.attention.scores = scores.detach()

            rotary = [getattr(attention, name).register_forward_hook(
                lambda m, i, out, name=name: self.substeps.append(self.observe(f"attn.{name}", out)))
                for name in ROPE_SUBSTEPS if attention.rope is not None]
            return [*rotary, attention.scores.register_forward_hook(on_scores),
                    attention.weights.register_forward_hook(
                        lambda m, i, weights: self.attention.add(weights, attention.rows))]
        module = resolve(self.block, StepSpec("attn", self.layout.attention_path))

        def on_output(module, inputs, output):
            weights = _attention_weights(output)
            if weights is not None:
                self.attention.add(weights, None)

        return [module.register_forward_hook(on_output)]


def _attention_weights(output) -> Optional[torch.Tensor]:
    """The `[..., H, T, T]` weights in a module's output tuple, if it returns them."""
    if not isinstance(output, (tuple, list)):
        return None
    for value in output[1:]:
        if isinstance(value, torch.Tensor) and value.dim() >= 3 and value.shape[-1] == value.shape[-2]:
            return value
    return None


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
    placement: str = "pre",
    forward_kwargs: Optional[dict] = None,
    token_mask: Optional[torch.Tensor] = None,
) -> Trace:
    """Run `block` on `x` once with every step hooked; return the steps in execution order.

    keep_tensors: keep each step's output (for `--save`); otherwise only statistics survive.
    sample_token / sample_size: keep the first `sample_size` values of that token's vector
    (first sequence of a batch) at every step, as the tutorials print `x[0, 0, :10]`.
    attn_chunk: query rows our attention computes at once (None: as many as fit its memory
    budget, see layers.ATTENTION_CHUNK_BYTES); bounds the `[B, H, rows, T]` temporaries.
    checks: also measure what the health checks need (blocktrace.diagnose.health).
    steps / placement: for a user's block of unknown layout, its norm1/attn/norm2/ffn
    submodule paths and its wiring ("pre" or "post"); the residual steps are recovered.
    forward_kwargs: extra arguments of the block's forward (masks, position embeddings).
    token_mask: [B, T] bool, False at padding: statistics and attention diagnostics leave the
    padded positions out (our attention also gives padded keys no weight: see key_mask).
    """
    own = hasattr(block, "step_modules") and isinstance(getattr(block, "config", None), BlockConfig)
    layout = own_layout(block) if own else user_layout(block, steps, placement)
    if sample_size and not -x.shape[-2] <= sample_token < x.shape[-2]:
        raise IndexError(f"token index {sample_token} is out of range for {x.shape[-2]} tokens")
    recorder = _Recorder(block, layout, own, keep_tensors, sample_token, sample_size, checks, token_mask)
    x_pending = recorder.observe("x", x)
    handles = []
    saved_chunk = getattr(getattr(block, "attn", None), "query_chunk", None)
    try:
        handles = recorder.hooks()
        if own and attn_chunk is not None:
            block.attn.query_chunk = attn_chunk
        with torch.no_grad():
            output = _first_tensor(block(x, **(forward_kwargs or {})))
    finally:
        if own:
            block.attn.query_chunk = saved_chunk
        for handle in handles:
            handle.remove()
    return _assemble(block, layout, own, x_pending, recorder, output)


def _operations(block, layout: Layout, own: bool) -> dict[str, str]:
    if own:
        from blocktrace.model.block import step_operations

        return {"x": "input", **step_operations(block.config)}
    return {"x": "input", **{spec.name: spec.describe() for spec in layout.specs}}


def _assemble(block, layout: Layout, own: bool, x_pending: _Pending, recorder: _Recorder, output) -> Trace:
    pending = [x_pending, *recorder.steps, *recorder.substeps]
    attention = recorder.attention.result()
    # One device-to-host copy for every number of the trace.
    stats_rows = [stats_from_moments(row) for row in torch.stack([p.stats for p in pending]).tolist()]
    samples = [p.sample.double().tolist() if p.sample is not None else None for p in pending]
    operations = {**_operations(block, layout, own), **ROPE_OPERATIONS}
    records = [
        StepRecord(p.name, operations[p.name], p.shape, p.dtype, Stats.from_values(row), p.tensor, sample,
                   _python_probe(p.probe))
        for p, row, sample in zip(pending, stats_rows, samples)
    ]
    summary, notes = None, []
    if attention:
        preview = attention.get("preview")
        summary = AttentionSummary(
            shape=attention["shape"],
            causal=layout.causal,
            future_weight_sum=attention["future_weight_sum"].item(),
            entropy_per_head=attention["entropy_per_head"].tolist(),
            max_weight=attention["max_weight"].item(),
            max_logit=attention["max_logit"].item() if attention["max_logit"] is not None else None,
            preview=preview.double().tolist() if preview is not None else None,
            tensor=attention.get("tensor"),
        )
    else:
        notes.append(f"attention weights are not visible: {layout.attention_path or 'the attention'} returns none "
                     "(a fused kernel such as scaled_dot_product_attention, or weights not requested)")
    fired = {p.name for p in recorder.steps}
    missing = [name for name in STEP_NAMES if name not in fired]
    if missing:
        notes.append(f"hooks that never fired: {', '.join(missing)} (a fast path may skip submodule hooks)")
    config = block.config if own else None
    n_steps = 1 + len(recorder.steps)
    return Trace(config, records[0], records[1:n_steps], summary, output, layout.name, layout.placement, missing,
                 notes, records[n_steps:])


def _python_probe(probe: dict) -> Optional[dict]:
    if not probe:
        return None
    return {key: value.item() if isinstance(value, torch.Tensor) else value for key, value in probe.items()}
