"""Where the six steps live in a block: ours, a known layout, or the user's own names.

A step is the output of a submodule, or the input of one (the residual sums of a block
that adds them inline are the inputs of the next norm), or the output of the block itself.
The residual steps are recovered from the wiring, so the user's code is never changed:
Pre-LN: residual1 = input of norm2, residual2 = block output;
Post-LN: residual1 = input of norm1, residual2 = input of norm2, norm2 = block output.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from torch import nn

from blocktrace.errors import UsageError
from blocktrace.vocab import STEP_NAMES, Capture, Norm, Placement

SUBLAYER_STEPS = ("norm1", "attn", "norm2", "ffn")
# Which earlier steps each residual sum adds: (stream, update), by wiring.
_PRE_SOURCES = {"residual1": ("x", "attn"), "residual2": ("residual1", "ffn")}
_POST_SOURCES = {"residual1": ("x", "attn"), "residual2": ("norm1", "ffn")}
RESIDUAL_SOURCES = {
    Placement.PRE: _PRE_SOURCES,  # a parallel residual adds the same two
    Placement.POST: _POST_SOURCES,
    Placement.DEEPNORM: _POST_SOURCES,  # α·stream + update
    Placement.SANDWICH: {"residual1": ("x", "post_attn_norm"), "residual2": ("residual1", "post_ffn_norm")},
    Placement.REORDERED: {"residual1": ("x", "norm1"), "residual2": ("residual1", "norm2")},
}


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
    batched: bool = False  # the block wants [B, T, d] (HF layers, nanoGPT): [T, d] input gets a batch of one
    # Steps the block never materialises, summed by blocktrace from two it does: (name, stream, update).
    derived: tuple[tuple[str, str, str], ...] = ()
    router: Optional[str] = None  # a mixture of experts' router module (HF's TopKRouter: logits first, top_k)

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
    elif placement is Placement.REORDERED:  # x1 = x + norm1(attn(x)) is what the FFN reads
        specs += [StepSpec("residual1", names["ffn"], Capture.INPUT), StepSpec("residual2", "")]
    else:
        specs += [StepSpec("residual1", names["norm2"], Capture.INPUT), StepSpec("residual2", "")]
    return tuple(specs)


def _layout(name, placement, causal, names, norm=Norm.LAYERNORM, hidden=None, specs=None, weights=None,
            batched=False, derived=(), router=None) -> Layout:
    return Layout(name, placement, causal, specs or recover_specs(names, placement), norm, hidden, weights, batched,
                  derived, router)


_GPT2_NAMES = {"norm1": "ln_1", "attn": "attn", "norm2": "ln_2", "ffn": "mlp"}
_BERT_SPECS = (
    StepSpec("attn", "attention.output.dense"),  # self-attention and its output projection
    StepSpec("residual1", "attention.output.LayerNorm", Capture.INPUT),
    StepSpec("norm1", "attention.output.LayerNorm"),
    StepSpec("ffn", "output.dense"),  # intermediate (W1 + GELU) then output.dense (W2)
    StepSpec("residual2", "output.LayerNorm", Capture.INPUT),
    StepSpec("norm2", "output.LayerNorm"),
)

_LLAMA_NAMES = {"norm1": "input_layernorm", "attn": "self_attn", "norm2": "post_attention_layernorm", "ffn": "mlp"}
_GEMMA2_SPECS = (  # four norms: before and after each sublayer
    StepSpec("norm1", "input_layernorm"), StepSpec("attn", "self_attn"),
    StepSpec("post_attn_norm", "post_attention_layernorm"), StepSpec("residual1", "pre_feedforward_layernorm", Capture.INPUT),
    StepSpec("norm2", "pre_feedforward_layernorm"), StepSpec("ffn", "mlp"),
    StepSpec("post_ffn_norm", "post_feedforward_layernorm"), StepSpec("residual2", ""),
)
_OLMO2_SPECS = (  # the norms after the sublayers; the FFN reads x1 = x + norm1(attn(x))
    StepSpec("attn", "self_attn"), StepSpec("norm1", "post_attention_layernorm"), StepSpec("residual1", "mlp", Capture.INPUT),
    StepSpec("ffn", "mlp"), StepSpec("norm2", "post_feedforward_layernorm"), StepSpec("residual2", ""),
)
_NEOX_NAMES = {"norm1": "input_layernorm", "attn": "attention", "norm2": "post_attention_layernorm", "ffn": "mlp"}
_NEOX_PARALLEL_SPECS = (  # x + attn(ln1(x)) + mlp(ln2(x)) in one sum: residual1 is blocktrace's x + attn_out
    StepSpec("norm1", "input_layernorm"), StepSpec("attn", "attention"), StepSpec("norm2", "post_attention_layernorm"),
    StepSpec("ffn", "mlp"), StepSpec("residual2", ""),
)


def _hf(name, placement, names, **extra) -> Layout:
    # Causal by default; the layer's own attention says otherwise (detect_layout reads its is_causal).
    return _layout(f"HuggingFace {name}", placement, True, names, batched=True, **extra)


KNOWN_LAYOUTS = {
    "GPT2Block": _hf("GPT2Block", Placement.PRE, _GPT2_NAMES, hidden="mlp.act"),
    "BertLayer": _hf("BertLayer", Placement.POST, {}, specs=_BERT_SPECS, hidden="intermediate.intermediate_act_fn",
                     weights="attention.self"),
    **{name: _hf(name, Placement.PRE, _LLAMA_NAMES, norm=Norm.RMSNORM, hidden="mlp.act_fn")
       for name in ("LlamaDecoderLayer", "MistralDecoderLayer", "Qwen2DecoderLayer", "Qwen3DecoderLayer",
                    "GemmaDecoderLayer")},
    # Mixtures of experts: the FFN step is the whole sparse block (router, experts, shared expert).
    **{name: _hf(name, Placement.PRE, _LLAMA_NAMES, norm=Norm.RMSNORM, router="mlp.gate")
       for name in ("MixtralDecoderLayer", "Qwen2MoeDecoderLayer", "Qwen3MoeDecoderLayer", "OlmoeDecoderLayer")},
    "Phi3DecoderLayer": _hf("Phi3DecoderLayer", Placement.PRE, _LLAMA_NAMES, norm=Norm.RMSNORM,
                            hidden="mlp.activation_fn"),
    **{name: _hf(name, Placement.SANDWICH, {}, specs=_GEMMA2_SPECS, norm=Norm.RMSNORM, hidden="mlp.act_fn")
       for name in ("Gemma2DecoderLayer", "Gemma3DecoderLayer")},
    "Olmo2DecoderLayer": _hf("Olmo2DecoderLayer", Placement.REORDERED, {}, specs=_OLMO2_SPECS, norm=Norm.RMSNORM,
                             hidden="mlp.act_fn"),
    "GPTNeoXLayer": _hf("GPTNeoXLayer", Placement.PRE, _NEOX_NAMES, hidden="mlp.act"),
    "GPTNeoXLayer (parallel residual)": _hf("GPTNeoXLayer (parallel residual)", Placement.PRE, {},
                                            specs=_NEOX_PARALLEL_SPECS, hidden="mlp.act",
                                            derived=(("residual1", "x", "attn"),)),
}
# Layouts recognised by their submodule names when the class name is not known.
NAMED_LAYOUTS = (
    ("nanoGPT-style Block (ln_1/attn/ln_2/mlp)", _GPT2_NAMES, True),
    ("tutorial block (ln1/attn/ln2/ffn)", {"norm1": "ln1", "attn": "attn", "norm2": "ln2", "ffn": "ffn"}, False),
)


def _known(block: nn.Module) -> Optional[Layout]:
    name = type(block).__name__
    if name == "GPTNeoXLayer" and getattr(block, "use_parallel_residual", False):
        name = "GPTNeoXLayer (parallel residual)"
    layout = KNOWN_LAYOUTS.get(name)
    if layout is not None:
        from blocktrace.tracing.calling import hf_causal

        causal = hf_causal(block)
        return dataclasses.replace(layout, causal=layout.causal if causal is None else causal)
    return None


def detect_layout(block: nn.Module) -> Layout:
    """The layout of a known block class, or one recognised by its submodule names."""
    known = _known(block)
    if known is not None:
        return known
    children = dict(block.named_modules())
    for label, names, batched in NAMED_LAYOUTS:
        if all(path in children for path in names.values()):
            # nanoGPT's blocks are GPT decoder blocks: meant to be causal (measured, see diagnose.behaviour)
            return _layout(label, Placement.PRE, True if batched else None, names, batched=batched)
    names = ", ".join([*(n for n in KNOWN_LAYOUTS if "(" not in n), *(label for label, _, _ in NAMED_LAYOUTS)])
    raise UsageError(f"cannot tell the steps of {type(block).__name__}: name them, e.g. "
                     f"steps={{'norm1': 'ln_1', 'attn': 'attn', 'norm2': 'ln_2', 'ffn': 'mlp'}} "
                     f"(known layouts: {names})")


def user_layout(block: nn.Module, steps: Optional[dict[str, str]], placement: Placement = Placement.PRE) -> Layout:
    if steps is None:
        return detect_layout(block)
    return _layout(f"{type(block).__name__} (named steps)", placement, None, steps)


def own_layout(block) -> Layout:
    """The layout of blocktrace's own TransformerBlock: every step is a module of its own."""
    config = block.config
    specs = tuple(StepSpec(name, name) for name in block.step_modules())
    hidden = None if config.n_experts else "ffn.hidden"  # dead units are judged expert by expert: not yet
    return Layout("blocktrace TransformerBlock", config.placement, config.causal, specs, config.norm, hidden)


def resolve(block: nn.Module, spec: StepSpec) -> nn.Module:
    try:
        return block.get_submodule(spec.path) if spec.path else block
    except AttributeError:
        raise UsageError(f"{type(block).__name__} has no submodule {spec.path!r} for step {spec.name}") from None
