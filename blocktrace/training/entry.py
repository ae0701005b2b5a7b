"""The module the training loop calls — the model the Watch was given, or the part of it the loop calls instead.

A loop may call a part of the model and finish the forward itself: the decoder `model.model`, with the output matrix
applied as `F.linear(h, W)` (the layout of a chunked or fused linear + cross-entropy loss). The model's own forward
then never runs, and hooks on it see no batch. Each module between the model and its first block is watched too:
the first that runs with gradients outside the entry's own forward becomes the entry, and the batch is read there.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from blocktrace.training.embedding_rows import input_vocabulary
from blocktrace.training.forward_call import first_output, logits_of, loss_of

Starts = Callable[[nn.Module, tuple, dict], None]


def ancestors(model: nn.Module, block: nn.Module) -> list[nn.Module]:
    """The modules between `model` and `block` (both left out), outermost first; containers that are never called
    (ModuleList, ModuleDict) left out too."""
    name = next((qualified for qualified, module in model.named_modules() if module is block), None)
    if not name:
        return []
    parts = name.split(".")[:-1]
    found = [model.get_submodule(".".join(parts[:depth])) for depth in range(1, len(parts) + 1)]
    return [module for module in found if not isinstance(module, (nn.ModuleList, nn.ModuleDict))]


def qualified_name(model: nn.Module, module: nn.Module) -> str:
    return next((name for name, found in model.named_modules() if found is module), "") or "the model"


class Entry:
    """Calls `on_start(module, args, kwargs)` at every forward of the entry; `on_moved(old, new, args, kwargs)` when
    the loop is found calling a part of the model instead (then `on_start` for that call too)."""

    def __init__(self, model: nn.Module, first_block: Optional[nn.Module], on_start: Starts,
                 on_moved: Callable[[nn.Module, nn.Module, tuple, dict], None]):
        self.model, self.module = model, model
        self.vocabulary = input_vocabulary(model)
        self.on_start, self.on_moved = on_start, on_moved
        self.depth = 0  # the entry's forwards under way (a model may call itself): the parts they call are no entries
        parts = ancestors(model, first_block) if first_block is not None else []
        self.part_hooks = [part.register_forward_pre_hook(self._part_starts, with_kwargs=True) for part in parts]
        self.hooks = self._hooked(model)

    @property
    def is_model(self) -> bool:
        return self.module is self.model

    @property
    def name(self) -> str:
        """The entry's name in the model ("the model" for the model itself)."""
        return qualified_name(self.model, self.module)

    def model_output(self, output):
        """The entry's output as the model's: the model's own, or a part's where its logits span the vocabulary
        (else None: a decoder's [B, T, d] hidden states are no logits, and it returns no loss)."""
        if self.is_model:
            return output
        logits = logits_of(output)
        return output if logits is not None and logits.shape[-1] == self.vocabulary else None

    def anchor(self, output) -> Optional[torch.Tensor]:
        """Where a training forward's backward starts to be seen: its loss where it returns one, else its logits;
        for a part of the model, else the first floating tensor it returns (a decoder's hidden states)."""
        readable = self.model_output(output)
        found = loss_of(readable)
        if found is None:
            found = logits_of(readable)
        return found if found is not None or self.is_model else _first_float(output)

    def _hooked(self, module: nn.Module) -> list:
        return [module.register_forward_pre_hook(self._starts, with_kwargs=True),
                module.register_forward_hook(self._ends, always_call=True)]

    def _starts(self, module, args, kwargs) -> None:
        self.depth += 1
        self.on_start(module, args, kwargs)

    def _ends(self, module, args, output) -> None:
        self.depth = max(0, self.depth - 1)

    def _part_starts(self, module, args, kwargs) -> None:
        """A part of the model runs: inside the entry's forward, nothing; called by the loop with gradients (an
        evaluation runs under no_grad), it becomes the entry from this call on."""
        if self.depth > 0 or module is self.module or not torch.is_grad_enabled():
            return
        old = self.module
        for hook in self.hooks:
            hook.remove()
        # registered during this call's pre-hooks: the new pre-hook runs from the next call (torch has already
        # listed this call's), the forward hook at this call's end (listed after the forward)
        self.module, self.hooks = module, self._hooked(module)
        self.on_moved(old, module, args, kwargs)
        self._starts(module, args, kwargs)

    def close(self) -> None:
        for hook in (*self.hooks, *self.part_hooks):
            hook.remove()
        self.hooks, self.part_hooks = [], []


def _first_float(output) -> Optional[torch.Tensor]:
    """A module's first floating tensor output: HF's last_hidden_state, a tuple's first, or the tensor itself."""
    found = first_output(output, "last_hidden_state")
    return found if isinstance(found, torch.Tensor) and found.is_floating_point() else None
