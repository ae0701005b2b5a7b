"""Checkpoint layouts: which keys hold a block's parameters, and how they map onto ours.

GPT-2 stores its linear layers as Conv1D, `[in, out]`, used as `x @ W + b`, with q, k and v
concatenated on the output side of `attn.c_attn`; our blocks use nn.Linear, `[out, in]`.
Every tensor's shape is checked against the config before it is copied, and the error
names the tensor with the expected and the found shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

from blocktrace.block import TransformerBlock
from blocktrace.checkpoint import Checkpoint
from blocktrace.config import BlockConfig, FFNKind
from blocktrace.errors import UsageError, WeightsError

SUPPORTED_LAYOUTS = ("gpt2 (h.{k}.* or transformer.h.{k}.*)",)

# HF GPT-2 `activation_function` values and the FFN that computes the same function.
GPT2_ACTIVATIONS = {
    "gelu_new": FFNKind.GELU_TANH,
    "gelu_fast": FFNKind.GELU_TANH,  # the same tanh formula, written differently
    "gelu_pytorch_tanh": FFNKind.GELU_TANH,
    "gelu": FFNKind.GELU,
    "gelu_python": FFNKind.GELU,
    "relu": FFNKind.RELU,
}

_GPT2_LAYER_KEY = re.compile(r"^(transformer\.)?h\.(\d+)\.ln_1\.weight$")


@dataclass(frozen=True)
class ModelInfo:
    """What a checkpoint says about the whole model, beyond one block's config."""

    layout: str
    prefix: str  # "" as GPT2Model saves, "transformer." as GPT2LMHeadModel saves
    n_layers: int
    n_positions: Optional[int]
    vocab_size: Optional[int]
    has_config_file: bool


def detect_gpt2(checkpoint: Checkpoint) -> Optional[tuple[str, int]]:
    """(prefix, number of layers) when the keys follow the GPT-2 layout."""
    layers: dict[str, set[int]] = {}
    for key in checkpoint.keys:
        match = _GPT2_LAYER_KEY.match(key)
        if match:
            layers.setdefault(match.group(1) or "", set()).add(int(match.group(2)))
    if not layers:
        return None
    prefix, found = max(layers.items(), key=lambda item: len(item[1]))
    return prefix, max(found) + 1


def unknown_layout_error(checkpoint: Checkpoint) -> WeightsError:
    sample = ", ".join(sorted(checkpoint.keys)[:5]) or "none"
    return WeightsError(f"{checkpoint.path}: unknown checkpoint layout (keys found: {sample}, ...); "
                        f"supported layouts: {', '.join(SUPPORTED_LAYOUTS)}")


def _check_conflict(name: str, option: str, from_file, given) -> None:
    if given is not None and from_file is not None and given != from_file:
        raise UsageError(f"{option} {given} conflicts with the checkpoint's {name} = {from_file}: drop {option}")


def gpt2_config(checkpoint: Checkpoint, info: "ModelInfo", overrides: dict) -> BlockConfig:
    """The block config from config.json (or from the shapes), with the user's overrides.

    Sizes come from the file; an explicit size that disagrees is an error. Wiring options
    (placement, causal, eps, ffn) may override the file: that is how `compare` rewires a
    real block.
    """
    prefix = info.prefix
    raw = checkpoint.read_json("config.json")
    ln_shape = checkpoint.shape(f"{prefix}h.0.ln_1.weight")
    fc_shape = checkpoint.shape(f"{prefix}h.0.mlp.c_fc.weight")
    d_model = raw.get("n_embd") if raw else ln_shape[0]
    n_heads = raw.get("n_head") if raw else None
    d_ff = (raw.get("n_inner") if raw else None) or (fc_shape[1] if len(fc_shape) == 2 else 4 * d_model)
    _check_conflict("d_model", "--d-model", d_model, overrides.get("d_model"))
    _check_conflict("n_head", "--heads", n_heads, overrides.get("n_heads"))
    _check_conflict("d_ff", "--d-ff", d_ff, overrides.get("d_ff"))
    n_heads = n_heads or overrides.get("n_heads")
    if n_heads is None:
        raise UsageError(f"{checkpoint.directory} has no config.json: pass --heads "
                         f"(d_model {d_model} read from the weights)")
    fields = {"d_model": d_model, "n_heads": n_heads, "d_ff": d_ff, "eps": 1e-5, "ffn": FFNKind.GELU_TANH,
              "n_layers": info.n_layers}
    if raw:
        fields["eps"] = raw.get("layer_norm_epsilon", 1e-5)
        fields["ffn"] = _gpt2_activation(raw.get("activation_function", "gelu_new"))
        _refuse_unsupported_gpt2(raw)
    fields.update({key: value for key, value in overrides.items() if key not in ("d_model", "n_heads", "d_ff")})
    return BlockConfig(**fields)


def _gpt2_activation(name: str) -> FFNKind:
    if name not in GPT2_ACTIVATIONS:
        raise WeightsError(f"activation_function {name!r} is not supported; "
                           f"supported: {', '.join(GPT2_ACTIVATIONS)}")
    return GPT2_ACTIVATIONS[name]


def _refuse_unsupported_gpt2(raw: dict) -> None:
    # Options HF allows that change the attention arithmetic: refuse rather than differ silently.
    if raw.get("scale_attn_weights", True) is False:
        raise WeightsError("config.json sets scale_attn_weights=false, which blocktrace does not support")
    if raw.get("scale_attn_by_inverse_layer_idx", False):
        raise WeightsError("config.json sets scale_attn_by_inverse_layer_idx=true, "
                           "which blocktrace does not support")


def model_info(checkpoint: Checkpoint) -> ModelInfo:
    detected = detect_gpt2(checkpoint)
    if detected is None:
        raise unknown_layout_error(checkpoint)
    prefix, n_layers = detected
    raw = checkpoint.read_json("config.json") or {}
    if raw.get("n_layer") not in (None, n_layers):
        raise WeightsError(f"config.json says n_layer = {raw['n_layer']} but the weights hold {n_layers} layers")
    vocab = checkpoint.shape(f"{prefix}wte.weight")[0] if f"{prefix}wte.weight" in checkpoint else None
    positions = checkpoint.shape(f"{prefix}wpe.weight")[0] if f"{prefix}wpe.weight" in checkpoint else None
    return ModelInfo("gpt2", prefix, n_layers, positions, vocab, bool(raw))


def check_layer(info: ModelInfo, layer: int) -> None:
    if not 0 <= layer < info.n_layers:
        raise WeightsError(f"--layer {layer} is out of range: the checkpoint has {info.n_layers} layers: "
                         f"0–{info.n_layers - 1}")


def _gpt2_parameters(checkpoint: Checkpoint, prefix: str, layer: int, config: BlockConfig, dtype) -> dict:
    """Our state dict for one block, read from the checkpoint with every shape checked."""
    d, f = config.d_model, config.d_ff
    base = f"{prefix}h.{layer}."

    def read(name: str, expected: tuple[int, ...]) -> torch.Tensor:
        key = base + name
        found = checkpoint.shape(key) if key in checkpoint else None
        if found is None:
            raise WeightsError(f"{checkpoint.path} has no tensor {key!r} (expected shape {list(expected)})")
        if found != expected:
            raise WeightsError(f"tensor {key!r} has shape {list(found)}, expected {list(expected)}")
        return checkpoint.get(key, dtype)

    qkv_weight = read("attn.c_attn.weight", (d, 3 * d)).t()  # Conv1D [in, out] -> Linear [out, in]
    qkv_bias = read("attn.c_attn.bias", (3 * d,))
    state = {
        "norm1.weight": read("ln_1.weight", (d,)),
        "norm1.bias": read("ln_1.bias", (d,)),
        "attn.out_proj.weight": read("attn.c_proj.weight", (d, d)).t(),
        "attn.out_proj.bias": read("attn.c_proj.bias", (d,)),
        "norm2.weight": read("ln_2.weight", (d,)),
        "norm2.bias": read("ln_2.bias", (d,)),
        "ffn.fc.weight": read("mlp.c_fc.weight", (d, f)).t(),
        "ffn.fc.bias": read("mlp.c_fc.bias", (f,)),
        "ffn.proj.weight": read("mlp.c_proj.weight", (f, d)).t(),
        "ffn.proj.bias": read("mlp.c_proj.bias", (d,)),
    }
    for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
        state[f"attn.{name}.weight"] = qkv_weight[index * d : (index + 1) * d]
        state[f"attn.{name}.bias"] = qkv_bias[index * d : (index + 1) * d]
    # Transposed views, not copies: the GEMM reads a transposed operand as fast, and loading stays cheap.
    return state


def load_block(checkpoint: Checkpoint, info: ModelInfo, layer: int, config: BlockConfig,
               dtype: torch.dtype = torch.float32) -> TransformerBlock:
    """Layer `layer` as a TransformerBlock; only that layer's tensors are read."""
    if config.ffn is FFNKind.SWIGLU or config.norm.value != "layernorm" or not config.bias:
        raise UsageError("GPT-2 weights need --norm layernorm, --bias and a non-gated --ffn "
                         "(gelu, gelu_tanh or relu)")
    check_layer(info, layer)
    state = _gpt2_parameters(checkpoint, info.prefix, layer, config, dtype)
    with torch.device("meta"):  # no random init of weights about to be replaced
        block = TransformerBlock(config)
    block.load_state_dict(state, strict=True, assign=True)
    return block.eval()


def embed_token_ids(checkpoint: Checkpoint, info: ModelInfo, token_ids: list[int],
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """wte[ids] + wpe[0..T-1], reading only the rows needed: `[T, d]`."""
    wte, wpe = f"{info.prefix}wte.weight", f"{info.prefix}wpe.weight"
    if wte not in checkpoint or wpe not in checkpoint:
        raise WeightsError(f"{checkpoint.path} has no embeddings ({wte}, {wpe}): use --input "
                           "with a hidden-state tensor instead of token ids")
    bad = [i for i in token_ids if not 0 <= i < info.vocab_size]
    if bad:
        raise UsageError(f"token ids {bad} are out of range: the vocabulary has {info.vocab_size} ids: "
                         f"0–{info.vocab_size - 1}")
    if len(token_ids) > info.n_positions:
        raise UsageError(f"{len(token_ids)} tokens exceed the model's {info.n_positions} positions")
    positions = checkpoint.get(wpe, dtype, rows=slice(0, len(token_ids)))
    return checkpoint.get(wte, dtype, rows=token_ids) + positions


def hidden_state_before(checkpoint: Checkpoint, info: ModelInfo, native_config: BlockConfig,
                        x: torch.Tensor, layer: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Run blocks 0..layer-1 (untraced, one loaded at a time) so block `layer` sees its real input.

    `native_config` is the checkpoint's own wiring: a user's rewiring applies to the traced block only.
    """
    with torch.no_grad():
        for earlier in range(layer):
            x = load_block(checkpoint, info, earlier, native_config, dtype).to(x.device)(x)
    return x
