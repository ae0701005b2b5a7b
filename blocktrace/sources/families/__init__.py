"""Checkpoint layouts: which keys hold a block's parameters, and how they map onto ours.

Three families, each as HuggingFace saves it:
- GPT-2 (`h.{k}.…`, `transformer.` prefix from GPT2LMHeadModel): Pre-LN. Its linear layers are
  Conv1D, `[in, out]`, used as `x @ W + b`, with q, k and v concatenated on the output side
  of `attn.c_attn`; ours are nn.Linear, `[out, in]`.
- BERT (`encoder.layer.{k}.…`, `bert.` prefix from task models): Post-LN, bidirectional,
  exact GELU; old files name LayerNorm parameters gamma/beta.
- Llama (`layers.{k}.…`, `model.` prefix from LlamaForCausalLM): Pre-RMSNorm, SwiGLU, RoPE,
  grouped-query attention.
Every tensor's shape is checked against the config before it is copied, and the error names
the tensor with the expected and the found shape.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch.nn import functional as F

from blocktrace.model.block import TransformerBlock
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.config import BlockConfig, FFNKind
from blocktrace.errors import UsageError, WeightsError

SIZE_FIELDS = ("d_model", "n_heads", "d_ff")


@dataclass(frozen=True)
class ModelInfo:
    """What a checkpoint says about the whole model, beyond one block's config."""

    layout: str  # "gpt2", "bert" or "llama"
    prefix: str  # e.g. "" as GPT2Model saves, "transformer." as GPT2LMHeadModel saves
    n_layers: int
    n_positions: Optional[int]
    vocab_size: Optional[int]
    has_config_file: bool

    @property
    def family(self) -> "Family":
        return FAMILIES[self.layout]

    def layer_prefix(self, layer: int) -> str:
        return f"{self.prefix}{self.family.layers_path}.{layer}."


Reader = Callable[[str, tuple], torch.Tensor]  # (name inside the layer, expected shape) -> tensor


class Family:
    """One checkpoint family: how to find its layers, read its config, map its parameters."""

    name: str
    described: str  # for the list of supported layouts
    layers_path: str  # e.g. "h" for GPT-2: keys are {prefix}{layers_path}.{k}.{...}
    marker: str  # a key inside every layer, used to detect the layout
    prefixes: tuple[str, ...]
    embedding_key: str

    @property
    def pattern(self) -> re.Pattern:
        prefixes = "|".join(re.escape(p) for p in self.prefixes if p)
        return re.compile(rf"^({prefixes})?{re.escape(self.layers_path)}\.(\d+)\.{re.escape(self.marker)}$")

    def config_fields(self, raw: dict) -> dict:
        raise NotImplementedError

    def shape_fields(self, checkpoint: Checkpoint, base: str) -> dict:
        raise NotImplementedError

    def parameters(self, read: Reader, config: BlockConfig) -> dict:
        raise NotImplementedError

    def embed(self, checkpoint: Checkpoint, info: ModelInfo, ids: list[int], dtype, raw: dict) -> torch.Tensor:
        return checkpoint.get(f"{info.prefix}{self.embedding_key}", dtype, rows=ids)

    def check(self, config: BlockConfig) -> None:
        """Refuse a rewiring these parameters cannot fill."""


def _linear(read: Reader, source: str, target: str, out: int, inp: int, bias: bool, transpose=False) -> dict:
    weight = read(f"{source}.weight", (inp, out) if transpose else (out, inp))
    state = {f"{target}.weight": weight.t() if transpose else weight}
    if bias:
        state[f"{target}.bias"] = read(f"{source}.bias", (out,))
    return state


class GPT2(Family):
    name, described, layers_path, marker = "gpt2", "gpt2 (h.{k}.* or transformer.h.{k}.*)", "h", "ln_1.weight"
    prefixes, embedding_key = ("", "transformer."), "wte.weight"
    ACTIVATIONS = {"gelu_new": FFNKind.GELU_TANH, "gelu_fast": FFNKind.GELU_TANH,
                   "gelu_pytorch_tanh": FFNKind.GELU_TANH, "gelu": FFNKind.GELU, "gelu_python": FFNKind.GELU,
                   "relu": FFNKind.RELU}

    def config_fields(self, raw: dict) -> dict:
        # Options HF allows that change the attention arithmetic: refuse rather than differ silently.
        if raw.get("scale_attn_weights", True) is False:
            raise WeightsError("config.json sets scale_attn_weights=false, which blocktrace does not support")
        if raw.get("scale_attn_by_inverse_layer_idx", False):
            raise WeightsError("config.json sets scale_attn_by_inverse_layer_idx=true, which blocktrace does not support")
        return {"d_model": raw.get("n_embd"), "n_heads": raw.get("n_head"), "d_ff": raw.get("n_inner"),
                "eps": raw.get("layer_norm_epsilon", 1e-5),
                "ffn": _activation(raw.get("activation_function", "gelu_new"), self.ACTIVATIONS)}

    def shape_fields(self, checkpoint, base):
        return {"d_model": checkpoint.shape(base + "ln_1.weight")[0], "d_ff": checkpoint.shape(base + "mlp.c_fc.weight")[1],
                "eps": 1e-5, "ffn": FFNKind.GELU_TANH}

    def parameters(self, read, c):
        d, f = c.d_model, c.d_ff
        qkv_weight = read("attn.c_attn.weight", (d, 3 * d)).t()  # Conv1D [in, out] -> Linear [out, in]
        qkv_bias = read("attn.c_attn.bias", (3 * d,))
        state = {"norm1.weight": read("ln_1.weight", (d,)), "norm1.bias": read("ln_1.bias", (d,)),
                 "norm2.weight": read("ln_2.weight", (d,)), "norm2.bias": read("ln_2.bias", (d,)),
                 **_linear(read, "attn.c_proj", "attn.out_proj", d, d, True, transpose=True),
                 **_linear(read, "mlp.c_fc", "ffn.fc", f, d, True, transpose=True),
                 **_linear(read, "mlp.c_proj", "ffn.proj", d, f, True, transpose=True)}
        for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
            state[f"attn.{name}.weight"] = qkv_weight[index * d : (index + 1) * d]
            state[f"attn.{name}.bias"] = qkv_bias[index * d : (index + 1) * d]
        # Transposed views, not copies: the GEMM reads a transposed operand as fast, and loading stays cheap.
        return state

    def embed(self, checkpoint, info, ids, dtype, raw):
        positions = checkpoint.get(f"{info.prefix}wpe.weight", dtype, rows=slice(0, len(ids)))
        return super().embed(checkpoint, info, ids, dtype, raw) + positions

    def check(self, config):
        if config.ffn is FFNKind.SWIGLU or config.norm.value != "layernorm" or not config.bias:
            raise UsageError("GPT-2 weights need --norm layernorm, --bias and a non-gated --ffn (gelu, gelu_tanh or relu)")


class BERT(Family):
    name, described, layers_path = "bert", "bert (encoder.layer.{k}.*, optionally bert.)", "encoder.layer"
    marker, prefixes = "attention.self.query.weight", ("", "bert.")
    embedding_key = "embeddings.word_embeddings.weight"
    ACTIVATIONS = {"gelu": FFNKind.GELU, "gelu_python": FFNKind.GELU, "gelu_new": FFNKind.GELU_TANH,
                   "gelu_pytorch_tanh": FFNKind.GELU_TANH, "relu": FFNKind.RELU}

    def config_fields(self, raw):
        if raw.get("position_embedding_type", "absolute") != "absolute":
            raise WeightsError(f"position_embedding_type {raw['position_embedding_type']!r} is not supported "
                               "(only absolute)")
        return {"d_model": raw.get("hidden_size"), "n_heads": raw.get("num_attention_heads"),
                "d_ff": raw.get("intermediate_size"), "eps": raw.get("layer_norm_eps", 1e-12),
                "ffn": _activation(raw.get("hidden_act", "gelu"), self.ACTIVATIONS),
                "placement": "post", "causal": False}

    def shape_fields(self, checkpoint, base):
        return {"d_model": checkpoint.shape(base + "attention.self.query.weight")[0],
                "d_ff": checkpoint.shape(base + "intermediate.dense.weight")[0], "eps": 1e-12, "ffn": FFNKind.GELU,
                "placement": "post", "causal": False}

    @staticmethod
    def _layer_norm(read: Reader, source: str, target: str, d: int) -> dict:
        return {f"{target}.weight": read((f"{source}.weight", f"{source}.gamma"), (d,)),
                f"{target}.bias": read((f"{source}.bias", f"{source}.beta"), (d,))}

    def parameters(self, read, c):
        d, f = c.d_model, c.d_ff
        return {**_linear(read, "attention.self.query", "attn.q_proj", d, d, True),
                **_linear(read, "attention.self.key", "attn.k_proj", d, d, True),
                **_linear(read, "attention.self.value", "attn.v_proj", d, d, True),
                **_linear(read, "attention.output.dense", "attn.out_proj", d, d, True),
                **self._layer_norm(read, "attention.output.LayerNorm", "norm1", d),
                **_linear(read, "intermediate.dense", "ffn.fc", f, d, True),
                **_linear(read, "output.dense", "ffn.proj", d, f, True),
                **self._layer_norm(read, "output.LayerNorm", "norm2", d)}

    def embed(self, checkpoint, info, ids, dtype, raw):
        """word + position + token type 0, then the embedding LayerNorm, as BertEmbeddings does."""
        base = f"{info.prefix}embeddings."
        x = (super().embed(checkpoint, info, ids, dtype, raw)
             + checkpoint.get(base + "position_embeddings.weight", dtype, rows=slice(0, len(ids)))
             + checkpoint.get(base + "token_type_embeddings.weight", dtype, rows=[0]))
        weight = _either(checkpoint, base + "LayerNorm.weight", base + "LayerNorm.gamma", dtype)
        bias = _either(checkpoint, base + "LayerNorm.bias", base + "LayerNorm.beta", dtype)
        return F.layer_norm(x, x.shape[-1:], weight, bias, raw.get("layer_norm_eps", 1e-12))

    def check(self, config):
        if config.ffn is FFNKind.SWIGLU or config.norm.value != "layernorm" or not config.bias:
            raise UsageError("BERT weights need --norm layernorm, --bias and a non-gated --ffn")


class Llama(Family):
    name, described, layers_path = "llama", "llama (layers.{k}.*, optionally model.)", "layers"
    marker, prefixes, embedding_key = "input_layernorm.weight", ("", "model."), "embed_tokens.weight"

    def config_fields(self, raw):
        if raw.get("hidden_act", "silu") != "silu":
            raise WeightsError(f"hidden_act {raw['hidden_act']!r} is not supported for Llama (only silu: SwiGLU)")
        if bool(raw.get("attention_bias", False)) != bool(raw.get("mlp_bias", False)):
            raise WeightsError("attention_bias and mlp_bias differ, which blocktrace does not support")
        theta, scaling = _rope(raw)
        heads = raw.get("num_attention_heads")
        return {"d_model": raw.get("hidden_size"), "n_heads": heads, "d_ff": raw.get("intermediate_size"),
                "eps": raw.get("rms_norm_eps", 1e-6), "ffn": FFNKind.SWIGLU, "norm": "rmsnorm",
                "bias": bool(raw.get("attention_bias", False)), "kv_heads": raw.get("num_key_value_heads") or heads,
                "head_size": raw.get("head_dim"), "rope_theta": theta, "rope_scaling": scaling}

    def shape_fields(self, checkpoint, base):
        return {"d_model": checkpoint.shape(base + "input_layernorm.weight")[0],
                "d_ff": checkpoint.shape(base + "mlp.gate_proj.weight")[0], "eps": 1e-6, "ffn": FFNKind.SWIGLU,
                "norm": "rmsnorm", "bias": False, "rope_theta": 10000.0}

    def complete(self, fields: dict, checkpoint: Checkpoint, base: str) -> dict:
        """Without config.json, the key/value heads follow from k_proj's rows."""
        if fields.get("kv_heads") is None and fields.get("n_heads"):
            head_dim = fields.get("head_size") or fields["d_model"] // fields["n_heads"]
            fields["kv_heads"] = checkpoint.shape(base + "self_attn.k_proj.weight")[0] // head_dim
        return fields

    def parameters(self, read, c):
        d, f, hd = c.d_model, c.d_ff, c.head_dim
        q, kv = c.n_heads * hd, c.n_kv_heads * hd
        return {"norm1.weight": read("input_layernorm.weight", (d,)),
                **_linear(read, "self_attn.q_proj", "attn.q_proj", q, d, c.bias),
                **_linear(read, "self_attn.k_proj", "attn.k_proj", kv, d, c.bias),
                **_linear(read, "self_attn.v_proj", "attn.v_proj", kv, d, c.bias),
                **_linear(read, "self_attn.o_proj", "attn.out_proj", d, q, c.bias),
                "norm2.weight": read("post_attention_layernorm.weight", (d,)),
                **_linear(read, "mlp.gate_proj", "ffn.gate", f, d, c.bias),
                **_linear(read, "mlp.up_proj", "ffn.up", f, d, c.bias),
                **_linear(read, "mlp.down_proj", "ffn.down", d, f, c.bias)}

    def check(self, config):
        if config.ffn is not FFNKind.SWIGLU or config.norm.value != "rmsnorm":
            raise UsageError("Llama weights need --norm rmsnorm and --ffn swiglu")


def _rope(raw: dict) -> tuple[float, float]:
    """RoPE theta and linear scaling factor, from rope_parameters (transformers 5) or rope_theta/rope_scaling."""
    parameters = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    theta = parameters.get("rope_theta", raw.get("rope_theta", 10000.0))
    kind = parameters.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return float(theta), 1.0
    if kind == "linear":
        return float(theta), float(parameters.get("factor", scaling.get("factor", 1.0)))
    raise WeightsError(f"rope type {kind!r} is not supported; supported: default, linear")


def _activation(name: str, table: dict) -> FFNKind:
    if name not in table:
        raise WeightsError(f"activation {name!r} is not supported; supported: {', '.join(table)}")
    return table[name]


def _either(checkpoint: Checkpoint, key: str, old_key: str, dtype) -> torch.Tensor:
    return checkpoint.get(key if key in checkpoint else old_key, dtype)


FAMILIES = {family.name: family for family in (GPT2(), BERT(), Llama())}
SUPPORTED_LAYOUTS = tuple(family.described for family in FAMILIES.values())


def detect(checkpoint: Checkpoint) -> Optional[tuple[Family, str, int]]:
    """(family, key prefix, number of layers) of the first layout whose keys the checkpoint has."""
    for family in FAMILIES.values():
        layers: dict[str, set[int]] = {}
        for key in checkpoint.keys:
            match = family.pattern.match(key)
            if match:
                layers.setdefault(match.group(1) or "", set()).add(int(match.group(2)))
        if layers:
            prefix, found = max(layers.items(), key=lambda item: len(item[1]))
            return family, prefix, max(found) + 1
    return None


def unknown_layout_error(checkpoint: Checkpoint) -> WeightsError:
    sample = ", ".join(sorted(checkpoint.keys)[:5]) or "none"
    return WeightsError(f"{checkpoint.path}: unknown checkpoint layout (keys found: {sample}, ...); "
                        f"supported layouts: {'; '.join(SUPPORTED_LAYOUTS)}")


def model_info(checkpoint: Checkpoint) -> ModelInfo:
    detected = detect(checkpoint)
    if detected is None:
        raise unknown_layout_error(checkpoint)
    family, prefix, n_layers = detected
    raw = checkpoint.read_json("config.json") or {}
    declared = raw.get("n_layer", raw.get("num_hidden_layers"))
    if declared not in (None, n_layers):
        raise WeightsError(f"config.json says {declared} layers but the weights hold {n_layers}")
    embedding = f"{prefix}{family.embedding_key}"
    vocab = checkpoint.shape(embedding)[0] if embedding in checkpoint else None
    positions = raw.get("n_positions", raw.get("max_position_embeddings"))
    if family.name == "gpt2" and f"{prefix}wpe.weight" in checkpoint:
        positions = checkpoint.shape(f"{prefix}wpe.weight")[0]
    return ModelInfo(family.name, prefix, n_layers, positions, vocab, bool(raw))


def _check_conflict(name: str, option: str, from_file, given) -> None:
    if given is not None and from_file is not None and given != from_file:
        raise UsageError(f"{option} {given} conflicts with the checkpoint's {name} = {from_file}: drop {option}")


def checkpoint_config(checkpoint: Checkpoint, info: ModelInfo, overrides: dict) -> BlockConfig:
    """The block config from config.json (or from the shapes), with the user's overrides.

    Sizes come from the file; an explicit size that disagrees is an error. Wiring options
    (placement, causal, eps, ffn) may override the file: that is how `compare` rewires a
    real block.
    """
    family = info.family
    raw = checkpoint.read_json("config.json")
    base = info.layer_prefix(0)
    fields = {key: value for key, value in (family.config_fields(raw) if raw else {}).items() if value is not None}
    from_shapes = family.shape_fields(checkpoint, base)
    fields = {**from_shapes, **fields}
    for name, option in (("d_model", "--d-model"), ("n_heads", "--heads"), ("d_ff", "--d-ff")):
        _check_conflict(name, option, fields.get(name), overrides.get(name))
    if fields.get("n_heads") is None:
        if overrides.get("n_heads") is None:
            raise UsageError(f"{checkpoint.directory} has no config.json: pass --heads "
                             f"(d_model {fields['d_model']} read from the weights)")
        fields["n_heads"] = overrides["n_heads"]
    if hasattr(family, "complete"):
        fields = family.complete(fields, checkpoint, base)
    fields["n_layers"] = info.n_layers
    fields.update({key: value for key, value in overrides.items() if key not in SIZE_FIELDS})
    return BlockConfig(**fields)


checkpoint_config = checkpoint_config  # the name this function had while GPT-2 was the only layout


def check_layer(info: ModelInfo, layer: int) -> None:
    if not 0 <= layer < info.n_layers:
        raise WeightsError(f"--layer {layer} is out of range: the checkpoint has {info.n_layers} layers: "
                           f"0–{info.n_layers - 1}")


def _reader(checkpoint: Checkpoint, base: str, dtype) -> Reader:
    def read(names, expected: tuple) -> torch.Tensor:
        names = (names,) if isinstance(names, str) else names
        key = next((base + name for name in names if base + name in checkpoint), None)
        if key is None:
            raise WeightsError(f"{checkpoint.path} has no tensor {base + names[0]!r} (expected shape {list(expected)})")
        found = checkpoint.shape(key)
        if found != tuple(expected):
            raise WeightsError(f"tensor {key!r} has shape {list(found)}, expected {list(expected)}")
        return checkpoint.get(key, dtype)
    return read


def load_block(checkpoint: Checkpoint, info: ModelInfo, layer: int, config: BlockConfig,
               dtype: torch.dtype = torch.float32) -> TransformerBlock:
    """Layer `layer` as a TransformerBlock; only that layer's tensors are read."""
    info.family.check(config)
    check_layer(info, layer)
    state = info.family.parameters(_reader(checkpoint, info.layer_prefix(layer), dtype), config)
    with torch.device("meta"):  # no random init of weights about to be replaced
        block = TransformerBlock(config)
    block.load_state_dict(state, strict=False, assign=True)
    _materialise_buffers(block)
    missing = [name for name, p in block.named_parameters() if p.is_meta]
    if missing:
        raise WeightsError(f"layer {layer} of {checkpoint.path} lacks parameters for {', '.join(missing)}")
    return block.eval()


def _materialise_buffers(block: TransformerBlock) -> None:
    """Buffers computed, not loaded (RoPE's inverse frequencies), rebuilt off the meta device."""
    rope = block.attn.rope
    if rope is not None:
        from blocktrace.model.layers import RotaryEmbedding

        block.attn.rope = RotaryEmbedding(block.config.head_dim, block.config.rope_theta, block.config.rope_scaling)


def embed_token_ids(checkpoint: Checkpoint, info: ModelInfo, token_ids: list[int],
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The model's own embedding of the ids, `[T, d]`, reading only the rows needed."""
    if f"{info.prefix}{info.family.embedding_key}" not in checkpoint:
        raise WeightsError(f"{checkpoint.path} has no embeddings ({info.prefix}{info.family.embedding_key}): "
                           "use --input with a hidden-state tensor instead of token ids")
    bad = [i for i in token_ids if not 0 <= i < info.vocab_size]
    if bad:
        raise UsageError(f"token ids {bad} are out of range: the vocabulary has {info.vocab_size} ids: "
                         f"0–{info.vocab_size - 1}")
    if info.n_positions is not None and len(token_ids) > info.n_positions:
        raise UsageError(f"{len(token_ids)} tokens exceed the model's {info.n_positions} positions")
    raw = checkpoint.read_json("config.json") or {}
    return info.family.embed(checkpoint, info, token_ids, dtype, raw)


def hidden_state_before(checkpoint: Checkpoint, info: ModelInfo, native_config: BlockConfig,
                        x: torch.Tensor, layer: int, dtype: torch.dtype = torch.float32,
                        key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Run blocks 0..layer-1 (untraced, one loaded at a time) so block `layer` sees its real input.

    `native_config` is the checkpoint's own wiring: a user's rewiring applies to the traced block only.
    key_mask ([B, T], False at padding) keeps padded keys out of every earlier block's attention.
    """
    with torch.no_grad():
        for earlier in range(layer):
            block = load_block(checkpoint, info, earlier, native_config, dtype).to(x.device)
            block.attn.key_mask = key_mask
            x = block(x)
    return x
