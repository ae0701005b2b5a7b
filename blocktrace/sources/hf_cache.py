"""`--weights openai-community/gpt2`: a model already in the local HuggingFace cache.

Offline only: the snapshot directory a model id points at is found the way huggingface_hub
lays out its cache (`models--{owner}--{name}/refs/main` → `snapshots/{commit}`), under
HF_HUB_CACHE, HF_HOME/hub or ~/.cache/huggingface/hub. Nothing is ever downloaded.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from blocktrace.errors import WeightsError
from blocktrace.request import WEIGHT_SUFFIXES

MODEL_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def hub_cache() -> Path:
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.environ[variable]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return base / "huggingface" / "hub"


def _snapshot(folder: Path) -> Optional[Path]:
    ref = folder / "refs" / "main"
    if ref.is_file():
        snapshot = folder / "snapshots" / ref.read_text().strip()
        if snapshot.is_dir():
            return snapshot
    snapshots = sorted((folder / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) \
        if (folder / "snapshots").is_dir() else []
    return snapshots[-1] if snapshots else None


def resolve_weights(path: Path) -> Path:
    """The path itself when it exists; else the cached snapshot of the model id it spells."""
    if os.path.lexists(path) or not MODEL_ID.match(str(path)) or Path(path).suffix.lower() in WEIGHT_SUFFIXES:
        if not os.path.lexists(path) and Path(path).suffix.lower() in WEIGHT_SUFFIXES:
            raise WeightsError(f"{path} does not exist")  # a file's name, not a model id: no cache to look in
        return path
    cache = hub_cache()
    folder = cache / ("models--" + str(path).replace("/", "--"))
    snapshot = _snapshot(folder) if folder.is_dir() else None
    if snapshot is None:
        raise WeightsError(f"{path} does not exist, and no model {str(path)!r} is in the local HuggingFace cache "
                           f"({cache}); blocktrace never downloads: fetch it first (huggingface-cli download {path})")
    return snapshot
