"""The documents a report can be printed as instead of the tables (`--json`): each is one module of this package
that declares `DOCUMENT`. ("Format" is the tables' word: `--format` chooses their style.)

The CLI's options (one flag per document), the rules that refuse table-only options beside them and the
output stage (`cli/app.py: show`) read DOCUMENTS and nothing else, so a document kind is its module. Torch-free:
`blocktrace --help` lists the flags without importing torch.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Callable, Optional

from blocktrace.errors import UsageError


@dataclass(frozen=True)
class Document:
    """One kind of document: the flag that asks for it, its help, and how a report becomes one."""

    flag: str  # the option that chooses it, e.g. --json
    help: str
    render: Callable[[dict], str]  # the report as one document

    @property
    def parameter(self) -> str:
        """The name click gives the flag's value: --json -> as_json."""
        return "as_" + self.flag.lstrip("-").replace("-", "_")


def _declared() -> list[Document]:
    found = [getattr(importlib.import_module(f"{__name__}.{module.name}"), "DOCUMENT", None)
             for module in pkgutil.iter_modules(__path__)]
    return sorted((f for f in found if f is not None), key=lambda f: f.flag)


DOCUMENTS = _declared()


def chosen(params: dict) -> Optional[Document]:
    """The document the command line asked for; None: the tables. Two at once are refused."""
    asked = [f for f in DOCUMENTS if params.get(f.parameter)]
    if len(asked) > 1:
        raise UsageError(f"{' and '.join(f.flag for f in asked)} each print the whole report: choose one")
    return asked[0] if asked else None
