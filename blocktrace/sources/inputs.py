"""Turning what the user typed into the block input `x`.

Without real weights, token strings get a seeded embedding (same token, same vector, for a
given seed and width) plus the sinusoidal position encoding of "Attention Is All You Need";
a plain `--seq-len` gets standard-normal noise.
"""

from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path
from typing import Optional, Sequence

import torch

from blocktrace.errors import InputError, UsageError
from blocktrace.sources.checkpoint import Checkpoint

TOKEN_EMBEDDING_NOTE = "seeded random embedding per token + sinusoidal position encoding"
RANDOM_INPUT_NOTE = "standard normal noise drawn from seed + 1"


def split_tokens(words: Sequence[str]) -> list[str]:
    """`--tokens 猫 吃 鱼` and `--tokens "猫 吃 鱼"` both mean the three tokens 猫, 吃, 鱼."""
    tokens = [token for word in words for token in word.split()]
    if not tokens:
        raise UsageError("--tokens needs at least one token, e.g. --tokens 猫 吃 鱼")
    for token in tokens:
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:  # bytes the terminal could not decode arrive as lone surrogates
            raise UsageError(f"--tokens: {token.encode('utf-8', 'surrogateescape')!r} is not valid UTF-8 text") \
                from None
    return tokens


def token_embedding(token: str, d_model: int, seed: int) -> torch.Tensor:
    """A standard-normal vector that depends only on (token, d_model, seed)."""
    digest = hashlib.sha256(f"{seed}\x00{token}".encode("utf-8")).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
    return torch.randn(d_model, generator=generator)


def sinusoidal_positions(n_tokens: int, d_model: int) -> torch.Tensor:
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    positions = torch.arange(n_tokens, dtype=torch.float64).unsqueeze(1)
    rates = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(n_tokens, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(positions * rates)
    table[:, 1::2] = torch.cos(positions * rates)[:, : d_model // 2]
    return table.float()


def tokens_to_input(tokens: Sequence[str], d_model: int, seed: int, batch: Optional[int]) -> torch.Tensor:
    """[T, d] (or [B, T, d], every row the same sequence) for the given token strings."""
    embedded = torch.stack([token_embedding(token, d_model, seed) for token in tokens])
    x = embedded + sinusoidal_positions(len(tokens), d_model)
    return x if batch is None else x.expand(batch, *x.shape).contiguous()


def random_input(seq_len: int, d_model: int, seed: int, batch: Optional[int]) -> torch.Tensor:
    shape = (seq_len, d_model) if batch is None else (batch, seq_len, d_model)
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed + 1))


INTEGER = re.compile(r"-?[0-9]+")


def parse_token_ids(text: str, option: str = "--token-ids") -> list[list[int]]:
    """One sequence of ids, or several separated by "/" (a padded batch): "1 2 3 / 4 5"."""
    sequences = []
    for part in text.split("/"):
        words = part.replace(",", " ").split()
        if not words:
            raise UsageError(f"{option} needs at least one id in every sequence, e.g. {option} 464 3797 318 "
                             "(several sequences: 464 3797 / 318)")
        if not all(INTEGER.fullmatch(word) for word in words):  # int() also takes "+1", "1_000" and "١"
            raise UsageError(f"{option} takes integers written in ASCII digits (0–9, an optional minus), not "
                             f"{text!r}")
        sequences.append([int(word) for word in words])
    return sequences


def pad_sequences(sequences: list[list[int]], pad_id: int) -> tuple[list[list[int]], Optional[torch.Tensor]]:
    """Right-pad to the longest; the mask is False at padding (None when nothing is padded: an all-True mask would
    cost every statistic three masked passes and change none of them)."""
    longest = max(map(len, sequences))
    if all(len(seq) == longest for seq in sequences):
        return sequences, None
    mask = torch.tensor([[i < len(seq) for i in range(longest)] for seq in sequences])
    return [seq + [pad_id] * (longest - len(seq)) for seq in sequences], mask


def with_batch(x: torch.Tensor, batch: Optional[int], source: str) -> torch.Tensor:
    """Add a batch dimension of `batch` to a [T, d] input; a [B, T, d] input must agree with it."""
    if batch is None:
        return x
    if x.dim() == 3:
        if x.shape[0] != batch:
            raise UsageError(f"--batch {batch} contradicts {source}, which holds a batch of {x.shape[0]}: drop --batch")
        return x
    return x.expand(batch, *x.shape).contiguous()


def load_input_file(path: Path, d_model: int, check_shape=lambda shape: None) -> torch.Tensor:
    """The exact block input from a safetensors file: tensor "x", or its only tensor.

    `check_shape` sees the tensor's shape (from the file's header) before it is read.
    """
    checkpoint = Checkpoint(path)
    names = checkpoint.keys
    name = "x" if "x" in names else (names[0] if len(names) == 1 else None)
    if name is None:
        raise InputError(f"{path} holds {len(names)} tensors and none is named 'x': "
                         f"found {', '.join(sorted(names)[:5]) or 'none'}")
    shape = checkpoint.shape(name)
    if len(shape) not in (2, 3) or shape[-1] != d_model or 0 in shape:
        raise InputError(f"{path}: tensor {name!r} has shape {list(shape)}, expected [T, {d_model}] "
                         f"or [B, T, {d_model}] with T ≥ 1")
    if checkpoint.dtype(name) not in ("F64", "F32", "F16", "BF16"):
        raise InputError(f"{path}: tensor {name!r} holds {checkpoint.dtype(name)}, expected floating-point values")
    check_shape(shape)
    return checkpoint.get(name, torch.float32)
