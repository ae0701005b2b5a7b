"""Turning what the user typed into the block input `x`.

Without real weights, token strings get a seeded embedding (same token, same vector, for a
given seed and width) plus the sinusoidal position encoding of "Attention Is All You Need";
a plain `--seq-len` gets standard-normal noise.
"""

from __future__ import annotations

import hashlib
import math
from typing import Optional, Sequence

import torch

from blocktrace.errors import UsageError

TOKEN_EMBEDDING_NOTE = "seeded random embedding per token + sinusoidal position encoding"
RANDOM_INPUT_NOTE = "standard normal noise drawn from seed + 1"


def split_tokens(words: Sequence[str]) -> list[str]:
    """`--tokens 猫 吃 鱼` and `--tokens "猫 吃 鱼"` both mean the three tokens 猫, 吃, 鱼."""
    tokens = [token for word in words for token in word.split()]
    if not tokens:
        raise UsageError("--tokens needs at least one token, e.g. --tokens 猫 吃 鱼")
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
