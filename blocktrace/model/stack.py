"""Stacks of blocks: N blocktrace blocks with independent parameters (tracing.stack traces them)."""

from __future__ import annotations

from blocktrace.config import BlockConfig
from blocktrace.model.block import TransformerBlock, build_block
from blocktrace.vocab import Init


def build_stack(config: BlockConfig, n_layers: int, seed: int = 0, init: Init = Init.DEFAULT) -> list[TransformerBlock]:
    """n_layers blocks with independent parameters: layer l draws from seed + l."""
    config = config.replace(n_layers=n_layers)
    return [build_block(config, seed + layer, init) for layer in range(n_layers)]
