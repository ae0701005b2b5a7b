"""What the Watch is given, checked before anything is attached: its arguments' types, step()'s loss and lr as a
record takes them, and the step of the first forward of a timeline started or continued."""

from __future__ import annotations

import numbers
from os import PathLike
from typing import Any, Optional, Sequence, Union

import torch
from torch import nn

from blocktrace.errors import UsageError
from blocktrace.training.timeline import TimelineWriter

Blocks = Union[None, str, Sequence[nn.Module]]


def first_step(writer: Optional[TimelineWriter], start: Optional[int]) -> int:
    """The step of the first forward: start=, else the step after the last record of the timeline continued
    (append=True), else 0. A start that would repeat a step the timeline holds is refused."""
    last = writer.last_step if writer is not None else None
    if start is None:
        return 0 if last is None else last + 1
    if last is not None and start <= last:
        raise UsageError(f"start={start} would repeat step {start} of {writer.path}, which holds steps up to {last}: "
                         f"give start={last + 1} or more (or leave start out to continue from there)")
    return start


def _is_integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_arguments(model, path, every, start, blocks, optimizer, tensorboard, **flags) -> None:
    """Wrong types are refused with one UsageError naming the argument (never an AttributeError deep inside)."""
    if not isinstance(model, nn.Module):
        raise UsageError(f"Watch needs the torch.nn.Module being trained, not {type(model).__name__}")
    if not isinstance(path, (str, PathLike)):
        raise UsageError(f"path must be the timeline file's path (a str or Path), not {type(path).__name__}")
    if not _is_integer(every) or every < 1:
        raise UsageError(f"every must be a positive integer, not {every!r}")
    if start is not None and (not _is_integer(start) or start < 0):
        raise UsageError(f"start must be a training step (an integer ≥ 0), not {start!r}")
    if not (blocks is None or isinstance(blocks, str) or
            (isinstance(blocks, (list, tuple, nn.ModuleList)) and blocks and
             all(isinstance(block, nn.Module) for block in blocks))):
        raise UsageError("blocks must be None (found by the Watch), the dotted path of the ModuleList holding "
                         f"them, or a non-empty list of modules; not {blocks!r:.80}")
    if optimizer is not None and not isinstance(getattr(optimizer, "param_groups", None), list):
        raise UsageError(f"optimizer must be a torch optimizer (with param_groups), not {type(optimizer).__name__}")
    if not (tensorboard is None or hasattr(tensorboard, "add_scalar") or isinstance(tensorboard, (str, PathLike))):
        raise UsageError("tensorboard must be a SummaryWriter (anything with add_scalar) or a log directory, "
                         f"not {type(tensorboard).__name__}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise UsageError(f"{name} must be True or False, not {value!r:.80}")


def scalar_argument(name: str, value) -> tuple[Any, Optional[str]]:
    """step()'s loss or lr as the record takes it, and what was wrong with it (None: nothing). A number of any real
    type (numpy's too) or a one-element tensor is taken as it is; a tensor of several floating elements (the
    per-device losses nn.DataParallel gathers) as its mean; anything else as not given (the model output's own
    loss, the optimizer's lr, are then taken where there are ones). Never raises: step() runs inside the loop."""
    if value is None or (isinstance(value, numbers.Real) and not isinstance(value, bool)):
        return (None if value is None else float(value)), None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value, None
    if isinstance(value, torch.Tensor) and value.numel() > 1 and value.is_floating_point():
        return value.detach().mean(), f"{name} of shape {list(value.shape)} recorded as its mean"
    shape = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
    return None, (f"{name} must be a number or a one-element tensor (or None), not {type(value).__name__}{shape}: "
                  "ignored, as if not given")
