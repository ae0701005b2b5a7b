"""How to call a block the way its own model calls it.

A HuggingFace decoder layer gets from its model what it cannot make itself: the causal mask
(with its sliding window, and the padding), position ids, and the rotary `position_embeddings`
of the model's rotary module. Called bare it would attend to the future or fail. blocktrace
builds them here — the causal mask from the attention's own `is_causal`, the window from its
`sliding_window`, cos/sin from the model family's own rotary class — and calls the layer with a
batch dimension, as models do. While it is traced, the layer's attention runs HF's eager
implementation, which returns the attention weights (the fused kernels do not); the numbers
are the same to float rounding.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from dataclasses import dataclass, field
from typing import Optional

import torch
from torch import nn

from blocktrace.errors import InputError


@dataclass
class Call:
    """The keyword arguments of a block's forward, and whether its input needs a batch dimension."""

    kwargs: dict = field(default_factory=dict)
    batched: bool = False  # the block wants [B, T, d]: an unbatched [T, d] input gets a batch of one
    notes: list[str] = field(default_factory=list)
    config: object = None  # the HF config whose attention implementation is switched while tracing


def is_huggingface(block: nn.Module) -> bool:
    return type(block).__module__.startswith("transformers.")


def hf_config(block: nn.Module):
    for module in block.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict") and hasattr(config, "model_type"):
            return config
    return None


def attention_module(block: nn.Module) -> Optional[nn.Module]:
    for name in ("self_attn", "attn", "attention"):
        module = getattr(block, name, None)
        if module is not None:
            return getattr(module, "self", module)  # BertAttention wraps BertSelfAttention
    return None


def hf_causal(block: nn.Module) -> Optional[bool]:
    attention = attention_module(block)
    causal = getattr(attention, "is_causal", None)
    return bool(causal) if causal is not None else None


def _sliding_window(block: nn.Module, config) -> Optional[int]:
    """The window of this layer: its attention's own `sliding_window` where it keeps one (Qwen,
    Gemma-2); else, where the config has layer_types, the window for a layer they mark sliding and none
    for a full one (Qwen2-MoE sets the attribute on its sliding layers only); else the config's (Mistral,
    Phi-3 apply it to every layer). 0 is no window (Qwen2-MoE's config writes 0 when use_sliding_window
    is off)."""
    attention = attention_module(block)
    if attention is not None and getattr(attention, "is_sliding", None) is False:
        return None  # EXAONE-4's and EXAONE-MoE's keep the config's window on every layer, and flag the sliding ones
    if attention is not None and hasattr(attention, "sliding_window"):
        return attention.sliding_window or None
    window = getattr(config, "sliding_window", None) or None
    types, index = getattr(config, "layer_types", None), getattr(attention, "layer_idx", None)
    if isinstance(types, (list, tuple)) and isinstance(index, int) and 0 <= index < len(types):
        return window if types[index] == "sliding_attention" else None
    return window


def attention_chunk(block: nn.Module, config) -> Optional[int]:
    """Llama-4's chunked attention: the config's attention_chunk_size on a layer its layer_types mark chunked."""
    if config is None or _layer_type(attention_module(block), config) != "chunked_attention":
        return None
    return getattr(config, "attention_chunk_size", None)


def additive_mask(batch: int, tokens: int, dtype: torch.dtype, device, causal: bool, window: Optional[int],
                  token_mask: Optional[torch.Tensor], chunk: Optional[int] = None) -> Optional[torch.Tensor]:
    """[B, 1, T, T]: 0 where a query may look, finfo.min where not (as HF's eager attention adds it)."""
    if not causal and token_mask is None:
        return None
    queries = torch.arange(tokens, device=device)[:, None]
    keys = torch.arange(tokens, device=device)[None, :]
    hidden = torch.zeros(tokens, tokens, dtype=torch.bool, device=device)
    if causal:
        hidden |= keys > queries
        if window is not None:
            hidden |= keys <= queries - window
        if chunk is not None:
            hidden |= keys // chunk != queries // chunk
    hidden = hidden.expand(batch, 1, tokens, tokens)
    if token_mask is not None:
        hidden = hidden | ~token_mask.to(device)[:, None, None, :]
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, torch.finfo(dtype).min)


def _rotary_class(block: nn.Module):
    """The rotary classes of the layer's module; where it has several (Llama-4's, Qwen3.5's text and vision), the one
    named as the layer is (Llama4TextDecoderLayer: Llama4TextRotaryEmbedding), else its text one (Qwen3_5DecoderLayer:
    Qwen3_5TextRotaryEmbedding)."""
    module = sys.modules.get(type(block).__module__)
    classes = [value for name, value in vars(module).items()
               if name.endswith("RotaryEmbedding") and isinstance(value, type) and issubclass(value, nn.Module)]
    if len(classes) < 2:
        return classes
    layer = type(block).__name__
    for own in (layer.replace("DecoderLayer", "RotaryEmbedding"), layer.replace("DecoderLayer", "TextRotaryEmbedding")):
        named = [value for value in classes if value.__name__ == own]
        if named:
            return named
    return classes


def _layer_type(attention: Optional[nn.Module], config) -> Optional[str]:
    """The attention type of a layer, as its attention module keeps it (Gemma-3's layer_type, OLMo-3's
    attention_type), else as its config lists it for the layer's index."""
    for name in ("layer_type", "attention_type"):
        if isinstance(getattr(attention, name, None), str):
            return getattr(attention, name)
    types, index = getattr(config, "layer_types", None), getattr(attention, "layer_idx", None)
    return types[index] if types is not None and index is not None and 0 <= index < len(types) else None


def _position_embeddings(block: nn.Module, config, x: torch.Tensor, positions: torch.Tensor):
    classes = _rotary_class(block)
    if len(classes) != 1:
        found = ", ".join(c.__name__ for c in classes) or "none"
        raise InputError(f"cannot call {type(block).__name__} the way its model does: it needs rotary "
                         f"position_embeddings and its module has {found} rotary classes; pass forward_kwargs")
    extra = {}
    if "layer_type" in inspect.signature(classes[0].forward).parameters:  # Gemma-3, OLMo-3: RoPE per layer type
        extra["layer_type"] = _layer_type(attention_module(block), config)
    try:
        rotary = classes[0](config).to(x.device)
        return rotary(x, positions, **extra)
    except Exception as error:
        raise InputError(f"cannot build the rotary embeddings of {type(block).__name__} from its config: "
                         f"{type(error).__name__}: {error}") from None


def huggingface_call(block: nn.Module, x: torch.Tensor, token_mask: Optional[torch.Tensor] = None) -> Call:
    """The arguments a HF layer gets from its model, for input x ([T, d] or [B, T, d])."""
    config = hf_config(block)
    parameters = inspect.signature(block.forward).parameters
    batch, tokens = (x.shape[0] if x.dim() == 3 else 1), x.shape[-2]
    batched_x = x if x.dim() == 3 else x.unsqueeze(0)
    call = Call(batched=True, config=config)
    if attention_module(block) is None:  # a token mixer without attention (LFM2's, Qwen3-Next's)
        return _recurrent_call(call, parameters, x, token_mask)
    causal = bool(hf_causal(block))
    window = _sliding_window(block, config) if causal else None
    chunk = attention_chunk(block, config) if causal else None
    if "attention_mask" in parameters:
        call.kwargs["attention_mask"] = additive_mask(batch, tokens, x.dtype, x.device, causal, window, token_mask,
                                                      chunk)
    positions = torch.arange(tokens, device=x.device)[None].expand(batch, tokens)
    if "position_ids" in parameters:
        call.kwargs["position_ids"] = positions
    if "position_embeddings" in parameters and config is not None:
        call.kwargs["position_embeddings"] = _position_embeddings(block, config, batched_x, positions) \
            if _rotary(config) else None
    what = "causal mask" if causal else "no causal mask (bidirectional)"
    what += f" with a sliding window of {window}" if window is not None else ""
    what += f" within chunks of {chunk} tokens" if chunk is not None else ""
    call.notes.append(f"called as its model calls it: {what}"
                      + (", rotary position embeddings from its model's rotary module"
                         if "position_embeddings" in call.kwargs else "")
                      + ("; a batch of one added" if x.dim() == 2 else ""))
    return call


def _rotary(config) -> bool:
    """Whether the layer's model makes rotary embeddings: not where GraniteMoeHybrid's position_embedding_type is
    other than "rope", nor where the config's rope_parameters are null (OLMo-Hybrid's released checkpoints: NoPE;
    transformers 5 fills them wherever a model rotates)."""
    if getattr(config, "position_embedding_type", "rope") != "rope":
        return False
    return getattr(config, "rope_parameters", {}) is not None


def _recurrent_call(call: Call, parameters, x: torch.Tensor, token_mask: Optional[torch.Tensor]) -> Call:
    """A layer whose token mixer is no attention gets what HF's create_recurrent_attention_mask gives it: the padding
    mask [B, T] (HF's is None where nothing is padded: multiplying by ones changes no number); no positions reach it."""
    if "attention_mask" in parameters:
        call.kwargs["attention_mask"] = token_mask.to(x.dtype) if token_mask is not None else None
    embeddings = parameters.get("position_embeddings")
    if embeddings is not None and embeddings.default is inspect.Parameter.empty:  # required, and read by attention
        call.kwargs["position_embeddings"] = None  # layers only (Qwen3NextDecoderLayer's linear layers ignore it)
    call.notes.append("called as its model calls it: a token mixer without attention, given the padding mask only"
                      + ("; a batch of one added" if x.dim() == 2 else ""))
    return call


@contextlib.contextmanager
def eager_attention(call: Call):
    """HF's eager attention while tracing: it returns the weights that fused kernels keep to themselves."""
    config = call.config
    if config is None or not hasattr(config, "_attn_implementation"):
        yield
        return
    saved = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        yield
    finally:
        config._attn_implementation = saved
