"""`check --model FILE.py:FACTORY --weights CKPT`: the user's own model, built by its own code and given its
checkpoint as it is (no layout assumed, no key renamed), checked by one Watch record of one forward and backward.

The forward is called as training calls it by convention: with a `targets` (or `target`, `y`) parameter, as nanoGPT
does, on the ids less the last, with the ids advanced by one as targets; with `labels`, as HF does, on the ids
with labels = the ids (the model shifts them); else on the ids alone, the loss then next-token cross-entropy of the
logits it returns. The model runs in eval mode (no dropout: the check is reproducible). What the Watch measures,
judges and could not measure is then `track`'s to show, as for a training run's timeline.
"""

from __future__ import annotations

import inspect
import tempfile
import warnings
from pathlib import Path

import torch

from blocktrace.diagnose.loss import cross_entropy, next_token_labels
from blocktrace.errors import InputError, WeightsError
from blocktrace.pipeline.track import track_request
from blocktrace.request import RunRequest, TrackRequest
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.source import token_sequences
from blocktrace.sources.userblock import load_user_model
from blocktrace.training.forward_call import logits_of, loss_of
from blocktrace.training.watch import FIRST_ERROR_WARNING, Watch
from blocktrace.vocab import Level

SHIFTED_TARGETS = ("targets", "target", "y")  # nanoGPT's convention: the targets are the inputs advanced by one
HF_LABELS = "labels"  # HF's: labels = the inputs, shifted inside the model
SHOWN = 6  # tensor names listed in one error line


def _state(checkpoint: Checkpoint, model: torch.nn.Module, spec: str) -> dict:
    """The checkpoint's tensors under the model's own names, each as the model holds it; a name or a shape on one
    side only is refused, naming them."""
    own = model.state_dict()
    stored = set(checkpoint.keys)
    missing, unexpected = sorted(set(own) - stored), sorted(stored - set(own))
    if missing or unexpected:
        said = "; ".join(f"{what}: {', '.join(names[:SHOWN])}{' …' if len(names) > SHOWN else ''}"
                         for what, names in (("the model has but the file lacks", missing),
                                             ("the file has but the model lacks", unexpected)) if names)
        raise WeightsError(f"{checkpoint.path} does not fit {spec}'s model: {said}")
    state = {}
    for name, tensor in own.items():
        shape = tuple(checkpoint.shape(name))
        if shape != tuple(tensor.shape):
            raise WeightsError(f"{checkpoint.path}: {name} has shape {list(shape)}, {spec}'s model holds "
                               f"{list(tensor.shape)}")
        state[name] = checkpoint.get(name, tensor.dtype if tensor.is_floating_point() else None)
    return state


def _forward(model: torch.nn.Module, ids: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
    """The model's loss on the ids, called as its training calls it (see the module docstring), and how."""
    parameters = inspect.signature(model.forward).parameters
    name = next((n for n in (*SHIFTED_TARGETS, HF_LABELS) if n in parameters), None)
    if name == HF_LABELS:
        output, how = model(ids, labels=ids), "forward(ids, labels=ids) (HF's convention: the model shifts them)"
    elif name is not None:
        output = model(ids[:, :-1].contiguous(), **{name: ids[:, 1:].contiguous()})  # as a loader gives them
        how = f"forward(ids[:-1], {name}=ids[1:]) (nanoGPT's convention: the targets are the ids advanced by one)"
    else:
        output, how = model(ids), "forward(ids)"
    loss = loss_of(output)
    if loss is not None:
        return loss, [f"called {how}; the loss is the one the model returns"]
    logits = logits_of(output)
    if logits is None or logits.dim() != 3:
        raise InputError(f"the model's forward returned {type(output).__name__}: neither a loss nor [B, T, V] logits")
    if name is not None:
        raise InputError(f"the model's forward takes {name} but returned no loss")
    return cross_entropy(logits, next_token_labels(ids, None)), \
        [f"called {how}; the loss is next-token cross-entropy of the logits it returns (blocktrace's)"]


def _ids(request: RunRequest, checkpoint: Checkpoint) -> tuple[torch.Tensor, list[str]]:
    """The input as one [B, T] batch, and where it came from."""
    sequences, note = token_sequences(checkpoint.directory, request.inputs, None)
    if len({len(s) for s in sequences}) != 1:
        raise InputError("--model takes sequences of one length (the model's own code is not told of padding)")
    if len(sequences[0]) < 2:
        raise InputError("--model needs at least 2 token ids: the model is checked on predicting the next one")
    return torch.tensor(sequences), [note] if note else []


def user_model_record(spec: str, request: RunRequest, timeline: Path) -> list[str]:
    """One Watch record of the user's model on the request's ids, written to `timeline`; the notes of how."""
    checkpoint = Checkpoint(request.weights)
    model, called = load_user_model(spec, checkpoint.arguments)
    model.load_state_dict(_state(checkpoint, model, spec), strict=True)
    model.eval()
    ids, ids_note = _ids(request, checkpoint)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Watch(model, timeline, every=1, track_updates=False) as watch:
            try:
                loss, how = _forward(model, ids)
            except InputError:
                raise
            except Exception as error:  # the user's forward raised: one line, not its traceback
                raise InputError(f"--model {spec}: the model's forward raised {type(error).__name__}: {error}") \
                    from None
            loss.backward()
            watch.step(loss)
    # the Watch's own words, but its rollback warning: one record of no training has no step to roll back to
    said = [str(w.message) for w in caught if str(w.message).startswith("blocktrace")
            and not str(w.message).startswith(FIRST_ERROR_WARNING)]
    return [f"built by {called}", *how, *(f"the Watch said: {s}" for s in said), *checkpoint.notes, *ids_note]


def check_user_model(spec: str, request: RunRequest, fail_on: Level) -> tuple[dict, list[str]]:
    """`check --model`: the record judged as `track` judges a timeline of one record, and the notes of how."""
    with tempfile.TemporaryDirectory(prefix="blocktrace-check-model-") as directory:
        timeline = Path(directory) / "check.jsonl"
        notes = user_model_record(spec, request, timeline)
        report, _ = track_request(TrackRequest(sources=(timeline,), run=request, steps=None, grad=False, log=None,
                                               against=None, fail_on=fail_on))
    report.update(notes=notes, rollback=None)  # one record of no training: no step to roll back to
    return report, notes

