"""The training forward as the Watch holds it: the call and its ids, the random state to replay it under, the model
in eval mode for a probe, and the logits and loss read off whatever the model returns."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from blocktrace.vocab import IGNORE_INDEX


def loss_of(output) -> Optional[torch.Tensor]:
    """A model output's loss: HF's .loss, or a (logits, loss) tuple's scalar; None where it returns none."""
    loss = getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor) and isinstance(output, (tuple, list)) and len(output) > 1:
        loss = output[1]
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


@dataclasses.dataclass(frozen=True)
class RandomState:
    """The CPU generator's state, and the CUDA device's where the model lives there (dropout draws from it)."""

    cpu: torch.Tensor
    device: Optional[torch.device] = None
    on_device: Optional[torch.Tensor] = None

    @classmethod
    def now(cls, device: torch.device) -> "RandomState":
        if device.type == "cuda":
            return cls(torch.get_rng_state(), device, torch.cuda.get_rng_state(device))
        return cls(torch.get_rng_state())

    @contextlib.contextmanager
    def restored(self):
        """The state restored, the training's own stream forked; the forwards run inside are the Watch's probes."""
        with torch.random.fork_rng(devices=[self.device] if self.device is not None else []):
            torch.set_rng_state(self.cpu)
            if self.device is not None:
                torch.cuda.set_rng_state(self.on_device, self.device)
            token = _PROBING.set(True)
            try:
                yield
            finally:
                _PROBING.reset(token)


_PROBING = contextvars.ContextVar("blocktrace_probing", default=False)


def probing() -> bool:
    """Whether a forward runs inside one of the Watch's own probes (not the loop's training or evaluation)."""
    return _PROBING.get()


@contextlib.contextmanager
def evaluating(model: nn.Module):
    """The model in eval mode (no dropout), every module's own mode restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, mode in modes:
            module.training = mode


def first_output(output, attribute: str):
    """A module output's main value: its `attribute` (HF's .logits, .last_hidden_state), else a tuple's first
    element, else the output itself."""
    found = getattr(output, attribute, None)
    if found is None:
        found = output[0] if isinstance(output, (tuple, list)) and output else output
    return found


def logits_of(output) -> Optional[torch.Tensor]:
    """A model output's logits: HF's .logits, a tuple's first tensor, or the tensor itself."""
    logits = first_output(output, "logits")
    return logits if isinstance(logits, torch.Tensor) and logits.dim() == 3 else None


def per_position(output) -> Optional[torch.Tensor]:
    """A forward's output at every position: its logits, else (a decoder called without its head) its hidden
    states — what the probes compare between two forwards."""
    found = logits_of(output)
    if found is None:
        found = first_output(output, "last_hidden_state")
    return found if isinstance(found, torch.Tensor) and found.dim() == 3 and found.is_floating_point() else None


def targets_cross_entropy(logits: Optional[torch.Tensor], targets: torch.Tensor) -> Optional[torch.Tensor]:
    """The mean cross-entropy of the logits against targets at their own positions (IGNORE_INDEX: not counted), in
    float32 as a loop computes it, returned in float64; None where the shapes do not pair."""
    if logits is None or targets.shape != logits.shape[:-1]:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1).to(logits.device),
                           ignore_index=IGNORE_INDEX).double().reshape(())


@dataclasses.dataclass
class ForwardCall:
    """How the training forward was called: its arguments as given (held until the record is made), the ids
    among them."""

    args: tuple
    kwargs: dict
    ids: torch.Tensor  # the very tensor passed (found among the arguments by identity)

    def with_ids(self, new: torch.Tensor, rows: Optional[torch.Tensor] = None) -> tuple[tuple, dict]:
        """The same call on `new` (the first `new.shape[1]` tokens of one sequence) in place of the ids: every
        other tensor of the batch cut alike — its batch dimension to the first sequence (or to `rows`, a device
        index: no host read), each later dimension as long as the sequence to the probe's length — so targets, masks
        and position ids follow the probed input."""
        batch, length = self.ids.shape[0], self.ids.shape[1]

        def cut(value):
            if value is self.ids:
                return new
            if not isinstance(value, torch.Tensor) or value.dim() == 0:
                return value
            if rows is not None and value.shape[0] == batch:
                value = value.index_select(0, rows.to(value.device))
            index = [slice(0, 1) if i == 0 and size == batch and rows is None else
                     slice(0, new.shape[1]) if i > 0 and size == length else slice(None)
                     for i, size in enumerate(value.shape)]
            return value[tuple(index)]

        return tuple(cut(v) for v in self.args), {key: cut(v) for key, v in self.kwargs.items()}
