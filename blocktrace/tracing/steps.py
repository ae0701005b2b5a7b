"""Where the six steps live in a block: ours, a known layout, or the user's own names.

A step is the output of a submodule, or the input of one (the residual sums of a block
that adds them inline are the inputs of the next norm), or the output of the block itself.
The residual steps are recovered from the wiring, so the user's code is never changed:
Pre-LN: residual1 = input of norm2, residual2 = block output;
Post-LN: residual1 = input of norm1, residual2 = input of norm2, norm2 = block output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from blocktrace.errors import UsageError
from blocktrace.vocab import STEP_NAMES, Capture, Norm, Placement

SUBLAYER_STEPS = ("norm1", "attn", "norm2", "ffn")


@dataclass(frozen=True)
class StepSpec:
    name: str  # one of STEP_NAMES
    path: str  # submodule path; "" is the block itself
    capture: Capture = Capture.OUTPUT  # what the module returns, or its first argument

    def describe(self) -> str:
        if not self.path:
            return "block output"
        return f"{self.capture} of {self.path}"


@dataclass(frozen=True)
class Layout:
    name: str
    placement: Placement  # which residual sums to recover, and how
    causal: Optional[bool]  # None: the block's own mask decides; the leak check is skipped
    specs: tuple[StepSpec, ...]
    norm: Norm = Norm.LAYERNORM
    hidden: Optional[str] = None  # the FFN activation module, for the dead-unit checks
    weights_path: Optional[str] = None  # the module whose output tuple holds the attention weights

    def spec(self, name: str) -> Optional[StepSpec]:
        return next((spec for spec in self.specs if spec.name == name), None)

    @property
    def attention_path(self) -> str:
        return self.weights_path if self.weights_path is not None else self.spec("attn").path


def recover_specs(names: dict[str, str], placement: Placement) -> tuple[StepSpec, ...]:
    """Specs for a block whose norm1/attn/norm2/ffn submodules are named in `names`."""
    missing = [step for step in SUBLAYER_STEPS if step not in names]
    unknown = [step for step in names if step not in STEP_NAMES]
    if missing or unknown:
        raise UsageError(f"step names must give norm1, attn, norm2 and ffn "
                         f"(missing: {', '.join(missing) or 'none'}; unknown: {', '.join(unknown) or 'none'})")
    specs = [StepSpec(step, names[step]) for step in SUBLAYER_STEPS]
    if placement.norm_after_add:
        specs += [StepSpec("residual1", names["norm1"], Capture.INPUT),
                  StepSpec("residual2", names["norm2"], Capture.INPUT)]
    else:
        specs += [StepSpec("residual1", names["norm2"], Capture.INPUT), StepSpec("residual2", "")]
    return tuple(specs)


def _layout(name, placement, causal, names, norm=Norm.LAYERNORM, hidden=None, specs=None, weights=None) -> Layout:
    return Layout(name, placement, causal, specs or recover_specs(names, placement), norm, hidden, weights)


_GPT2_NAMES = {"norm1": "ln_1", "attn": "attn", "norm2": "ln_2", "ffn": "mlp"}
_BERT_SPECS = (
    StepSpec("attn", "attention.output.dense"),  # self-attention and its output projection
    StepSpec("residual1", "attention.output.LayerNorm", Capture.INPUT),
    StepSpec("norm1", "attention.output.LayerNorm"),
    StepSpec("ffn", "output.dense"),  # intermediate (W1 + GELU) then output.dense (W2)
    StepSpec("residual2", "output.LayerNorm", Capture.INPUT),
    StepSpec("norm2", "output.LayerNorm"),
)

KNOWN_LAYOUTS = {
    # Causal: called without its mask such a block attends to later tokens, and the leak check says so.
    "GPT2Block": _layout("HuggingFace GPT2Block", Placement.PRE, True, _GPT2_NAMES, hidden="mlp.act"),
    "BertLayer": _layout("HuggingFace BertLayer", Placement.POST, False, {}, specs=_BERT_SPECS,
                         hidden="intermediate.intermediate_act_fn", weights="attention.self"),
    "LlamaDecoderLayer": _layout("HuggingFace LlamaDecoderLayer", Placement.PRE, True,
                                 {"norm1": "input_layernorm", "attn": "self_attn", "norm2": "post_attention_layernorm",
                                  "ffn": "mlp"}, norm=Norm.RMSNORM, hidden="mlp.act_fn"),
}
# Layouts recognised by their submodule names when the class name is not known.
NAMED_LAYOUTS = (
    ("nanoGPT-style Block (ln_1/attn/ln_2/mlp)", _GPT2_NAMES),
    ("tutorial block (ln1/attn/ln2/ffn)", {"norm1": "ln1", "attn": "attn", "norm2": "ln2", "ffn": "ffn"}),
)


def detect_layout(block: nn.Module) -> Layout:
    """The layout of a known block class, or one recognised by its submodule names."""
    name = type(block).__name__
    if name in KNOWN_LAYOUTS:
        return KNOWN_LAYOUTS[name]
    children = dict(block.named_modules())
    for label, names in NAMED_LAYOUTS:
        if all(path in children for path in names.values()):
            return _layout(label, Placement.PRE, None, names)
    known = ", ".join([*KNOWN_LAYOUTS, *(label for label, _ in NAMED_LAYOUTS)])
    raise UsageError(f"cannot tell the steps of {name}: name them, e.g. "
                     f"steps={{'norm1': 'ln_1', 'attn': 'attn', 'norm2': 'ln_2', 'ffn': 'mlp'}} "
                     f"(known layouts: {known})")


def user_layout(block: nn.Module, steps: Optional[dict[str, str]], placement: Placement = Placement.PRE) -> Layout:
    if steps is None:
        return detect_layout(block)
    return _layout(f"{type(block).__name__} (named steps)", placement, None, steps)


def own_layout(block) -> Layout:
    """The layout of blocktrace's own TransformerBlock: every step is a module of its own."""
    config = block.config
    specs = tuple(StepSpec(name, name) for name in STEP_NAMES)
    return Layout("blocktrace TransformerBlock", config.placement, config.causal, specs, config.norm, "ffn.hidden")


def resolve(block: nn.Module, spec: StepSpec) -> nn.Module:
    try:
        return block.get_submodule(spec.path) if spec.path else block
    except AttributeError:
        raise UsageError(f"{type(block).__name__} has no submodule {spec.path!r} for step {spec.name}") from None
