"""The model as the Watch finds it: the blocks inside its wrappers, which of them train, where they live and in
which dtype they are stored, and whether FSDP2 shards them."""

from __future__ import annotations

import torch
from torch import nn

from blocktrace.errors import UsageError
from blocktrace.tracing.steps import detect_layout
from blocktrace.tracing.tracer import is_own_block
from blocktrace.training.arguments import Blocks
from blocktrace.training.distributed import is_shard


def sharded(model: nn.Module) -> bool:
    """Whether FSDP2 shards some parameter: its forward gathers the shards, a collective."""
    return any(is_shard(p) for p in model.parameters())


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside DistributedDataParallel / DataParallel wrappers."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def _known(block: nn.Module) -> bool:
    if is_own_block(block):
        return True
    try:
        detect_layout(block)
        return True
    except UsageError:
        return False


def find_blocks(model: nn.Module, blocks: Blocks = None) -> list[nn.Module]:
    """The model's Transformer blocks: the ones named (a list, or a dotted path to a ModuleList), else the
    longest ModuleList or nn.Sequential (the "LLMs from scratch" book's `trf_blocks`) whose modules blocktrace knows
    (HF GPT-2 / BERT / Llama-family layers, nanoGPT's and the book's blocks, blocktrace's own)."""
    model = unwrap(model)
    if isinstance(blocks, str):
        try:
            found = model.get_submodule(blocks)
        except AttributeError:
            raise UsageError(f"the model has no submodule {blocks!r} holding its blocks") from None
        if not isinstance(found, (nn.ModuleList, nn.Sequential)) or not len(found):
            raise UsageError(f"{blocks!r} is a {type(found).__name__}, not a list of blocks: give the path of the "
                             "ModuleList holding them (e.g. 'transformer.h' or 'model.layers')")
        return list(found)
    if blocks is not None:
        return list(blocks)
    candidates = [list(module) for module in model.modules()
                  if isinstance(module, (nn.ModuleList, nn.Sequential)) and len(module) and _known(module[0])]
    if not candidates:
        raise UsageError(f"cannot find the Transformer blocks of {type(model).__name__}: pass blocks= (a list of "
                         "modules, or the path of the ModuleList holding them, e.g. 'transformer.h')")
    return max(candidates, key=len)


def is_trainable(block: nn.Module) -> bool:
    """Whether any of the block's parameters requires a gradient (a block frozen on purpose is not judged)."""
    return any(p.requires_grad for p in block.parameters())


def device_of(block: nn.Module) -> torch.device:
    parameter = next(block.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


STORED_DTYPES = {torch.float16: "F16", torch.bfloat16: "BF16"}  # safetensors' names, as checkpoints say


def stored_dtype(block: nn.Module) -> str:
    parameter = next(block.parameters(), None)
    return STORED_DTYPES.get(parameter.dtype, "F32") if parameter is not None else "F32"
