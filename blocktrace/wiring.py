"""The block's wiring, described once: for each placement, which step reads which.

Everything in blocktrace that depends on how a block is wired reads this table and nothing
else: the block builds and runs its steps from it (model/block), its formulas are written from
it (model/block.step_operations), the step finder recovers a user block's residual sums from it
(tracing/steps), the probes check each residual against the two steps it adds (tracing/probes),
the explanations are chosen by it (render/words) and compare describes a wiring with it.

Torch-free, like vocab: the CLI reads it without paying for `import torch`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from blocktrace.vocab import Choice, Parallel, Placement

INPUT = "x"  # what the block receives: the first step reads it


class Kind(Choice):
    """What a step computes."""

    NORM = "norm"
    ATTENTION = "attention"
    FFN = "ffn"
    RESIDUAL = "residual"  # α·stream + update: reads (stream, update)


@dataclass(frozen=True)
class Step:
    name: str  # one of vocab.STEP_NAMES or vocab.SANDWICH_STEPS
    kind: Kind
    reads: tuple[str, ...]  # the steps (or INPUT) whose outputs it takes, in argument order
    value: str  # the tutorials' name for its output: x_norm1, attn_out, x1, ...
    note: str = ""  # said after its formula, where the wiring surprises


@dataclass(frozen=True)
class Wiring:
    name: str
    placement: Placement
    steps: tuple[Step, ...]  # in execution order; the last one's output is the block's
    summary: str  # what the wiring does to the stream, in one sentence (compare's description)
    flag: str = ""  # the command-line flag that chooses it (run, check, compare); "" where a config sets it
    help: str = ""  # that flag's --help

    @cached_property
    def order(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    @property
    def output(self) -> str:
        """The step whose output is the block's."""
        return self.steps[-1].name

    @property
    def stream_normalised(self) -> bool:
        """Whether the block's output is a norm's (Post-LN, DeepNorm): the stream is rescaled every block."""
        return self.steps[-1].kind is Kind.NORM

    @property
    def updates_normalised(self) -> bool:
        """Whether every residual add's update is a norm's output (sandwich, reordered): each add moves ‖x‖/√d by at
        most that norm's largest |gain| (the triangle inequality), so the stream grows only as far as the gains allow."""
        kinds = {step.name: step.kind for step in self.steps}
        return all(kinds.get(step.reads[1]) is Kind.NORM for step in self.steps if step.kind is Kind.RESIDUAL)

    @cached_property  # read at every traced step: built once per wiring
    def residual_sources(self) -> dict[str, tuple[str, str]]:
        """Each residual step's (stream, update)."""
        return {step.name: step.reads for step in self.steps if step.kind is Kind.RESIDUAL}

    @cached_property
    def summands(self) -> frozenset[str]:
        """The values the residual sums add (held while tracing until their sums are checked)."""
        return frozenset(source for sources in self.residual_sources.values() for source in sources)

    def step(self, name: str) -> Step:
        return next(step for step in self.steps if step.name == name)

    def value_of(self, name: str) -> str:
        return INPUT if name == INPUT else self.step(name).value

    def first_reader(self, name: str) -> Step | None:
        """The first step that takes `name` as its first argument (where a block that adds inline shows a sum)."""
        return next((step for step in self.steps if step.reads[0] == name), None)

    def last_reads(self) -> tuple[tuple[str, ...], ...]:
        """For each step, the values no later step reads (the block's output excepted): free to drop after it."""
        seen, released = {self.output}, []
        for step in reversed(self.steps):
            released.append(tuple(name for name in dict.fromkeys(step.reads) if name not in seen))
            seen.update(step.reads)
        return tuple(reversed(released))


def _norm(name, source, value, note=""):
    return Step(name, Kind.NORM, (source,), value, note)


def _sum(name, stream, update, value, note=""):
    return Step(name, Kind.RESIDUAL, (stream, update), value, note)


_ATTN = Step("attn", Kind.ATTENTION, (INPUT,), "attn_out")
_GROWS = "the residual stream carries x plus every update unnormalised, so its scale can grow from block to block"
PRE = Wiring("pre", Placement.PRE, (
    _norm("norm1", INPUT, "x_norm1"), Step("attn", Kind.ATTENTION, ("norm1",), "attn_out"),
    _sum("residual1", INPUT, "attn", "x1"),
    _norm("norm2", "residual1", "x_norm2"), Step("ffn", Kind.FFN, ("norm2",), "ffn_out"),
    _sum("residual2", "residual1", "ffn", "x2"),
), f"pre: the norm sits before each sublayer and {_GROWS}", "--pre-ln",
    "Norm before each sublayer (GPT-2, Llama).  [default]")
# GPT-NeoX, GPT-J: both sublayers read the block's input; the block adds both updates at once.
PARALLEL = Wiring("pre (parallel residual)", Placement.PRE, (
    _norm("norm1", INPUT, "x_norm1"), Step("attn", Kind.ATTENTION, ("norm1",), "attn_out"),
    _sum("residual1", INPUT, "attn", "x1"),
    _norm("norm2", INPUT, "x_norm2", "(parallel: reads x, not x1)"), Step("ffn", Kind.FFN, ("norm2",), "ffn_out"),
    _sum("residual2", "residual1", "ffn", "x2", "(= x + attn_out + ffn_out)"),
), f"pre with a parallel residual: both sublayers read the block's input x and {_GROWS}")
# Cohere: the same, with one norm for both sublayers — the FFN reads x_norm1, and there is no norm2.
PARALLEL_ONE_NORM = Wiring("pre (parallel residual, one norm)", Placement.PRE, (
    _norm("norm1", INPUT, "x_norm1"), Step("attn", Kind.ATTENTION, ("norm1",), "attn_out"),
    _sum("residual1", INPUT, "attn", "x1"),
    Step("ffn", Kind.FFN, ("norm1",), "ffn_out", "(parallel: reads x_norm1, as attn does)"),
    _sum("residual2", "residual1", "ffn", "x2", "(= x + attn_out + ffn_out)"),
), f"pre with a parallel residual under one norm: both sublayers read norm1(x) and {_GROWS}")
_POST_STEPS = (
    _ATTN, _sum("residual1", INPUT, "attn", "r1"), _norm("norm1", "residual1", "x1"),
    Step("ffn", Kind.FFN, ("norm1",), "ffn_out"), _sum("residual2", "norm1", "ffn", "r2"),
    _norm("norm2", "residual2", "x2"),
)
POST = Wiring("post", Placement.POST, _POST_STEPS, "post: the norm sits after each residual add, so the stream is "
              "rescaled to unit size per token after every sublayer", "--post-ln",
              "Norm after each residual add (original Transformer, BERT).")
DEEPNORM = Wiring("deepnorm", Placement.DEEPNORM, _POST_STEPS,  # Post-LN with α·stream in each add
                  "deepnorm: post-LN with the stream multiplied by α before each add (and the FFN, V and O weights "
                  "scaled by β at init), so each update is small against the stream", "--deepnorm",
                  "Post-LN with the stream scaled by α = (2N)^¼ (Wang et al. 2022).")
SANDWICH = Wiring("sandwich", Placement.SANDWICH, (
    _norm("norm1", INPUT, "x_norm1"), Step("attn", Kind.ATTENTION, ("norm1",), "attn_out"),
    _norm("post_attn_norm", "attn", "attn_normed"), _sum("residual1", INPUT, "post_attn_norm", "x1"),
    _norm("norm2", "residual1", "x_norm2"), Step("ffn", Kind.FFN, ("norm2",), "ffn_out"),
    _norm("post_ffn_norm", "ffn", "ffn_normed"), _sum("residual2", "residual1", "post_ffn_norm", "x2"),
), "sandwich (Peri-LN, Gemma-2): a norm before and after each sublayer; the stream carries x plus normalised "
   "updates, so each update has a bounded size while the stream itself is never rescaled", "--sandwich",
   "A norm before and after each sublayer (Peri-LN, Gemma-2).")
REORDERED = Wiring("reordered", Placement.REORDERED, (
    _ATTN, _norm("norm1", "attn", "attn_normed"), _sum("residual1", INPUT, "norm1", "x1"),
    Step("ffn", Kind.FFN, ("residual1",), "ffn_out"), _norm("norm2", "ffn", "ffn_normed"),
    _sum("residual2", "residual1", "norm2", "x2"),
), "reordered (OLMo-2): a norm after each sublayer, before its add; the sublayers read the raw stream and the "
   "stream carries x plus normalised updates", "--reordered",
   "A norm after each sublayer, before its residual add: x + norm(f(x)) (OLMo-2).")

WIRINGS = {wiring.placement: wiring for wiring in (PRE, POST, DEEPNORM, SANDWICH, REORDERED)}


def flag_parameter(wiring: Wiring) -> str:
    """The name click gives the wiring's flag: --pre-ln -> pre_ln."""
    return wiring.flag.lstrip("-").replace("-", "_")


def wiring_of(placement: Placement, parallel: Parallel = Parallel.OFF) -> Wiring:
    return {Parallel.TWO_NORMS: PARALLEL, Parallel.ONE_NORM: PARALLEL_ONE_NORM}.get(parallel) \
        or WIRINGS[Placement(placement)]
