"""Output formats other than the tables: each is one module of this package that declares `FORMAT`.

The CLI's options (one flag per format), the rules that refuse table-only options beside them and the
output stage (`cli/app.py: show`) read FORMATS and nothing else, so a format is its module. Torch-free:
`blocktrace --help` lists the flags without importing torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class OutputFormat:
    flag: str  # the option that chooses it, e.g. --json
    help: str
    render: Callable[[dict], str]  # the report as one document

    @property
    def parameter(self) -> str:
        """The name click gives the flag's value: --json -> as_json."""
        return "as_" + self.flag.lstrip("-").replace("-", "_")


def _declared() -> list[OutputFormat]:
    found = [getattr(importlib.import_module(f"{__name__}.{module.name}"), "FORMAT", None)
             for module in pkgutil.iter_modules(__path__)]
    return sorted((f for f in found if f is not None), key=lambda f: f.flag)


FORMATS = _declared()


def chosen(params: dict) -> Optional[OutputFormat]:
    """The document format the command line asked for; None: the tables. Two at once are refused."""
    asked = [f for f in FORMATS if params.get(f.parameter)]
    if len(asked) > 1:
        from blocktrace.errors import UsageError

        raise UsageError(f"{' and '.join(f.flag for f in asked)} each print the whole report: choose one")
    return asked[0] if asked else None
