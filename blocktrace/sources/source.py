"""What `run` and `compare` do, as library calls: request -> source -> blocks -> traces -> report.

Kept apart from cli.py so the CLI stays a thin layer of options and echo. A Source is what
both commands share: the config, where the parameters come from (a seed or a checkpoint)
and the block input.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from blocktrace.config import BlockConfig
from blocktrace.errors import InputError, UsageError, WeightsError
from blocktrace.sources.inputs import RANDOM_INPUT_NOTE, TOKEN_EMBEDDING_NOTE, random_input, split_tokens, tokens_to_input
from blocktrace.sources.tracefile import check_output_path, save_trace

DEFAULT_SEQ_LEN = 5
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}
SIZE_FIELDS = ("d_model", "n_heads", "d_ff")

__all__ = ["RunRequest", "prepare_source", "make_blocks", "check_output_path"]


@dataclass
class RunRequest:
    """Everything `run` or `compare` was asked, as plain values.

    `explicit` names the config fields the user typed: only those may override a checkpoint.
    """

    config_fields: dict
    explicit: set = field(default_factory=set)
    tokens_text: Optional[str] = None
    token_ids_text: Optional[str] = None
    text: Optional[str] = None
    input_path: Optional[Path] = None
    seq_len: Optional[int] = None
    batch: Optional[int] = None
    seed: int = 0
    weights: Optional[Path] = None
    layer: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    init: str = "default"
    attn_chunk: Optional[int] = None  # query rows per attention chunk; None: the memory budget decides


@dataclass
class Source:
    """The config, where parameters come from, and the input: shared by every variant."""

    config: BlockConfig
    x: torch.Tensor
    tokens: Optional[list[str]]  # labels for tables and heatmaps
    note: str  # how x was made
    seed: Optional[int]  # None with real weights
    weights: Optional[dict] = None  # path, layout, layer, n_layers
    checkpoint: object = None
    info: object = None
    native: Optional[BlockConfig] = None  # the checkpoint's own wiring
    input_varies: bool = True  # whether extra mini-batches may draw fresh random input
    token_mask: Optional[torch.Tensor] = None  # [B, T], False at padding (sequences of different lengths)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (use --device cpu or auto)")
    return torch.device(name)


def parse_token_ids(text: str) -> list[list[int]]:
    """One sequence of ids, or several separated by "/" (a padded batch): "1 2 3 / 4 5"."""
    sequences = []
    for part in text.split("/"):
        words = part.replace(",", " ").split()
        if not words:
            raise UsageError("--token-ids needs at least one id in every sequence, e.g. --token-ids 464 3797 318 "
                             "(several sequences: 464 3797 / 318)")
        try:
            sequences.append([int(word) for word in words])
        except ValueError:
            raise UsageError(f"--token-ids takes integers, not {text!r}") from None
    return sequences


def pad_sequences(sequences: list[list[int]], pad_id: int) -> tuple[list[list[int]], Optional[torch.Tensor]]:
    """Right-pad to the longest; the mask is False at padding (None for one sequence)."""
    if len(sequences) == 1:
        return sequences, None
    longest = max(map(len, sequences))
    mask = torch.tensor([[i < len(seq) for i in range(longest)] for seq in sequences])
    return [seq + [pad_id] * (longest - len(seq)) for seq in sequences], mask


def _chosen_inputs(request: RunRequest) -> list[str]:
    given = {"--tokens": request.tokens_text, "--token-ids": request.token_ids_text,
             "--text": request.text, "--input": request.input_path}
    chosen = [name for name, value in given.items() if value is not None]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} both give the input: use one of them")
    return chosen


def _with_batch(x: torch.Tensor, batch: Optional[int]) -> torch.Tensor:
    return x if batch is None or x.dim() == 3 else x.expand(batch, *x.shape).contiguous()


def load_input_file(path: Path, d_model: int) -> torch.Tensor:
    from blocktrace.sources.checkpoint import Checkpoint

    checkpoint = Checkpoint(path)
    names = checkpoint.keys
    name = "x" if "x" in names else (names[0] if len(names) == 1 else None)
    if name is None:
        raise InputError(f"{path} holds {len(names)} tensors and none is named 'x': "
                         f"found {', '.join(sorted(names)[:5])}")
    x = checkpoint.get(name, torch.float32)
    if x.dim() not in (2, 3) or x.shape[-1] != d_model:
        raise InputError(f"{path}: tensor {name!r} has shape {list(x.shape)}, expected [T, {d_model}] "
                         f"or [B, T, {d_model}]")
    return x


def _seeded_source(request: RunRequest, inputs: list[str]) -> Source:
    config = BlockConfig(**request.config_fields)
    if inputs and inputs[0] in ("--token-ids", "--text"):
        raise UsageError(f"{inputs[0]} needs real weights: add --weights PATH (or use --tokens)")
    seed = request.seed
    if request.input_path is not None:
        x = _with_batch(load_input_file(request.input_path, config.d_model), request.batch)
        return Source(config, x, None, f"tensor from {request.input_path}", seed, input_varies=False)
    if request.tokens_text is not None:
        tokens = split_tokens([request.tokens_text])
        if request.seq_len is not None and request.seq_len != len(tokens):
            raise UsageError(f"--seq-len {request.seq_len} contradicts the {len(tokens)} tokens given: "
                             "drop --seq-len")
        x = tokens_to_input(tokens, config.d_model, seed, request.batch)
        return Source(config, x, tokens, TOKEN_EMBEDDING_NOTE, seed, input_varies=False)
    x = random_input(request.seq_len or DEFAULT_SEQ_LEN, config.d_model, seed, request.batch)
    return Source(config, x, None, RANDOM_INPUT_NOTE, seed)


def _checkpoint_source(request: RunRequest, inputs: list[str]) -> Source:
    from blocktrace.sources import families as w
    from blocktrace.sources.checkpoint import Checkpoint
    from blocktrace.sources.tokenizer import encode_text, token_labels

    if not inputs or inputs[0] == "--tokens":
        raise UsageError("with --weights the input must come from the checkpoint: --token-ids 464 3797 ..., "
                         "--text \"...\" (needs tokenizer.json beside the weights), or --input FILE.safetensors")
    dtype = DTYPES[request.dtype]
    checkpoint = Checkpoint(request.weights)
    info = w.model_info(checkpoint)
    w.check_layer(info, request.layer)
    overrides = {key: request.config_fields[key] for key in request.explicit}
    native = w.checkpoint_config(checkpoint, info, {k: v for k, v in overrides.items() if k in SIZE_FIELDS})
    config = native.replace(**{k: v for k, v in overrides.items() if k not in SIZE_FIELDS})
    weights = {"path": str(request.weights), "layout": info.layout, "layer": request.layer,
               "n_layers": info.n_layers}
    common = dict(seed=None, weights=weights, checkpoint=checkpoint, info=info, native=native, input_varies=False)
    if request.input_path is not None:
        x = _with_batch(load_input_file(request.input_path, config.d_model).to(dtype), request.batch)
        return Source(config, x, None, f"tensor from {request.input_path}", **common)
    sequences = [encode_text(checkpoint.directory, request.text)] if request.text is not None \
        else parse_token_ids(request.token_ids_text)
    if len(sequences) > 1 and request.batch is not None:
        raise UsageError("--batch and several --token-ids sequences both set the batch: use one of them")
    raw = checkpoint.read_json("config.json") or {}
    padded, mask = pad_sequences(sequences, raw.get("pad_token_id") or 0)
    x = torch.stack([w.embed_token_ids(checkpoint, info, ids, dtype) for ids in padded])
    x = (x[0] if mask is None else x).to(resolve_device(request.device))  # earlier layers run there too
    device_mask = None if mask is None else mask.to(x.device)
    x = w.hidden_state_before(checkpoint, info, native, x, request.layer, dtype, key_mask=device_mask)
    via = {0: "", 1: " and block 0"}.get(request.layer, f" and blocks 0–{request.layer - 1}")
    note = f"token ids through the model's embeddings{via}"
    if mask is not None:
        note += f"; {len(sequences)} sequences right-padded to {mask.shape[1]}, padding masked and left out of the statistics"
    return Source(config, _with_batch(x, request.batch), token_labels(checkpoint.directory, sequences[0]),
                  note, token_mask=mask, **common)


def prepare_source(request: RunRequest) -> Source:
    inputs = _chosen_inputs(request)
    source = _checkpoint_source(request, inputs) if request.weights else _seeded_source(request, inputs)
    source.x = source.x.to(device=resolve_device(request.device), dtype=DTYPES[request.dtype])
    return source


def make_blocks(source: Source, request: RunRequest, n_layers: int,
                config: Optional[BlockConfig] = None) -> list[torch.nn.Module]:
    """n_layers blocks: seeded (layer l from seed + l) or the checkpoint's layers K..K+n-1."""
    from blocktrace.model.stack import build_stack
    from blocktrace.sources.families import load_block

    config = (config or source.config).replace(n_layers=n_layers if source.checkpoint is None
                                               else source.config.n_layers)
    if source.checkpoint is None:
        blocks = build_stack(config, n_layers, request.seed, request.init)
    else:
        last = request.layer + n_layers - 1
        if last >= source.info.n_layers:
            raise WeightsError(f"--layer {request.layer} with --layers {n_layers} needs layers up to {last}, "
                               f"but the checkpoint has {source.info.n_layers} layers: 0–{source.info.n_layers - 1}")
        blocks = [load_block(source.checkpoint, source.info, request.layer + i, config, DTYPES[request.dtype])
                  for i in range(n_layers)]
    return place_blocks(blocks, request, source)


def place_blocks(blocks: list, request: RunRequest, source: Source) -> list:
    """Move blocks to the requested device and dtype; set their attention chunking and padding mask."""
    device, dtype = resolve_device(request.device), DTYPES[request.dtype]
    for block in blocks:
        block.attn.query_chunk = request.attn_chunk
        block.attn.key_mask = None if source.token_mask is None else source.token_mask.to(device)
    return [block.to(device=device, dtype=dtype) for block in blocks]


def batch_maker(source: Source, request: RunRequest):
    """Mini-batch k for gradients: the input itself first; fresh seeded noise after, for random input."""
    def make(k: int) -> torch.Tensor:
        if k == 0 or not source.input_varies:
            return source.x
        x = random_input(source.x.shape[-2], source.config.d_model, request.seed + k, request.batch)
        return x.to(source.x.device, source.x.dtype)
    return make


def save_run(path: Path, trace_, tokens) -> None:
    save_trace(trace_, path, tokens, force=True)  # the path was checked before the run


def load_user_block(spec: str) -> torch.nn.Module:
    """Import `package.module:factory` (from the current directory too) and call the factory.

    This runs the user's code, by design: it is how a user's own block gets traced.
    """
    import importlib
    import os
    import sys

    module_name, _, factory_name = spec.partition(":")
    if not module_name or not factory_name:
        raise UsageError(f"--module takes package.module:factory, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # the user's module failed to import: say how, in one line
        raise InputError(f"--module {spec}: importing {module_name} failed: {type(error).__name__}: {error}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise InputError(f"--module {spec}: {module_name} has no callable {factory_name!r}")
    try:
        block = factory()
    except Exception as error:
        raise InputError(f"--module {spec}: {factory_name}() raised {type(error).__name__}: {error}") from None
    if not isinstance(block, torch.nn.Module):
        raise InputError(f"--module {spec}: {factory_name}() returned {type(block).__name__}, not a torch.nn.Module")
    return block.eval()


def block_width(block: torch.nn.Module) -> Optional[int]:
    """d_model read off the block's first norm (its normalized shape or 1-D gain)."""
    for module in block.modules():
        shape = getattr(module, "normalized_shape", None)
        if shape:
            return int(shape[-1])
        weight = getattr(module, "weight", None)
        if "norm" in type(module).__name__.lower() and isinstance(weight, torch.Tensor) and weight.dim() == 1:
            return int(weight.shape[0])
    return None


def user_block_source(request: RunRequest, block: torch.nn.Module) -> Source:
    """The input for a user's block: --tokens, --input or random, at the block's own width."""
    width = block_width(block)
    explicit = "d_model" in request.explicit
    if width is not None and explicit and width != request.config_fields["d_model"]:
        raise UsageError(f"--d-model {request.config_fields['d_model']} conflicts with the block's width {width}")
    d_model = width if width is not None else request.config_fields["d_model"]
    fields = {**request.config_fields, "d_model": d_model, "n_heads": 1}  # the block has its own heads
    seeded = _seeded_source(dataclasses.replace(request, config_fields=fields, weights=None), _chosen_inputs(request))
    seeded.x = seeded.x.to(device=resolve_device(request.device), dtype=DTYPES[request.dtype])
    return seeded
