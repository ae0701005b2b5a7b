"""The user's own block, from `--module package.module:factory` or `--module path/to/file.py:factory`, and the
user's own model (`check --model`, the same forms).

Importing it RUNS THE USER'S CODE, by design: that is how a user's block gets traced. The
working directory is searched too, for that one import only; afterwards sys.path is as it
was and the modules imported from the working directory are forgotten, so a later
`--module` from another directory imports its own code, not a cached one.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path
from typing import Optional

import torch

from blocktrace.errors import InputError, UsageError


FORMS = "package.module:factory or path/to/file.py:factory"
FILE_MODULE_PREFIX = "blocktrace_user_block_"  # a .py file's module name: forgotten afterwards like the others


def _parse(spec: str, option: str = "--module") -> tuple[str, str]:
    module_name, _, factory_name = spec.rpartition(":")
    if module_name.endswith(".py") and factory_name.isidentifier():
        return module_name, factory_name
    parts = module_name.split(".")
    if not module_name or not factory_name or not all(p.isidentifier() for p in parts) \
            or not factory_name.isidentifier():
        raise UsageError(f"{option} takes {FORMS}, not {spec!r}")
    return module_name, factory_name


def _import(spec: str, option: str, module_name: str):
    """A module by its dotted name, or a .py file by its path (under a name of its own, so it shadows nothing)."""
    if not module_name.endswith(".py"):
        return importlib.import_module(module_name)
    path = Path(module_name)
    if not path.is_file():
        raise InputError(f"{option} {spec}: {module_name} is not a file; {option} takes {FORMS}")
    loaded = importlib.util.spec_from_file_location(f"{FILE_MODULE_PREFIX}{path.stem}", path)
    module = importlib.util.module_from_spec(loaded)
    sys.modules[loaded.name] = module
    loaded.loader.exec_module(module)
    return module


def _forget_modules_from(directory: Path, before: set) -> None:
    """Forget the modules imported from the working directory itself (the user's, which the next --module may
    change), never those of a virtual environment that happens to live below it (transformers, torch, …)."""
    for name in set(sys.modules) - before:
        origin = getattr(sys.modules[name], "__file__", None)
        top = name.split(".")[0]
        own = directory / top if (directory / top).is_dir() else directory / f"{top}.py"
        if name.startswith(FILE_MODULE_PREFIX) or (origin and Path(origin).resolve().is_relative_to(own.resolve())):
            del sys.modules[name]


def load_user_block(spec: str) -> torch.nn.Module:
    """Import `package.module:factory` (from the working directory too) and call the factory."""
    return _load(spec, "--module", lambda factory: (factory(), None))[0].eval()


def load_user_model(spec: str, arguments: dict) -> tuple[torch.nn.Module, str]:
    """`check --model`: the factory called with the model's arguments a training script stored in the checkpoint
    (nanoGPT's model_args) when its signature takes them as keywords, else with none; and how it was called."""
    def call(factory):
        if arguments and _takes(factory, arguments):
            return factory(**arguments), f"{spec.rpartition(':')[2]}(**the checkpoint's model arguments)"
        return factory(), f"{spec.rpartition(':')[2]}() (no arguments{' it takes' if arguments else ' stored'})"
    return _load(spec, "--model", call)


def _takes(factory, arguments: dict) -> bool:
    try:
        inspect.signature(factory).bind(**arguments)
    except (TypeError, ValueError):
        return False
    return True


def _load(spec: str, option: str, call) -> tuple[torch.nn.Module, Optional[str]]:
    """Import the spec's module and `call(factory)` → (what it made, how it was called)."""
    module_name, factory_name = _parse(spec, option)
    # A file's own directory is searched (its sibling imports), else the working directory.
    directory = (Path(module_name).parent if module_name.endswith(".py") else Path(os.getcwd())).resolve()
    before = set(sys.modules)
    inserted = str(directory) not in sys.path
    if inserted:
        sys.path.insert(0, str(directory))
    try:
        module, called = _call_factory(spec, option, module_name, factory_name, call)
    finally:
        if inserted and str(directory) in sys.path:
            sys.path.remove(str(directory))
        _forget_modules_from(directory, before)
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{option} {spec}: {factory_name}() returned {type(module).__name__}, not a torch.nn.Module")
    return module, called


def _call_factory(spec: str, option: str, module_name: str, factory_name: str, call):
    try:
        module = _import(spec, option, module_name)
    except InputError:
        raise
    except BaseException as error:  # the user's module failed to import (SystemExit included): one line
        if isinstance(error, KeyboardInterrupt):
            raise
        raise InputError(f"{option} {spec}: importing {module_name} failed: {type(error).__name__}: {error}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise InputError(f"{option} {spec}: {module_name} has no callable {factory_name!r}")
    try:
        return call(factory)
    except Exception as error:
        raise InputError(f"{option} {spec}: {factory_name}() raised {type(error).__name__}: {error}") from None


def block_width(block: torch.nn.Module) -> Optional[int]:
    """d_model read off the block's outermost norm (its normalized shape or 1-D gain): a norm inside the
    attention (Qwen3's q_norm, a head wide) can come first among the modules, never nearer the block."""
    by_depth = sorted(block.named_modules(), key=lambda item: item[0].count(".") if item[0] else -1)
    for _, module in by_depth:
        shape = getattr(module, "normalized_shape", None)
        if shape:
            return int(shape[-1])
        weight = getattr(module, "weight", None)
        if "norm" in type(module).__name__.lower() and isinstance(weight, torch.Tensor) and weight.dim() == 1:
            return int(weight.shape[0])
    return None
