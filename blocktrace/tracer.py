"""Tracing: hook every step of a block, run it once, return what each step produced.

Hooks are registered for one call only and removed in `finally`, also when the forward
raises. Statistics are computed inside the hooks, so no full activation outlives its step
unless the caller asks to keep tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from blocktrace.block import step_operations
from blocktrace.config import BlockConfig
from blocktrace.stats import STAT_NAMES, attention_chunk_stats, stats_from_moments, tensor_moments

PREVIEW_MAX_TOKENS = 16  # attention matrices up to this size are kept for the text heatmap


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


@dataclass
class AttentionSummary:
    shape: tuple[int, ...]
    causal: bool
    future_weight_sum: float
    entropy_per_head: list[float]
    max_weight: float
    max_logit: float  # largest pre-softmax score (masked entries excluded)
    preview: Optional[list] = None  # [H][T][T] weights of the first sequence, for small T
    tensor: Optional[torch.Tensor] = None


@dataclass
class Trace:
    config: BlockConfig
    input: StepRecord  # the block input x, as a pseudo-step
    steps: list[StepRecord] = field(default_factory=list)  # in execution order
    attention: Optional[AttentionSummary] = None
    output: Optional[torch.Tensor] = None

    def step(self, name: str) -> StepRecord:
        for record in self.steps:
            if record.name == name:
                return record
        raise KeyError(name)

    @property
    def shape_preserved(self) -> bool:
        return tuple(self.output.shape) == self.input.shape

    def tensors(self) -> dict[str, torch.Tensor]:
        """Kept tensors by their step names, plus `x` and `attn_weights` (needs keep_tensors)."""
        kept = {"x": self.input.tensor, **{s.name: s.tensor for s in self.steps}}
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


class _AttentionAccumulator:
    """Attention diagnostics summed over the chunks of query rows the attention computes."""

    def __init__(self, keep_tensors: bool):
        self.keep_tensors = keep_tensors
        self.scores = None  # the current chunk's scores, until its weights arrive
        self.chunks: list[dict] = []
        self.kept: list[torch.Tensor] = []
        self.shape_lead = None

    def add(self, attention_module, weights: torch.Tensor) -> None:
        weights = weights.detach()
        self.chunks.append(attention_chunk_stats(weights, self.scores, attention_module.rows))
        self.scores = None
        self.shape_lead = tuple(weights.shape[:-2]), weights.shape[-1]
        if self.keep_tensors or weights.shape[-1] <= PREVIEW_MAX_TOKENS:
            self.kept.append(weights)

    def result(self) -> dict:
        if not self.chunks:
            return {}
        lead, t = self.shape_lead
        rows = sum(chunk["rows"] for chunk in self.chunks)
        merged = {
            "shape": (*lead, t, t),
            "future_weight_sum": torch.stack([c["future_weight_sum"] for c in self.chunks]).sum(),
            "entropy_per_head": torch.stack([c["entropy_sum"] for c in self.chunks]).sum(0) / rows,
            "max_weight": torch.stack([c["max_weight"] for c in self.chunks]).amax(),
            "max_logit": torch.stack([c["max_logit"] for c in self.chunks]).amax(),
        }
        if self.kept:
            full = torch.cat(self.kept, dim=-2)
            merged["tensor"] = full if self.keep_tensors else None
            if t <= PREVIEW_MAX_TOKENS:
                merged["preview"] = full.reshape(-1, *full.shape[-3:])[0]
        return merged


class _Recorder:
    def __init__(self, keep_tensors, sample_token, sample_size):
        self.keep_tensors = keep_tensors
        self.sample_token = sample_token
        self.sample_size = sample_size
        self.steps: list[_Pending] = []
        self.attention = _AttentionAccumulator(keep_tensors)

    def observe(self, name: str, value: torch.Tensor) -> _Pending:
        value = value.detach()
        sample = None
        if self.sample_size:
            row = value.reshape(-1, value.shape[-2], value.shape[-1])[0, self.sample_token]
            sample = row[: self.sample_size].clone()
        kept = value if self.keep_tensors else None
        return _Pending(name, tuple(value.shape), str(value.dtype).replace("torch.", ""),
                        tensor_moments(value), kept, sample)

    def step_hook(self, name):
        def hook(module, inputs, output):
            self.steps.append(self.observe(name, output))
        return hook

    def hook_attention(self, attention_module) -> list:
        def on_scores(module, inputs, scores):
            self.attention.scores = scores

        def on_weights(module, inputs, weights):
            self.attention.add(attention_module, weights)

        return [attention_module.scores.register_forward_hook(on_scores),
                attention_module.weights.register_forward_hook(on_weights)]


def trace(
    block: nn.Module,
    x: torch.Tensor,
    *,
    keep_tensors: bool = False,
    sample_token: int = 0,
    sample_size: int = 0,
    attn_chunk: Optional[int] = None,
) -> Trace:
    """Run `block` on `x` once with every step hooked; return the steps in execution order.

    keep_tensors: keep each step's output (for `--save`); otherwise only statistics survive.
    sample_token / sample_size: keep the first `sample_size` values of that token's vector
    (first sequence of a batch) at every step, as the tutorials print `x[0, 0, :10]`.
    attn_chunk: query rows the attention computes at once (None: as many as fit its memory
    budget, see layers.ATTENTION_CHUNK_BYTES); bounds the `[B, H, rows, T]` temporaries.
    """
    if sample_size and not -x.shape[-2] <= sample_token < x.shape[-2]:
        raise IndexError(f"token index {sample_token} is out of range for {x.shape[-2]} tokens")
    recorder = _Recorder(keep_tensors, sample_token, sample_size)
    x_pending = recorder.observe("x", x)
    handles = [module.register_forward_hook(recorder.step_hook(name))
               for name, module in block.step_modules().items()]
    handles += recorder.hook_attention(block.attn)
    saved_chunk = block.attn.query_chunk
    try:
        if attn_chunk is not None:
            block.attn.query_chunk = attn_chunk
        with torch.no_grad():
            output = block(x)
    finally:
        block.attn.query_chunk = saved_chunk
        for handle in handles:
            handle.remove()
    return _assemble(block.config, x_pending, recorder, output)


def _assemble(config: BlockConfig, x_pending: _Pending, recorder: _Recorder, output) -> Trace:
    pending = [x_pending, *recorder.steps]
    attention = recorder.attention.result()
    # One device-to-host copy for every number of the trace.
    stats_rows = [stats_from_moments(row) for row in torch.stack([p.stats for p in pending]).tolist()]
    samples = [p.sample.double().tolist() if p.sample is not None else None for p in pending]
    operations = {"x": "input", **step_operations(config)}
    records = [
        StepRecord(p.name, operations[p.name], p.shape, p.dtype, Stats.from_values(row), p.tensor, sample)
        for p, row, sample in zip(pending, stats_rows, samples)
    ]
    summary = None
    if attention:
        preview = attention.get("preview")
        summary = AttentionSummary(
            shape=attention["shape"],
            causal=config.causal,
            future_weight_sum=attention["future_weight_sum"].item(),
            entropy_per_head=attention["entropy_per_head"].tolist(),
            max_weight=attention["max_weight"].item(),
            max_logit=attention["max_logit"].item(),
            preview=preview.double().tolist() if preview is not None else None,
            tensor=attention.get("tensor"),
        )
    return Trace(config, records[0], records[1:], summary, output)
