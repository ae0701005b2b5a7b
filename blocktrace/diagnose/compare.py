"""Two variants of one design axis, on the same parameters and the same input.

Every variant is built empty and filled from one shared source: the seeded base stack, or
the checkpoint's own layers. Parameters with the same role (and shape) are copied; those
only one variant has (RMSNorm has no shift, SwiGLU has a gate) keep their seeded values and
are listed. DeepNorm then scales its FFN, V and O weights by β, as its definition requires.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from blocktrace.config import BlockConfig, QKNorm
from blocktrace.model.init import apply_deepnorm_beta
from blocktrace.model.block import build_block
from blocktrace.model.stack import build_stack
from blocktrace.vocab import Axis, Init, Placement, ReportKind
from blocktrace.wiring import WIRINGS

# The same role under another name: an MLP's first and last linear layers are SwiGLU's up and down.
ALIASES = {"ffn.up.": "ffn.fc.", "ffn.down.": "ffn.proj."}


def _source_name(name: str) -> str:
    for alias, original in ALIASES.items():
        if name.startswith(alias):
            return original + name[len(alias):]
    return name


def share_parameters(source: nn.Module, target: nn.Module) -> list[str]:
    """Copy every parameter of `target` that `source` has in the same role and shape.

    Returns the names of the target's parameters that were not shared.
    """
    available = dict(source.named_parameters())
    own = []
    with torch.no_grad():
        for name, parameter in target.named_parameters():
            origin = available.get(name, available.get(_source_name(name)))
            if origin is None or origin.shape != parameter.shape:
                own.append(name)
            else:
                parameter.copy_(origin)
    return own


@dataclass
class Variant:
    value: str
    config: BlockConfig
    blocks: list
    unshared: list[str] = field(default_factory=list)


def build_variants(base: BlockConfig, axis: Axis, values: list[str], *, n_layers: int, seed: int,
                   init: Init = Init.DEFAULT, source: Optional[list] = None) -> list[Variant]:
    """Both variants, filled from `source` blocks (default: a seeded stack of the base config). A checkpoint's
    layers each keep their own settings (a window, a convolution in place of attention) under the change."""
    layered = source is not None
    if source is None:
        plain = base.replace(placement=Placement.PRE) if base.placement is Placement.DEEPNORM else base
        source = build_stack(plain, n_layers, seed, init)
    variants = []
    for value in values:
        config = changed(base, axis, value).replace(n_layers=n_layers)
        blocks = build_stack(config, n_layers, seed, init) if not layered else \
            [build_block(changed(origin.config, axis, value).replace(n_layers=n_layers), seed + layer, init)
             for layer, origin in enumerate(source)]
        config = blocks[0].config if layered else config  # the settings said: the first layer's own
        unshared = []
        for block, origin in zip(blocks, source):
            unshared = share_parameters(origin, block)
            if config.placement is Placement.DEEPNORM:
                apply_deepnorm_beta(block)
        variants.append(Variant(value, config, blocks, unshared))
    return variants


def changed(config: BlockConfig, axis: Axis, value: str) -> BlockConfig:
    """The config with the axis at the value as compare names it. QK-norm on keeps a block's own (OLMo-2's over all
    heads, Llama-4's without a gain: its weights are then shared), else it is Qwen3's, per head before RoPE."""
    if axis is not Axis.QK_NORM:
        return config.replace(**{axis.value: value})
    return config.replace(qk_norm=(config.qk_norm or QKNorm()) if value == "on" else None)


def difference(a: torch.Tensor, b: torch.Tensor) -> dict:
    """max |Δ| and the cosine similarity of two tensors taken as flat vectors."""
    a, b = a.detach().double().flatten(), b.detach().double().flatten()
    denominator = torch.linalg.vector_norm(a) * torch.linalg.vector_norm(b)
    cosine = (a @ b / denominator).item() if denominator > 0 else float("nan")
    return {"max_abs_diff": (a - b).abs().max().item(), "cosine": cosine}


_WHERE = {placement.value: wiring.summary for placement, wiring in WIRINGS.items()}
_QK_NORMS = {
    "off": "qk_norm off: q·k grows with the size of q and k, and so can the attention logits",
    "on": "qk_norm on: each head's q and k are RMS-normalised before RoPE (Qwen3, Dehghani et al. 2023), which "
          "bounds the attention logits by the norms' gains",
}
_NORMS = {
    "layernorm": "layernorm subtracts each token's mean and divides by its std, then applies gain and shift",
    "rmsnorm": "rmsnorm only divides each token by its root mean square and applies a gain: no centring, "
               "no shift",
}
_FFNS = {
    "gelu": "gelu: Linear, exact GELU 0.5·x·(1 + erf(x/√2)), Linear",
    "gelu_tanh": "gelu_tanh: Linear, GPT-2's tanh approximation of GELU, Linear",
    "relu": "relu: Linear, max(0, x), Linear: negative pre-activations give exactly 0",
    "relu2": "relu2: Linear, max(0, x)², Linear: Primer's squared ReLU, 0 below 0 as ReLU",
    "swiglu": "swiglu: down(silu(gate(x)) · up(x)): a gated unit with a third matrix, the gate",
    "geglu": "geglu: down(gelu_tanh(gate(x)) · up(x)): Gemma's gated unit",
    "geglu_exact": "geglu_exact: down(gelu(gate(x)) · up(x)) with the exact GELU: Gemma-2's with hidden_activation gelu",
    "xielu": "xielu: Linear, xIELU (αp·x² + β·x above 0, a learned negative branch below), Linear: Apertus's",
}


def output_rms(report: dict) -> float:
    if report["kind"] == ReportKind.BLOCK.value:
        return report["steps"][-1]["stats"]["rms"]
    return report["layers"][-1]["rms"]


@dataclass(frozen=True)
class Phrasing:
    """How `describe` says what differs, in one language: a sentence per compared value (the values of every axis
    are distinct), and the templates of the measured notes."""

    sentences: dict[str, str]
    stop: str  # ends each value's sentence
    join: str  # between the variants' output sizes
    output: str  # {sizes}, {diff}, {cosine}
    unshared: str  # {value}, {names}


ENGLISH = Phrasing({**_WHERE, **_QK_NORMS, **_NORMS, **_FFNS}, ".", ", ",
                   "output rms: {sizes}; the outputs differ by max |Δ| {diff} (cosine similarity {cosine}).",
                   "{value} has parameters the other lacks, drawn from the seed: {names}.")


def describe(entries: list[dict], differences: Optional[dict], phrasing: Phrasing = ENGLISH) -> list[str]:
    """A few sentences on what differs between the variants, with the measured numbers (the report's own in English;
    compare's renderer asks for them in Chinese)."""
    notes = [phrasing.sentences[entry["value"]] + phrasing.stop for entry in entries]
    if differences is not None:
        sizes = phrasing.join.join(f"{e['value']} {output_rms(e['report']):.4f}" for e in entries)
        out = differences["output"]
        notes.append(phrasing.output.format(sizes=sizes, diff=f"{out['max_abs_diff']:.4g}",
                                            cosine=f"{out['cosine']:.4f}"))
    notes += [phrasing.unshared.format(value=entry["value"], names=", ".join(entry["unshared_parameters"]))
              for entry in entries if entry["unshared_parameters"]]
    return notes
