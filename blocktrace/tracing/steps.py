"""Where the steps live in a block: ours, a known layout, or the user's own names.

A step is the output of a submodule, or the input of one (the residual sums of a block
that adds them inline are the inputs of the step that reads them next), or the output of the
block itself. The residual steps are recovered from the wiring (blocktrace.wiring), so the
user's code is never changed: under Pre-LN residual1 is the input of norm2 and residual2 the
block's output; under Post-LN residual1 is the input of norm1 and residual2 that of norm2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from torch import nn

from blocktrace.errors import UsageError
from blocktrace.sources.families import HF_LAYERS, HFLayer
from blocktrace.sources.families.gpt2 import GPT2_STEPS
from blocktrace.tracing.calling import hf_causal
from blocktrace.vocab import Capture, Norm, Placement, RouterKind
from blocktrace.wiring import PRE, Kind, Wiring, wiring_of


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
    wiring: Wiring  # which step reads which: the residual sums recovered, what the probes check
    causal: Optional[bool]  # None: the block's own mask decides; the leak check is skipped
    specs: tuple[StepSpec, ...]
    norm: Norm = Norm.LAYERNORM
    hidden: Optional[str] = None  # the FFN activation module, for the dead-unit checks
    weights_path: Optional[str] = None  # the module whose output tuple holds the attention weights
    batched: bool = False  # the block wants [B, T, d] (HF layers, nanoGPT): [T, d] input gets a batch of one
    router: Optional[str] = None  # a mixture of experts' router module (HF's TopKRouter: logits first, top_k)
    router_kind: RouterKind = RouterKind.SOFTMAX  # how that router's logits become probabilities
    router_logits_at: int = 0  # where the logits are in the router's output tuple
    residual_multiplier: Optional[str] = None  # the layer's attribute scaling each sublayer's output in its residual

    def spec(self, name: str) -> Optional[StepSpec]:
        return next((spec for spec in self.specs if spec.name == name), None)

    @property
    def placement(self) -> Placement:
        return self.wiring.placement

    @property
    def derived(self) -> tuple[tuple[str, str, str], ...]:
        """Sums the block never materialises, added by blocktrace from two steps it does: (name, stream, update)."""
        found = {spec.name for spec in self.specs}
        return tuple((step.name, *step.reads) for step in self.wiring.steps
                     if step.kind is Kind.RESIDUAL and step.name not in found)

    @property
    def attention_path(self) -> str:
        return self.weights_path if self.weights_path is not None else self.spec("attn").path


def recover_specs(names: dict[str, str], wiring: Wiring) -> tuple[StepSpec, ...]:
    """Specs for a block whose sublayers and norms are the submodules named in `names`; each residual sum is the
    input of the named step that reads it next, the block's output, or else summed by blocktrace (`derived`)."""
    needed = [step.name for step in wiring.steps if step.kind is not Kind.RESIDUAL]
    missing = [name for name in needed if name not in names]
    unknown = [name for name in names if name not in needed]
    if missing or unknown:
        raise UsageError(f"step names must give {', '.join(needed)} under {wiring.name} wiring "
                         f"(missing: {', '.join(missing) or 'none'}; unknown: {', '.join(unknown) or 'none'})")
    specs = []
    for step in wiring.steps:
        reader = wiring.first_reader(step.name)
        if step.name in names:
            specs.append(StepSpec(step.name, names[step.name]))
        elif step.name == wiring.output:
            specs.append(StepSpec(step.name, ""))
        elif reader is not None and reader.name in names:
            specs.append(StepSpec(step.name, names[reader.name], Capture.INPUT))
    return tuple(specs)


def _layout(name, wiring, causal, names, norm=Norm.LAYERNORM, hidden=None, weights=None, batched=False,
            router=None, router_kind=RouterKind.SOFTMAX, router_logits_at=0, residual_multiplier=None) -> Layout:
    return Layout(name, wiring, causal, recover_specs(names, wiring), norm, hidden, weights, batched, router,
                  router_kind, router_logits_at, residual_multiplier)


def _hf_layout(class_name: str, layer: HFLayer, parallel: bool) -> Layout:
    # Causal by default; the layer's own attention says otherwise (detect_layout reads its is_causal).
    wiring, label = (layer.parallel_wiring, f"{class_name} (parallel residual)") if parallel else \
        (layer.wiring, class_name)
    needed = {step.name for step in wiring.steps}  # a parallel layer holds no second norm (StableLM's is None)
    steps = {name: path for name, path in layer.steps.items() if name in needed}
    return _layout(f"HuggingFace {label}", wiring, True, steps, layer.norm, layer.hidden, layer.weights,
                   batched=True, router=layer.router, router_kind=layer.router_kind,
                   router_logits_at=layer.router_logits_at,
                   residual_multiplier=layer.residual_multiplier)


# Layouts recognised by their submodule names when the class name is not known.
NAMED_LAYOUTS = (
    ("nanoGPT-style Block (ln_1/attn/ln_2/mlp)", GPT2_STEPS, True),
    ("tutorial block (ln1/attn/ln2/ffn)", {"norm1": "ln1", "attn": "attn", "norm2": "ln2", "ffn": "ffn"}, False),
    # Raschka, "Build a Large Language Model (From Scratch)", chapter 4's TransformerBlock: a GPT decoder block
    ("LLMs-from-scratch TransformerBlock (norm1/att/norm2/ff)",
     {"norm1": "norm1", "attn": "att", "norm2": "norm2", "ffn": "ff"}, True),
)


def _known(block: nn.Module) -> Optional[Layout]:
    """The layout of a HuggingFace decoder layer whose family blocktrace reads (sources.families.HF_LAYERS), known
    by its module and class where its class name is another's too (GPT-1's Block), else by its class name."""
    class_name = type(block).__name__
    layer = HF_LAYERS.get(f"{type(block).__module__}.{class_name}") or HF_LAYERS.get(class_name)
    if layer is None:
        return None

    if layer.untraceable is not None and dict(block.named_modules()).get(layer.untraceable[0]) is not None:
        raise UsageError(f"cannot trace {class_name} as it is: {layer.untraceable[1]}; trace its checkpoint "
                         "instead (blocktrace run/check --weights DIR), which computes the same numbers")
    parallel = layer.parallel_flag is not None and bool(getattr(block, layer.parallel_flag, False))
    layout = _hf_layout(class_name, dataclasses.replace(layer, steps=_present_steps(block, layer.steps)), parallel)
    causal = hf_causal(block)
    return dataclasses.replace(layout, causal=layout.causal if causal is None else causal)


def _present_steps(block: nn.Module, steps: dict[str, str]) -> dict[str, str]:
    """A step a hybrid family's layers hold under one of several names ("self_attn|conv": LFM2's token mixer is
    attention in some layers, a convolution in others) named as this layer holds it."""
    children = dict(block.named_modules())
    return {name: next((p for p in path.split("|") if p in children), path.split("|")[0])
            for name, path in steps.items()}


def detect_layout(block: nn.Module) -> Layout:
    """The layout of a known block class, or one recognised by its submodule names."""
    known = _known(block)
    if known is not None:
        return known
    children = dict(block.named_modules())
    for label, names, batched in NAMED_LAYOUTS:
        if all(path in children for path in names.values()):
            # nanoGPT's blocks are GPT decoder blocks: meant to be causal (measured, see diagnose.behaviour)
            return _layout(label, PRE, True if batched else None, names, batched=batched)
    names = ", ".join([*HF_LAYERS, *(label for label, _, _ in NAMED_LAYOUTS)])
    raise UsageError(f"cannot tell the steps of {type(block).__name__}: name them, e.g. "
                     f"steps={{'norm1': 'ln_1', 'attn': 'attn', 'norm2': 'ln_2', 'ffn': 'mlp'}} "
                     f"(known layouts: {names})")


def user_layout(block: nn.Module, steps: Optional[dict[str, str]], placement: Placement = Placement.PRE) -> Layout:
    if steps is None:
        return detect_layout(block)
    return _layout(f"{type(block).__name__} (named steps)", wiring_of(placement), None, steps)


def own_layout(block) -> Layout:
    """The layout of blocktrace's own TransformerBlock: every step is a module of its own."""
    config = block.config
    specs = tuple(StepSpec(name, name) for name in block.step_modules())
    hidden = None if config.experts is not None else "ffn.hidden"  # dead units are judged expert by expert: not yet
    return Layout("blocktrace TransformerBlock", config.wiring, config.causal, specs, config.norm, hidden)


def resolve(block: nn.Module, spec: StepSpec) -> nn.Module:
    try:
        return block.get_submodule(spec.path) if spec.path else block
    except AttributeError:
        raise UsageError(f"{type(block).__name__} has no submodule {spec.path!r} for step {spec.name}") from None
