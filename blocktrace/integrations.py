"""The watch inside HuggingFace's Trainer: `Trainer(..., callbacks=[WatchCallback("run.jsonl", every=50)])`.

transformers is optional for blocktrace; importing this module needs it. The callback creates a
Watch on the Trainer's model when training begins (resumed runs continue at their global step),
records from `on_pre_optimizer_step` — after the backward, before the update, as the watch needs
— and closes the file when training ends. The loss is the model output's own `loss`, the
learning rate the optimizer's. Trainer clips gradients before that hook: with `max_grad_norm`
set, the gradient norms recorded are the clipped ones (Trainer logs the norm before clipping).
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

try:
    from transformers import TrainerCallback
except ImportError as error:  # pragma: no cover - exercised only without transformers
    raise ImportError("blocktrace.integrations needs transformers: pip install transformers") from error

from blocktrace.training.watch import Watch


class WatchCallback(TrainerCallback):
    """A blocktrace Watch for `transformers.Trainer`; options are Watch's (blocks=, tensorboard=, checks=, …)."""

    def __init__(self, path: Union[str, Path], every: int = 50, **options):
        self.path, self.every, self.options = path, every, options
        self.watch = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        options = {"append": state.global_step > 0, **self.options}  # a resumed run continues its timeline
        self.watch = Watch(model, self.path, self.every, optimizer=optimizer, start=state.global_step, **options)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.watch is not None:
            self.watch.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.watch is not None:
            self.watch.close()
            self.watch = None
