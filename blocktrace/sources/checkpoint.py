"""Opening safetensors checkpoints lazily: files, keys, shapes, one tensor at a time.

Only the tensors asked for are read (safetensors memory-maps the file), so tracing one layer
of a multi-GB checkpoint costs about one layer's bytes. PyTorch checkpoint files
(`ckpt.pt`, `.ckpt`, `pytorch_model.bin`) are read with torch's restricted loader only
(sources.torchfile); plain pickles are refused without being unpickled.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import Iterator, Optional, Sequence, Union

import torch
from safetensors import safe_open

from blocktrace.errors import WeightsError
from blocktrace.files import file_kind
from blocktrace.request import may_hold_weights, starts_like_torch_save
from blocktrace.sizing import available_bytes
from blocktrace.sources import readahead
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.hf_cache import resolve_weights
from blocktrace.sources.torchfile import TORCH_SUFFIXES, read_torch_file

PICKLE_SUFFIXES = (".pkl", ".pickle")  # plain pickles: not even the restricted loader is asked
# Prefixes that wrappers put before every key; never part of a model's own names.
WRAPPER_PREFIXES = {"_orig_mod.": "torch.compile", "module.": "DistributedDataParallel"}
# safetensors' names for torch dtypes, so a loaded file reports dtypes as a safetensors file does.
DTYPE_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
               torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
               torch.bool: "BOOL", **{getattr(torch, name): label for name, label in (
                   ("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("uint16", "U16"), ("uint32", "U32"),
                   ("uint64", "U64")) if hasattr(torch, name)}}
# The one list of what a weight may be stored as: the float formats blocktrace computes in, and float8, read upcast
# (with a note). Every other kind — integers of any width, unsigned, bool, complex, quantized, sparse, nested — is
# refused by name before any conversion (an integer weight is quantised; a complex one would lose its imaginary part).
COMPUTED_DTYPES = ("F64", "F32", "F16", "BF16")
UPCAST_DTYPES = ("F8_E4M3", "F8_E5M2")
READ_DTYPES = COMPUTED_DTYPES + UPCAST_DTYPES


def _refuse_pickle(path: Path) -> None:
    raise WeightsError(f"{path} is a plain pickle, which blocktrace does not unpickle (it can run arbitrary code); "
                       "save the model's state_dict with torch.save (read with torch's restricted loader) or "
                       "safetensors")


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
        raise WeightsError(f"{path}{role} is {file_kind(mode)}: a checkpoint must be a regular file "
                           "(.safetensors, or a PyTorch .pt/.pth/.bin/.ckpt) or a directory holding one")
    if not os.access(path, os.R_OK):
        raise WeightsError(f"cannot read {path}: Permission denied")


def _index_files(index: Path) -> list[str]:
    config = ConfigFile.read(index)
    weight_map = config.raw("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise WeightsError(f"{index} is not a valid safetensors index: weight_map must map tensor names "
                           "to file names")
    names = sorted(set(weight_map.values()))
    outside = [name for name in names if os.path.isabs(name) or ".." in Path(name).parts]
    if outside:
        raise WeightsError(f"{index}: weight_map names {outside[0]!r}, outside the checkpoint's folder; an index "
                           "may only name files beside it")
    return names


def _listing(directory: Path) -> list[Path]:
    try:
        return sorted(directory.iterdir())
    except OSError as error:
        raise WeightsError(f"cannot read {directory}: {error.strerror or error}") from None


# The files a HuggingFace-style directory may hold its weights in, in the order they are looked for.
INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin")


def _files_in_directory(directory: Path) -> list[Path]:
    for name in INDEXES:
        if _exists(directory / name):
            _require_regular_file(directory / name)
            return [directory / name for name in _index_files(directory / name)]
    for name in SINGLE_FILES:
        if _exists(directory / name):
            return [directory / name]
    entries = _listing(directory)
    for suffixes in ((".safetensors",), TORCH_SUFFIXES):
        found = [p for p in entries if p.suffix.lower() in suffixes]
        if len(found) == 1:
            return found
        if found:
            raise WeightsError(f"{directory} holds {len(found)} checkpoint files ({', '.join(p.name for p in found[:4])}) "
                               "and no index to say which belong together: name one file")
    pickles = [p.name for p in entries if p.suffix.lower() in PICKLE_SUFFIXES]
    if pickles:
        _refuse_pickle(directory / pickles[0])
    raise WeightsError(f"{directory} holds no model.safetensors, model.safetensors.index.json or PyTorch checkpoint "
                       f"({', '.join('*' + s for s in TORCH_SUFFIXES)})")


def _exists(path: Path) -> bool:
    """Whether anything is at path (a broken link or a loop counts: it is reported when used)."""
    return os.path.lexists(path)


def resolve_files(path: Path) -> list[Path]:
    """The weight files of a checkpoint given as a file or a HuggingFace-style directory."""
    mode = _stat(path).st_mode
    if stat.S_ISDIR(mode):
        files = _files_in_directory(path)
        for file in files:
            if not _exists(file):
                raise WeightsError(f"{file} is listed in the index but does not exist")
    else:
        files = [path]
    for file in files:
        _require_regular_file(file)
        if file.suffix.lower() in PICKLE_SUFFIXES:
            _refuse_pickle(file)
    return files


class _LoadedSlice:
    """A loaded tensor behind the interface of a safetensors slice."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self.tensor.shape)

    def get_dtype(self) -> str:
        """safetensors' name of the dtype; a layout or kind safetensors cannot hold says so (sparse, quantized,
        nested), so that it is refused by name."""
        tensor = self.tensor
        name = DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).replace("torch.", ""))
        if getattr(tensor, "is_nested", False):
            return f"nested {name}"
        if tensor.is_quantized:
            return f"quantized {name}"
        if tensor.layout != torch.strided:
            return f"{str(tensor.layout).replace('torch.', '')} {name}"
        return name

    def __getitem__(self, index):
        return self.tensor[index]


class _LoadedFile:
    """The tensors of a PyTorch checkpoint, read with the restricted loader, behind safetensors' interface."""

    def __init__(self, tensors: dict):
        self.tensors = tensors

    def keys(self):
        return list(self.tensors)

    def get_tensor(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def get_slice(self, key: str) -> _LoadedSlice:
        return _LoadedSlice(self.tensors[key])

    def metadata(self) -> dict:
        return {}


def _open_safetensors(file: Path):
    try:
        return safe_open(str(file), framework="pt")
    except OSError as error:
        raise WeightsError(f"cannot read {file}: {error.strerror or error}") from None
    except Exception as error:  # safetensors raises its own error types for bad headers
        if starts_like_torch_save(file):  # asked only once safetensors failed: its header length may start so too
            raise WeightsError(f"{file} is a pickle named .safetensors: rename it to .pt to read it with torch's "
                               "restricted loader") from None
        if not may_hold_weights(file):
            raise WeightsError(f"{file} is not a checkpoint: neither safetensors (an 8-byte length, then a JSON "
                               "header) nor torch.save's zip archive or pickle") from None
        raise WeightsError(f"{file} is not a valid safetensors file: {error}") from None


def _without_wrappers(key: str) -> str:
    """The key without the wrapper prefixes before it, in any nesting."""
    while True:
        found = next((p for p in WRAPPER_PREFIXES if key.startswith(p)), None)
        if found is None:
            return key
        key = key[len(found):]


def _wrapper_prefix(keys: list[str]) -> tuple[str, list[str]]:
    """The wrapper prefixes every key carries (`_orig_mod.`, `module.`, in any nesting), and what put them there."""
    prefix, why = "", []
    while keys:
        found = next((p for p in WRAPPER_PREFIXES if all(key.startswith(prefix + p) for key in keys)), None)
        if found is None:
            break
        prefix += found
        why.append(WRAPPER_PREFIXES[found])
    return prefix, why


class Checkpoint:
    """Lazy access to the tensors of one checkpoint (one file or several shards).

    Keys are the model's own names: prefixes that wrappers add to every key are removed (and
    said in `notes`); `alias` lets a family read a tensor under a second name (a tied head).
    `arguments` and `step` are what a training script stored beside the weights, if anything.
    """

    def __init__(self, path: Path):
        self.path = resolve_weights(Path(path))
        self.directory = self.path if self.path.is_dir() else self.path.parent
        self.notes: list[str] = []
        self.arguments: dict = {}
        self.step: Optional[int] = None
        self._handles = {}
        self._entry = {}  # the model's name -> (file, name inside it)
        self.bytes_read = 0  # of tensors read from safetensors files: how far a read-ahead is ahead (reading_ahead)
        for file in resolve_files(self.path):
            if file.suffix.lower() in TORCH_SUFFIXES:
                loaded = read_torch_file(file)
                self._handles[file] = _LoadedFile(loaded.tensors)
                self.arguments.update(loaded.arguments)
                self.step = loaded.step if loaded.step is not None else self.step
                self.notes.append(f"read {file.name}'s weights from {loaded.location} with torch's restricted loader "
                                  "(weights_only: tensors and plain containers only)")
            else:
                self._handles[file] = _open_safetensors(file)
            for key in self._handles[file].keys():
                self._entry[key] = (file, key)
        prefix, why = _wrapper_prefix(list(self._entry))
        if prefix:
            self.strip_prefix(prefix, " and ".join(why))
        self._one_tensor_per_name()
        upcast = sorted({self.dtype(key) for key in self._entry} & set(UPCAST_DTYPES))
        if upcast:
            self.notes.append(f"{' and '.join(upcast)} weights are read upcast to the compute dtype: their values are "
                              "exact, but the model computes in the wider format, not in float8")

    def _one_tensor_per_name(self) -> None:
        """A key also present without its wrapper prefixes (`h.0.…` beside `_orig_mod.h.0.…`: two state dicts
        saved into one) names one tensor twice: read once when both are equal, refused naming both keys when not."""
        for key in list(self._entry):
            bare = _without_wrappers(key)
            if bare != key and bare in self._entry:
                self.same_tensor(bare, key)
                del self._entry[key]

    def same_tensor(self, kept: str, other: str) -> None:
        """Two keys that map to one name: a note when they hold the same values, a refusal naming both when not."""
        first, second = self.get(kept), self.get(other)
        if first.shape != second.shape or first.dtype != second.dtype or not torch.equal(first, second):
            raise WeightsError(f"{self.path}: {kept!r} and {other!r} name the same tensor but hold different values "
                               "(two copies of the model saved into one file?); keep one of them")
        self.notes.append(f"{other!r} duplicates {kept!r} (equal values): read once")

    def strip_prefix(self, prefix: str, why: str) -> None:
        """Read every key without `prefix` (which a wrapper put before the model's own names)."""
        self._entry = {key[len(prefix):]: entry for key, entry in self._entry.items()}
        self.notes.append(f"key prefix {prefix!r} removed from every tensor name (added by {why})")

    def alias(self, name: str, existing: str, why: str) -> None:
        self._entry[name] = self._entry[existing]
        self.notes.append(why)

    @contextlib.contextmanager
    def reading_ahead(self) -> Iterator[None]:
        """While inside, the kernel reads the safetensors files ahead of the tensors read, in file order, at most
        readahead.budget ahead (sources/readahead.py): for a pass that reads every layer."""
        files = [file for file, handle in self._handles.items() if not isinstance(handle, _LoadedFile)]
        if not files or not readahead.supported():
            yield
            return
        budget = readahead.budget(available_bytes(torch.device("cpu")))
        start = self.bytes_read  # what this checkpoint gave before the pass began is not ahead of the pass
        ahead = readahead.ReadAhead(files, lambda: self.bytes_read - start, budget).start()
        try:
            yield
        finally:
            ahead.stop()

    def metadata(self) -> dict:
        """The string metadata of the (first) file's header."""
        handle = next(iter(self._handles.values()))
        return dict(handle.metadata() or {})

    @property
    def keys(self) -> list[str]:
        return list(self._entry)

    def __contains__(self, key: str) -> bool:
        return key in self._entry

    def _located(self, key: str):
        if key not in self._entry:
            raise WeightsError(f"{self.path} has no tensor {key!r}")
        file, name = self._entry[key]
        return file, self._handles[file], name

    def _slice(self, key: str):
        _, handle, name = self._located(key)
        return handle.get_slice(name)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._slice(key).get_shape())

    def dtype(self, key: str) -> str:
        return self._slice(key).get_dtype()

    def get(self, key: str, dtype: Optional[torch.dtype] = None,
            rows: Union[None, slice, Sequence[int]] = None) -> torch.Tensor:
        """One tensor, or some of its rows (a slice, or a list of row indices), converted to `dtype`. Read as a float
        weight, it must be stored in one of READ_DTYPES: anything else is refused before any conversion."""
        file, handle, name = self._located(key)
        stored = self.dtype(key)
        if dtype is not None and dtype.is_floating_point and stored not in READ_DTYPES:
            raise WeightsError(f"{key} in {file} is stored as {stored}: weights are read from float32, float64, "
                               "float16, bfloat16 or float8 only (integer and bool weights are quantised: dequantise "
                               "the model first; complex, sparse, quantized and nested tensors are not read as floats)")
        try:
            if rows is None:
                tensor = handle.get_tensor(name)
            elif isinstance(rows, slice):
                tensor = handle.get_slice(name)[rows]
            else:
                part, distinct = handle.get_slice(name), sorted(set(rows))  # a repeated token's row is read once
                read = torch.cat([part[row : row + 1] for row in distinct])
                position = {row: i for i, row in enumerate(distinct)}
                tensor = read[[position[row] for row in rows]]
        except Exception as error:  # truncated data is found only when it is read
            raise WeightsError(f"cannot read tensor {key!r} from {file}: {error}") from None
        if not isinstance(handle, _LoadedFile):
            self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor if dtype is None else tensor.to(dtype)

    def read_json(self, name: str) -> Optional[ConfigFile]:
        """A JSON file beside the weights (config.json), or None when there is none."""
        candidate = self.directory / name
        if not _exists(candidate):
            return None
        _require_regular_file(candidate)
        return ConfigFile.read(candidate)
