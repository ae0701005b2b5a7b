"""A checkpoint's config.json, read with types checked: a wrong value names the file and key.

`config.json` is the user's file: `"n_head": "four"` or `"rope_scaling": [1, 2]` must end in
one line naming the file, the key and what is valid (exit 1), never in a traceback deep in
the model code, and never as if the user had typed a bad option.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

from blocktrace.errors import WeightsError
from blocktrace.sources.reading import parse_json, read_text

_MISSING = object()


LAYER_TYPES = ("full_attention", "sliding_attention")  # the attention kinds a layer_types entry may name here


class ConfigFile:
    """Typed access to a JSON object read from `path`."""

    def __init__(self, path: Path, data: dict):
        self.path = Path(path)
        self.data = data

    @classmethod
    def read(cls, path: Path) -> "ConfigFile":
        text = read_text(Path(path))  # a regular file, checked first: a FIFO would block
        try:
            data = parse_json(text)
        except ValueError as error:
            raise WeightsError(f"{path} is not valid JSON: {error}") from None
        if not isinstance(data, dict):
            raise WeightsError(f"{path} must hold a JSON object, not {type(data).__name__}")
        return cls(path, data)

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def __bool__(self) -> bool:
        return bool(self.data)

    def raw(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def bad(self, key: str, expected: str, value: Any) -> WeightsError:
        return WeightsError(f"{self.path}: {key} must be {expected}, not {json.dumps(value)[:60]}")

    def integer(self, key: str, default: Any = None, *, positive: bool = True) -> Optional[int]:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or (positive and value <= 0):
            raise self.bad(key, "a positive integer" if positive else "an integer", value)
        return value

    def number(self, key: str, default: Any = None, *, positive: bool = False) -> Optional[float]:
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or (positive and value <= 0):
            raise self.bad(key, "a positive number" if positive else "a finite number", value)
        return float(value)

    def _of_type(self, key: str, default: Any, kind: type, words: str):
        value = self.data.get(key, _MISSING)
        if value is _MISSING or value is None:
            return default
        if not isinstance(value, kind):
            raise self.bad(key, words, value)
        return value

    def string(self, key: str, default: Any = None) -> Optional[str]:
        return self._of_type(key, default, str, "a string")

    def boolean(self, key: str, default: Any = None) -> Optional[bool]:
        return self._of_type(key, default, bool, "true or false")

    def layer_types(self, layers: Optional[int], known: tuple[str, ...] = LAYER_TYPES) -> Optional[list]:
        """`layer_types` as HF's configs validate it: absent or null, or a list of one known attention type per
        layer (num_hidden_layers of them). Only full and sliding attention are traced (and, where the family says
        so in `known`, Llama-4's chunked): any other type HF knows is refused by name."""
        value = self.data.get("layer_types")
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or \
                (layers is not None and len(value) != layers):
            raise self.bad("layer_types", f"a list of {layers if layers is not None else 'one'} attention type"
                           f"{'s' if layers != 1 else ''} (one per layer: num_hidden_layers)", value)
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise self.bad("layer_types", f"made of {' and '.join(known)} (blocktrace traces no other kind here)",
                           unknown)
        return value

    def mapping(self, key: str) -> "ConfigFile":
        """A nested object, as a ConfigFile of its own (empty when absent or null)."""
        value = self.data.get(key)
        if value is None:
            return ConfigFile(self.path, {})
        if not isinstance(value, dict):
            raise self.bad(key, "a JSON object", value)
        return _Nested(self.path, value, key)

    def merged(self, *keys: str) -> "ConfigFile":
        """Several nested objects read as one, the later keys' values first (errors name the last key present)."""
        data: dict = {}
        for key in keys:
            data.update(self.mapping(key).data)
        present = [key for key in keys if self.raw(key) is not None] or keys
        return _Nested(self.path, data, present[-1])


class _Nested(ConfigFile):
    """A nested object: errors name the path to the key, e.g. rope_scaling.factor."""

    def __init__(self, path: Path, data: dict, prefix: str):
        super().__init__(path, data)
        self.prefix = prefix

    def bad(self, key: str, expected: str, value: Any) -> WeightsError:
        return super().bad(f"{self.prefix}.{key}", expected, value)
