"""Which training step a checkpoint holds: stored in the file, in trainer_state.json (HF Trainer), or its name.

`step_0400`, `checkpoint-400`, `ckpt400`, `iter_400`, `global_step400` all say step 400. A
checkpoint at step 0 has seen no update: whatever is wrong with it is its initialisation.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from blocktrace.errors import WeightsError
from blocktrace.sources.checkpoint import resolve_files
from blocktrace.sources.reading import parse_json
from blocktrace.sources.torchfile import TORCH_SUFFIXES, read_torch_file

STEP_IN_NAME = re.compile(r"(?:^|[^a-z])(?:step|checkpoint|ckpt|iter|iteration|global_step|epoch)[-_]?(\d+)$",
                          re.IGNORECASE)


def _stored_step(path: Path) -> Optional[int]:
    """The step a training script stored inside a PyTorch checkpoint (nanoGPT's iter_num, Lightning's global_step)."""
    try:
        files = resolve_files(path)
        return read_torch_file(files[0]).step if len(files) == 1 and files[0].suffix.lower() in TORCH_SUFFIXES else None
    except WeightsError:
        return None  # reported when the checkpoint itself is read


def step_of(path: Path) -> Optional[int]:
    """The step stored in a PyTorch checkpoint file, else as step_named says."""
    stored = _stored_step(Path(path))
    return stored if stored is not None else step_named(path)


def step_named(path: Path) -> Optional[int]:
    """The step in trainer_state.json beside the checkpoint, else the one in its name."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    state = directory / "trainer_state.json"
    if state.is_file():
        try:
            state_data = parse_json(state.read_text(encoding="utf-8"))
            step = state_data.get("global_step") if isinstance(state_data, dict) else None
            if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                return step
        except (ValueError, OSError):
            pass
    for name in (path.stem if path.is_file() else path.name, directory.name):
        match = STEP_IN_NAME.search(name)
        if match:
            return int(match.group(1))
    return None
