"""What a trace holds: per-step statistics, the attention summary, and the block it came from.

Plain data, filled by tracing.tracer and read by the checks and the renderers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from blocktrace.config import BlockConfig
from blocktrace.tracing.behaviour import CausalBehaviour, NormBehaviour
from blocktrace.tracing.routing import RoutingSummary
from blocktrace.tracing.stats import STAT_NAMES
from blocktrace.vocab import Placement
from blocktrace.wiring import PRE, Wiring


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


@dataclass(frozen=True)
class FFNActivity:
    """The FFN's hidden units over the traced tokens."""

    dead_fraction: float  # units never active for any token
    flat_fraction: float  # activations where the nonlinearity is flat (measured past half the units dead, else 0)
    units: int
    tokens: int


@dataclass(frozen=True)
class Probe:
    """What the health checks measured at one step (a trace with checks); None where it does not apply."""

    token_sq_median: Optional[float] = None  # the block's output: the median over tokens of ‖x‖²/d
    # residual steps: ‖output − (α·stream + m·update)‖ / ‖output‖, or, where dropout before the add fits better,
    # the mismatch of its identity (tracing.probes._dropped_out_mismatch)
    residual_mismatch: Optional[float] = None
    update_ratio: Optional[float] = None  # residual steps: ‖update‖ / ‖stream‖
    massive_ratio: Optional[float] = None  # residual steps whose max |x| exceeds 100: max |x| / median |x|
    inputs_finite: Optional[list[bool]] = None  # a step that is not finite: which of its inputs were
    ffn: Optional[FFNActivity] = None  # the ffn step
    norm: Optional[NormBehaviour] = None  # norm steps: what the norm measurably does
    causal: Optional[CausalBehaviour] = None  # the attn step of a user's block: measured by perturbation


@dataclass
class StepRecord:
    name: str
    operation: str
    shape: tuple[int, ...]
    dtype: str
    stats: Stats
    tensor: Optional[torch.Tensor] = None  # only when the trace keeps tensors
    sample: Optional[list[float]] = None  # the first values of one token's vector
    probe: Probe = field(default_factory=Probe)  # health-check measurements (checks=True; else empty)


@dataclass
class AttentionSummary:
    shape: tuple[int, ...]
    causal: Optional[bool]  # None: unknown (the user's block applies its own mask)
    future_weight_sum: float
    entropy_per_head: list[float]
    max_weight: float
    max_logit: Optional[float]  # largest pre-softmax score (masked entries excluded); None if not visible
    uniform_entropy: float = 0.0  # the entropy of uniform attention over the keys each query may see
    # per head, the mean weight a query puts on the first key, on itself and on the key just before it
    first_weight: list[float] = field(default_factory=list)
    self_weight: list[float] = field(default_factory=list)
    previous_weight: list[float] = field(default_factory=list)
    preview: Optional[list] = None  # [H][T][T] weights of the first sequence, for small T
    tensor: Optional[torch.Tensor] = None
    # for longer inputs, when asked: [H][G][G] the first sequence's weights pooled, each cell the largest weight of
    # its map_cell × map_cell block of queries and keys
    map: Optional[list] = None
    map_cell: Optional[int] = None
    # the number the block's own code scaled q·kᵀ by, and q's width it contracted (None: not seen — sdpa, or a
    # scale folded into q)
    score_scale: Optional[float] = None
    head_dim: Optional[int] = None
    # the same layer's largest logit at the record before (a Watch), to tell a logit still growing from one that
    # has settled; None where there is none to compare
    earlier_max_logit: Optional[float] = None


@dataclass
class Trace:
    config: Optional[BlockConfig]  # None for a user's block
    input: StepRecord  # the block input x, as a pseudo-step
    steps: list[StepRecord] = field(default_factory=list)  # in execution order
    attention: Optional[AttentionSummary] = None
    output: Optional[torch.Tensor] = None
    module: str = "blocktrace TransformerBlock"  # the block traced: its layout's name
    wiring: Wiring = PRE  # which step reads which (blocktrace.wiring)
    missing: list[str] = field(default_factory=list)  # steps whose hooks never fired
    notes: list[str] = field(default_factory=list)  # what could not be seen, and why
    substeps: list[StepRecord] = field(default_factory=list)  # inside attn: q and k around QK-norm and RoPE
    expected_causal: Optional[bool] = None  # what the block is meant to be (its layout or config); None: unknown
    routing: Optional[RoutingSummary] = None  # a mixture of experts' router: what it did with the tokens
    # a user's attention: (the axis its softmax normalised, the axis a product then summed the weights over) where
    # the two differ (tracing/softmax.py); None where they agree or were not seen
    contracted_elsewhere: Optional[tuple[int, int]] = None

    @property
    def placement(self) -> Placement:
        return self.wiring.placement

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
        return {"module": self.module, "placement": self.placement.value, "causal": self.expected_causal}

    def tensors(self) -> dict[str, torch.Tensor]:
        """Kept tensors by their step names, plus `x` and `attn_weights` (needs keep_tensors)."""
        kept = {"x": self.input.tensor, **{s.name: s.tensor for s in [*self.steps, *self.substeps]}}
        if self.attention is not None:
            kept["attn_weights"] = self.attention.tensor
        missing = [name for name, tensor in kept.items() if tensor is None]
        if missing:
            raise ValueError(f"tensors were not kept for {missing}: trace with keep_tensors=True")
        return kept
