"""Layers of a checkpoint as blocktrace blocks, and token ids as the first block's input.

Only the tensors a layer needs are read. Every tensor of the layer must be read: one that
the family's mapping leaves unread means the checkpoint computes something blocktrace
would not (a bias, a QK-norm, an extra norm), and is refused with its name.
"""

from __future__ import annotations

from typing import Optional

import torch

from blocktrace.config import BlockConfig
from blocktrace.errors import UsageError, WeightsError, valid_indices
from blocktrace.model.block import TransformerBlock
from blocktrace.model.head import OutputHead, final_norm, masked_lm_transform
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import reading_as
from blocktrace.sources.families.base import ModelInfo, Reader


def check_layer_index(layer: int, n_layers: int) -> None:
    if not 0 <= layer < n_layers:
        raise UsageError(f"--layer {layer} is out of range: the checkpoint has {n_layers} layers: "
                         f"{valid_indices(n_layers)}")


def check_layer(info: ModelInfo, layer: int) -> None:
    check_layer_index(layer, info.n_layers)


def _reader(checkpoint: Checkpoint, base: str, dtype, read_keys: set) -> Reader:
    def read(names, expected: tuple) -> torch.Tensor:
        names = (names,) if isinstance(names, str) else names
        key = next((base + name for name in names if base + name in checkpoint), None)
        if key is None:
            raise WeightsError(f"{checkpoint.path} has no tensor {base + names[0]!r} (expected shape {list(expected)})")
        found = checkpoint.shape(key)
        if found != tuple(expected):
            raise WeightsError(f"tensor {key!r} has shape {list(found)}, expected {list(expected)}")
        read_keys.add(key)
        return checkpoint.get(key, dtype)
    return read


def _refuse_unread(checkpoint: Checkpoint, info: ModelInfo, layer: int, read_keys: set) -> None:
    base = info.layer_prefix(layer)
    ignored = {base + name for name in info.family.ignored}
    unread = sorted(key[len(base):] for key in checkpoint.keys
                    if key.startswith(base) and key not in read_keys and key not in ignored)
    if unread:
        raise WeightsError(f"layer {layer} of {checkpoint.path} holds tensors that blocktrace's {info.family_name} block "
                           f"does not use: {', '.join(unread[:6])}{' …' if len(unread) > 6 else ''}; the checkpoint "
                           "computes something else, so it is refused rather than traced wrongly")


def load_block(checkpoint: Checkpoint, info: ModelInfo, layer: int, config: BlockConfig,
               dtype: torch.dtype = torch.float32) -> TransformerBlock:
    """Layer `layer` as a TransformerBlock; only that layer's tensors are read."""
    config = config.replace_settings(info.family.layer_fields(info.config, layer))
    info.family.check(config)
    check_layer(info, layer)
    read_keys: set = set()
    with reading_as(checkpoint, info):
        state = info.family.parameters(_reader(checkpoint, info.layer_prefix(layer), dtype, read_keys), config)
        _refuse_unread(checkpoint, info, layer, read_keys)
    with torch.device("meta"):  # no random init of weights about to be replaced
        block = TransformerBlock(config)
    block.load_state_dict(state, strict=False, assign=True)
    missing = [name for name, p in block.named_parameters() if p.is_meta]
    if missing:
        raise WeightsError(f"layer {layer} of {checkpoint.path} lacks parameters for {', '.join(missing)}")
    return block.eval()


def embed_token_ids(checkpoint: Checkpoint, info: ModelInfo, token_ids: list[int],
                    dtype: torch.dtype = torch.float32, token_types: Optional[list[int]] = None) -> torch.Tensor:
    """The model's own embedding of the ids, `[T, d]`, reading only the rows needed."""
    if token_types is not None:
        _check_token_types(checkpoint, info, token_ids, token_types)
    if f"{info.prefix}{info.family.embedding_key}" not in checkpoint:
        raise WeightsError(f"{checkpoint.path} has no embeddings ({info.prefix}{info.family.embedding_key}): "
                           "use --input with a hidden-state tensor instead of token ids")
    check_token_ids(info, [token_ids])
    return info.family.embed(checkpoint, info, token_ids, dtype, token_types)


def embed_batch(checkpoint: Checkpoint, info: ModelInfo, rows: list[list[int]], dtype: torch.dtype,
                types: Optional[list[list[int]]] = None) -> torch.Tensor:
    """The model's own embedding of a batch of equally long rows of ids (with their token types), `[B, T, d]`."""
    kinds = types if types is not None else [None] * len(rows)
    return torch.stack([embed_token_ids(checkpoint, info, ids, dtype, row_types) for ids, row_types in zip(rows, kinds)])


def check_token_ids(info: ModelInfo, sequences: list[list[int]]) -> None:
    """Every id inside the vocabulary and every sequence within the model's positions — checked before the ids
    reach anything (a tokenizer's labels, an embedding row)."""
    bad = [i for ids in sequences for i in ids if info.vocab_size is not None and not 0 <= i < info.vocab_size]
    if bad:
        raise UsageError(f"token ids {bad[:10]} are out of range: the vocabulary has {info.vocab_size} ids: "
                         f"{valid_indices(info.vocab_size)}")
    longest = max(map(len, sequences), default=0)
    if info.family.learned_positions and info.n_positions is not None and longest > info.n_positions:
        raise UsageError(f"{longest} tokens exceed the model's {info.n_positions} positions")


def padding_id(info: ModelInfo, sequences: list[list[int]]) -> int:
    """The id that pads the shorter sequences (config.json's pad_token_id, else 0). Checked against the vocabulary
    when there is padding to do, so a bad config is blamed on the config and not on the user's ids."""
    pad_id = (info.config.integer("pad_token_id", 0, positive=False) if info.config is not None else 0) or 0
    pads = len({len(sequence) for sequence in sequences}) > 1
    if pads and info.vocab_size is not None and not 0 <= pad_id < info.vocab_size:
        raise WeightsError(f"{info.config.path}: pad_token_id {pad_id} is outside the vocabulary: "
                           f"{valid_indices(info.vocab_size)}")
    return pad_id


def _check_token_types(checkpoint: Checkpoint, info: ModelInfo, token_ids: list[int], token_types: list[int]) -> None:
    if not info.family.token_types:
        raise UsageError(f"--token-type-ids: {info.family_name} checkpoints have no token types (BERT's segment ids)")
    if len(token_types) != len(token_ids):
        raise UsageError(f"--token-type-ids gives {len(token_types)} types for {len(token_ids)} tokens: give one per "
                         "token")
    kinds = checkpoint.shape(f"{info.prefix}embeddings.token_type_embeddings.weight")[0]
    bad = sorted({t for t in token_types if not 0 <= t < kinds})
    if bad:
        raise UsageError(f"--token-type-ids {bad} are out of range: the checkpoint has {kinds} token types: "
                         f"{valid_indices(kinds)}")


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
            block.attend_with(key_mask)
            x = block(x)
    return x


def load_head(checkpoint: Checkpoint, info: ModelInfo, dtype: torch.dtype = torch.float32):
    """The model's final norm and output projection as one module, and its HeadSpec (NoLoss: there is none)."""
    spec = info.family.head(checkpoint, info)

    def get(key):
        return None if key is None else checkpoint.get(key, dtype)

    norm = None
    if spec.norm_weight is not None:
        norm = final_norm(spec.norm, get(spec.norm_weight), get(spec.norm_bias), spec.eps, spec.norm_offset)
    transform = None
    if spec.transform is not None:
        transform = masked_lm_transform(*(get(key) for key in spec.transform), spec.transform_activation, spec.eps)
    head = OutputHead(get(spec.weight), bias=get(spec.bias), norm=norm, transform=transform, softcap=spec.softcap,
                      logit_scale=spec.logit_scale)
    return head.eval(), spec
