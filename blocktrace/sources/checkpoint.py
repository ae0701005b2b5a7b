"""Opening safetensors checkpoints lazily: files, keys, shapes, one tensor at a time.

Only the tensors asked for are read (safetensors memory-maps the file), so tracing one layer
of a multi-GB checkpoint costs about one layer's bytes. Pickle checkpoints are refused
without being unpickled: loading one runs arbitrary code.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from blocktrace.errors import WeightsError
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.hf_cache import resolve_weights

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
CONVERT_HINT = (
    "convert it once with: python -c \"import torch; from safetensors.torch import save_file; "
    "save_file(torch.load('IN', weights_only=True), 'OUT.safetensors')\""
)


def _refuse_pickle(path: Path) -> None:
    raise WeightsError(f"{path} is a pickle checkpoint, which blocktrace does not unpickle "
                       f"(it can run arbitrary code); {CONVERT_HINT}")


def _looks_like_pickle(path: Path) -> bool:
    """Asked only of files safetensors could not open: a safetensors header length may start with 0x80 too."""
    with open(path, "rb") as handle:
        head = handle.read(2)
    return head == b"PK" or (head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"))


def _stat(path: Path, role: str = "") -> os.stat_result:
    """stat of an existing path, or one line saying what is wrong with it."""
    try:
        return path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            raise WeightsError(f"{path}{role} is a symbolic link to nothing ({os.readlink(path)})") from None
        raise WeightsError(f"{path}{role} does not exist") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise WeightsError(f"{path}{role} is a symbolic link loop") from None
        raise WeightsError(f"cannot read {path}: {error.strerror or error}") from None


def _require_regular_file(path: Path, role: str = "") -> None:
    mode = _stat(path, role).st_mode
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise WeightsError(f"{path}{role} is {kind}: a checkpoint must be a regular .safetensors file "
                           "or a directory holding one")
    if not os.access(path, os.R_OK):
        raise WeightsError(f"cannot read {path}: Permission denied")


def _index_files(index: Path) -> list[str]:
    config = ConfigFile.read(index)
    weight_map = config.raw("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(f"{index} is not a valid safetensors index: weight_map must map tensor names "
                           "to file names")
    return sorted(set(weight_map.values()))


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError as error:
        raise WeightsError(f"cannot read {directory}: {error.strerror or error}") from None


def _files_in_directory(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if _exists(index):
        return [directory / name for name in _index_files(index)]
    single = directory / "model.safetensors"
    if _exists(single):
        return [single]
    entries = _listing(directory)
    others = [p for p in entries if p.suffix == ".safetensors"]
    if len(others) == 1:
        return others
    pickles = [p.name for p in entries if p.suffix in PICKLE_SUFFIXES]
    if pickles:
        raise WeightsError(f"{directory} holds only pickle checkpoints ({', '.join(pickles)}), "
                           f"which blocktrace does not unpickle; {CONVERT_HINT}")
    if others:
        raise WeightsError(f"{directory} holds {len(others)} .safetensors files and no "
                           "model.safetensors.index.json to say which belong together")
    raise WeightsError(f"{directory} holds no model.safetensors or model.safetensors.index.json")


def _exists(path: Path) -> bool:
    """Whether anything is at path (a broken link or a loop counts: it is reported when used)."""
    return os.path.lexists(path)


def resolve_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint given as a file or a HuggingFace-style directory."""
    mode = _stat(path).st_mode
    if stat.S_ISDIR(mode):
        files = _files_in_directory(path)
        for file in files:
            if not _exists(file):
                raise WeightsError(f"{file} is listed in the index but does not exist")
    else:
        if path.suffix in PICKLE_SUFFIXES:
            _require_regular_file(path)
            _refuse_pickle(path)
        files = [path]
    for file in files:
        _require_regular_file(file)
    return files


class Checkpoint:
    """Lazy access to the tensors of one checkpoint (one file or several shards)."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.path = resolve_weights(Path(path))
        self.directory = self.path if self.path.is_dir() else self.path.parent
        self._handles = {}
        self._file_of = {}
        for file in resolve_files(self.path):
            try:
                handle = safe_open(str(file), framework="pt")
            except OSError as error:
                raise WeightsError(f"cannot read {file}: {error.strerror or error}") from None
            except Exception as error:  # safetensors raises its own error types for bad headers
                if _looks_like_pickle(file):
                    _refuse_pickle(file)
                raise WeightsError(f"{file} is not a valid safetensors file: {error}") from None
            self._handles[file] = handle
            for key in handle.keys():
                self._file_of[key] = file

    def prefetch(self) -> None:
        """Ask the kernel to read every file ahead, sequentially (a whole-model pass reads every byte; without
        this, tensors arrive by page faults in the order they are used). Advisory: nothing happens where the
        platform has no posix_fadvise."""
        if not hasattr(os, "posix_fadvise"):
            return
        for file in self._handles:
            try:
                descriptor = os.open(file, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(descriptor)

    def metadata(self) -> dict:
        """The string metadata of the (first) file's header."""
        handle = next(iter(self._handles.values()))
        return dict(handle.metadata() or {})

    @property
    def keys(self) -> list[str]:
        return list(self._file_of)

    def __contains__(self, key: str) -> bool:
        return key in self._file_of

    def _slice(self, key: str):
        if key not in self._file_of:
            raise WeightsError(f"{self.path} has no tensor {key!r}")
        return self._handles[self._file_of[key]].get_slice(key)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())

    def dtype(self, key: str) -> str:
        return self._slice(key).get_dtype()

    def get(self, key: str, dtype: Optional[torch.dtype] = None,
            rows: Union[None, slice, Sequence[int]] = None) -> torch.Tensor:
        """One tensor, or some of its rows (a slice, or a list of row indices), converted to `dtype`."""
        if key not in self._file_of:
            raise WeightsError(f"{self.path} has no tensor {key!r}")
        handle = self._handles[self._file_of[key]]
        try:
            if rows is None:
                tensor = handle.get_tensor(key)
            elif isinstance(rows, slice):
                tensor = handle.get_slice(key)[rows]
            else:
                part = handle.get_slice(key)
                tensor = torch.cat([part[row : row + 1] for row in rows])
        except Exception as error:  # truncated data is found only when it is read
            raise WeightsError(f"cannot read tensor {key!r} from {self._file_of[key]}: {error}") from None
        return tensor if dtype is None else tensor.to(dtype)

    def read_json(self, name: str) -> Optional[ConfigFile]:
        """A JSON file beside the weights (config.json), or None when there is none."""
        candidate = self.directory / name
        if not _exists(candidate):
            return None
        _require_regular_file(candidate)
        return ConfigFile.read(candidate)
