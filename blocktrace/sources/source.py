"""Where a run's config, parameters and input come from: a seed, a checkpoint, or the user's block.

A Source is what every command shares: the config, where the parameters come from and the
block input (on its device, in its dtype), with a note on how the input was made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from blocktrace.config import BlockConfig
from blocktrace.errors import UsageError
from blocktrace.request import DEFAULT_SEQ_LEN, InputKind, RunRequest
from blocktrace.sizing import Shape
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import SIZE_FIELDS, checkpoint_config, model_info
from blocktrace.sources.idsfile import read_token_ids_file
from blocktrace.sources.inputs import (RANDOM_INPUT_NOTE, TOKEN_EMBEDDING_NOTE, load_input_file, pad_sequences,
                                       parse_token_ids, random_input, split_tokens, tokens_to_input, with_batch)
from blocktrace.sources.loader import check_layer, check_token_ids, embed_batch, hidden_state_before, padding_id
from blocktrace.sources.tokenizer import encode_text, read_text_file, token_labels, unknown_tokens_note
from blocktrace.sources.userblock import block_width
from blocktrace.vocab import Device, DType

# Called with the config and the input's shape before the input exists: refuses what cannot fit.
Budget = Callable[[BlockConfig, Shape], None]
TORCH_DTYPES = {DType.FLOAT32: torch.float32, DType.FLOAT64: torch.float64, DType.FLOAT16: torch.float16,
                DType.BFLOAT16: torch.bfloat16}


@dataclass
class Source:
    """The config, where parameters come from, and the input: shared by every variant."""

    config: BlockConfig
    x: torch.Tensor
    tokens: Optional[list[str]]  # labels for tables and heatmaps
    note: str  # how x was made
    seed: Optional[int]  # None with real weights
    weights: Optional[dict] = None  # path, family, layer, n_layers
    checkpoint: object = None
    info: object = None
    native: Optional[BlockConfig] = None  # the checkpoint's own wiring
    input_varies: bool = True  # whether extra mini-batches may draw fresh random input
    token_mask: Optional[torch.Tensor] = None  # [B, T], False at padding (sequences of different lengths)
    notes: list[str] = field(default_factory=list)  # what the reader should know about the input


def torch_dtype(dtype: DType) -> torch.dtype:
    return TORCH_DTYPES[dtype]


def resolve_device(device: Device) -> torch.device:
    if device is Device.AUTO:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device is Device.CUDA and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here (use --device cpu or auto)")
    return torch.device(device.value)


def _one_input(given: list[InputKind]) -> None:
    if len(given) > 1:
        raise UsageError(f"{' and '.join(kind.value for kind in given)} both give the input: use one of them")


def _no_budget(config: BlockConfig, shape: Shape) -> None:
    return None


def _input_file(path, config: BlockConfig, batch: Optional[int], budget: Budget, dtype=torch.float32) -> torch.Tensor:
    x = load_input_file(path, config.d_model, lambda shape: budget(config, Shape(batch or (shape[0] if len(shape) == 3
                                                                                         else 1), shape[-2])))
    return with_batch(x.to(dtype), batch, f"--input {path}")


def _seeded(request: RunRequest, config: BlockConfig, budget: Budget) -> Source:
    inputs, seed = request.inputs, request.seed
    given = inputs.given()
    _one_input(given)
    if given and given[0].through_checkpoint:
        raise UsageError(f"{given[0].value} needs real weights: add --weights PATH (or use --tokens)")
    if inputs.input_path is not None:
        x = _input_file(inputs.input_path, config, inputs.batch, budget)
        return Source(config, x, None, f"tensor from {inputs.input_path}", seed, input_varies=False)
    if inputs.tokens is not None:
        tokens = split_tokens([inputs.tokens])
        if inputs.seq_len is not None and inputs.seq_len != len(tokens):
            raise UsageError(f"--seq-len {inputs.seq_len} contradicts the {len(tokens)} tokens given: drop --seq-len")
        budget(config, Shape(inputs.batch or 1, len(tokens)))
        x = tokens_to_input(tokens, config.d_model, seed, inputs.batch)
        return Source(config, x, tokens, TOKEN_EMBEDDING_NOTE, seed, input_varies=False)
    budget(config, Shape(inputs.batch or 1, inputs.seq_len or DEFAULT_SEQ_LEN))
    x = random_input(inputs.seq_len or DEFAULT_SEQ_LEN, config.d_model, seed, inputs.batch)
    return Source(config, x, None, RANDOM_INPUT_NOTE, seed)


def _checkpoint_source(request: RunRequest, budget: Budget) -> Source:
    inputs = request.inputs
    given = inputs.given()
    _one_input(given)
    if not given or given[0] is InputKind.TOKENS:
        raise UsageError("with --weights the input must come from the checkpoint: --token-ids 464 3797 ..., "
                         "--token-ids-file FILE, --text \"...\" or --text-file FILE (need tokenizer.json beside the weights), or "
                         "--input "
                         "FILE.safetensors")
    dtype = torch_dtype(request.dtype)
    checkpoint = Checkpoint(request.weights)
    info = model_info(checkpoint)
    layer = request.first_layer
    check_layer(info, layer)
    overrides = {key: value for key, value in request.config_fields.items() if key in request.explicit}
    native = checkpoint_config(checkpoint, info, {k: v for k, v in overrides.items() if k in SIZE_FIELDS})
    config = native.replace(**{k: v for k, v in overrides.items() if k not in SIZE_FIELDS})
    weights = {"path": str(request.weights), "family": info.family_name, "layer": layer,
               "n_layers": info.n_layers}
    common = dict(seed=None, weights=weights, checkpoint=checkpoint, info=info, native=native, input_varies=False,
                  notes=list(info.notes))
    if inputs.input_path is not None:
        x = _input_file(inputs.input_path, config, inputs.batch, budget, dtype)
        return Source(config, x, None, f"tensor from {inputs.input_path}", **common)
    return _token_source(request, budget, config, common)


def _token_source(request: RunRequest, budget: Budget, config: BlockConfig, common: dict) -> Source:
    """Token ids through the checkpoint's embeddings and the layers before the one traced."""
    inputs, checkpoint, info, layer = request.inputs, common["checkpoint"], common["info"], request.first_layer
    dtype = torch_dtype(request.dtype)
    sequences, ids_note = token_sequences(checkpoint.directory, inputs, info.n_positions)
    if len(sequences) > 1 and inputs.batch is not None:
        raise UsageError("--batch and several --token-ids sequences both set the batch: use one of them")
    padded, mask, padded_types = token_batch(info, inputs, sequences)
    budget(config, Shape(inputs.batch or len(padded), len(padded[0])))
    x = embed_batch(checkpoint, info, padded, dtype, padded_types)
    x = (x[0] if len(padded) == 1 else x).to(resolve_device(request.device))  # earlier layers run there too
    device_mask = None if mask is None else mask.to(x.device)
    x = hidden_state_before(checkpoint, info, common["native"], x, layer, dtype, key_mask=device_mask)
    via = {0: "", 1: " and block 0"}.get(layer, f" and blocks 0–{layer - 1}")
    note = f"token ids through the model's embeddings{via}"
    if mask is not None:
        note += f"; {len(sequences)} sequences right-padded to {mask.shape[1]}, padding masked and left out of the statistics"
    labels, label_note = token_labels(checkpoint.directory, sequences[0])
    source = Source(config, with_batch(x, inputs.batch, "the token ids"), labels, note, token_mask=mask, **common)
    source.notes += [n for n in (ids_note, label_note) if n]
    return source


def _windows(ids: list[int], positions: Optional[int]) -> list[list[int]]:
    if positions is None or len(ids) <= positions:
        return [ids]
    return [ids[start : start + positions] for start in range(0, len(ids), positions)]


def token_sequences(directory, inputs, positions: Optional[int]) -> tuple[list[list[int]], Optional[str]]:
    """The token ids the input options give, and a note on where they came from: --token-ids, --token-ids-file,
    --text, or --text-file (one sequence per line; a line longer than the model's positions becomes consecutive
    windows of them)."""
    if inputs.token_ids_file is not None:
        read = read_token_ids_file(inputs, positions)
        return read.sequences, f"token ids: {read.note}"
    if inputs.text_file is not None:
        sequences = [window for line in read_text_file(inputs.text_file)
                     for window in _windows(encode_text(directory, line), positions)]
        return sequences, unknown_tokens_note(directory, sequences)
    if inputs.text is not None:
        sequences = [encode_text(directory, inputs.text)]
        return sequences, unknown_tokens_note(directory, sequences)
    return parse_token_ids(inputs.token_ids), None


def token_batch(info, inputs, sequences: list[list[int]]):
    """The sequences as one batch: (ids right-padded with the model's pad id, the padding mask or None, the token
    types padded with 0 or None). Ids are checked against the vocabulary before anything reads them."""
    check_token_ids(info, sequences)
    types = _token_types(inputs, sequences)
    padded, mask = pad_sequences(sequences, padding_id(info, sequences))
    return padded, mask, None if types is None else pad_sequences(types, 0)[0]


def _token_types(inputs, sequences: list[list[int]]) -> Optional[list[list[int]]]:
    if inputs.token_types is None:
        return None
    types = parse_token_ids(inputs.token_types, "--token-type-ids")
    if len(types) != len(sequences) or any(len(t) != len(s) for t, s in zip(types, sequences)):
        raise UsageError(f"--token-type-ids must give one type per token, sequence by sequence: "
                         f"{[len(s) for s in sequences]} tokens, {[len(t) for t in types]} types")
    return types


def _on_device(source: Source, request: RunRequest) -> Source:
    source.x = source.x.to(device=resolve_device(request.device), dtype=torch_dtype(request.dtype))
    return source


def prepare_source(request: RunRequest, budget: Budget = _no_budget) -> Source:
    """The source of blocktrace's own blocks: seeded, or a checkpoint's layers.

    `budget` sees the config and the input's shape before the input (or any block) exists.
    """
    if request.weights is not None:
        return _on_device(_checkpoint_source(request, budget), request)
    return _on_device(_seeded(request, BlockConfig(**request.config_fields), budget), request)


def user_block_source(request: RunRequest, block: torch.nn.Module) -> Source:
    """The input for a user's block: --tokens, --input or random, at the block's own width."""
    width = block_width(block)
    explicit = "d_model" in request.explicit
    if width is not None and explicit and width != request.config_fields["d_model"]:
        raise UsageError(f"--d-model {request.config_fields['d_model']} conflicts with the block's width {width}")
    d_model = width if width is not None else request.config_fields["d_model"]
    config = BlockConfig(d_model=d_model, n_heads=1)  # only the width is ours: the block has its own heads
    return _on_device(_seeded(dataclasses.replace(request, weights=None), config, _no_budget), request)
