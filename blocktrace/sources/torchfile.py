"""PyTorch checkpoint files (`ckpt.pt`, Lightning's `.ckpt`, `pytorch_model.bin`), read safely.

They are pickles, and a full unpickle runs whatever code the file names. They are read only
with torch's restricted loader (`torch.load(weights_only=True)`), which builds tensors and
plain containers and refuses anything else; there is no fallback to a full unpickle. A torch
without that loader is refused.

A training script's file holds more than the weights: the state dict is found under the key
the writer used (nanoGPT: `model`, Lightning: `state_dict`, …) and the model's arguments
where it stores them (nanoGPT: `model_args`, Lightning: `hyper_parameters`), with the step.
"""

from __future__ import annotations

import inspect
import os
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from blocktrace.errors import WeightsError
from blocktrace.request import starts_like_torch_save

TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# Where training code keeps the state dict inside a checkpoint, in the order they are tried.
STATE_DICT_KEYS = ("state_dict", "model", "model_state_dict", "module", "net", "weights")
# Where it keeps the model's constructor arguments (nanoGPT, Lightning's save_hyperparameters).
ARGUMENT_KEYS = ("model_args", "hyper_parameters", "hparams", "config")
# Where it keeps the training step.
STEP_KEYS = ("iter_num", "global_step", "step")


@dataclass
class TorchFile:
    tensors: dict  # name -> tensor, as the state dict names them
    location: str  # where the state dict was found, for the notes ("the file itself", "key 'model'")
    arguments: dict = field(default_factory=dict)  # the model's arguments, plain values only
    step: Optional[int] = None


def has_safe_loader() -> bool:
    return "weights_only" in inspect.signature(torch.load).parameters


def _refuse_other_bytes(path: Path) -> None:
    """A weight-named file that torch.save did not write (nanoGPT's train.bin of raw token ids is the usual one)."""
    if os.access(path, os.R_OK) and not starts_like_torch_save(path):  # unreadable: the loader says why
        raise WeightsError(f"{path} is not a PyTorch checkpoint: torch.save writes a zip archive or a pickle, and this "
                           "file starts with neither; raw token ids (such as nanoGPT's train.bin) are an input: "
                           f"--token-ids-file {path}")


def _load(path: Path):
    _refuse_other_bytes(path)
    if not has_safe_loader():
        raise WeightsError(f"{path} is a pickle, and this torch ({torch.__version__}) has no restricted loader "
                           "(weights_only): blocktrace never unpickles arbitrary objects; upgrade torch or convert "
                           "the file to safetensors")
    try:
        with warnings.catch_warnings():  # torch warns of a legacy file's pickle protocol: the error below says more
            warnings.simplefilter("ignore", UserWarning)
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as error:
                if "mmap" not in str(error):  # the legacy (non-zip) format cannot be memory-mapped
                    raise
                return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if _legacy_protocol(path) >= 4:
            raise WeightsError(f"{path} is torch's legacy (non-zip) format written with pickle protocol "
                               f"{_legacy_protocol(path)}, which torch's restricted loader cannot read: save it again "
                               "with torch.save's default format, or convert it to safetensors") from None
        detail = str(error).strip().splitlines()
        reason = next((line for line in detail if "Unsupported" in line or "GLOBAL" in line), detail[0] if detail else "")
        raise WeightsError(f"{path} holds Python objects other than tensors and plain containers, which blocktrace "
                           f"does not unpickle (they can run code) — {reason.strip()[:160]}; save the model's "
                           "state_dict() instead, or convert it to safetensors") from None
    except OSError as error:
        raise WeightsError(f"cannot read {path}: {error.strerror or error}") from None
    except Exception as error:  # torch raises many types for a file that is not a torch archive
        raise WeightsError(f"{path} is not a readable PyTorch checkpoint: {str(error).splitlines()[0][:160]}") \
            from None


def _legacy_protocol(path: Path) -> int:
    """The pickle protocol a legacy (non-zip) torch file starts with (0 for a zip archive or anything else)."""
    with open(path, "rb") as handle:
        head = handle.read(2)
    return head[1] if len(head) == 2 and head[0] == 0x80 else 0


def _is_state_dict(value) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(k, str) for k in value) \
        and any(isinstance(v, torch.Tensor) for v in value.values())


def _plain(arguments) -> dict:
    if not isinstance(arguments, dict):
        return {}
    return {k: v for k, v in arguments.items() if isinstance(k, str) and isinstance(v, (bool, int, float, str))}


def _step(content: dict) -> Optional[int]:
    for key in STEP_KEYS:
        value = content.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def read_torch_file(path: Path) -> TorchFile:
    content = _load(path)
    if _is_state_dict(content) and all(isinstance(v, torch.Tensor) for v in content.values()):
        return TorchFile(dict(content), "the file itself")
    if not isinstance(content, dict):
        raise WeightsError(f"{path} holds a {type(content).__name__}, not a state dict (a mapping of names to tensors)")
    for key in STATE_DICT_KEYS:
        if _is_state_dict(content.get(key)):
            tensors = {name: value for name, value in content[key].items() if isinstance(value, torch.Tensor)}
            arguments = next((_plain(content[k]) for k in ARGUMENT_KEYS if isinstance(content.get(k), dict)), {})
            return TorchFile(tensors, f"its {key!r} entry", arguments, _step(content))
    found = ", ".join(sorted(str(k) for k in content)[:8]) or "nothing"
    raise WeightsError(f"{path} holds no state dict: looked for the file itself and the entries "
                       f"{', '.join(STATE_DICT_KEYS)} (found: {found})")
