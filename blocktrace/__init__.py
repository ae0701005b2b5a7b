"""blocktrace: see inside a Transformer block.

The library under the `blocktrace` command: build or load a block, trace it, read the steps.
Names are imported on first use, so that `blocktrace --help` does not pay for `import torch`.
"""

import importlib
import sys

from blocktrace._version import __version__

_EXPORTS = {
    "STEP_NAMES": "config", "BlockConfig": "config", "FFNKind": "config", "Norm": "config", "Placement": "config",
    "TransformerBlock": "model.block", "build_block": "model.block", "trace": "tracing.tracer", "Trace": "tracing.tracer",
    "BlocktraceError": "errors", "ConfigError": "errors", "InputError": "errors", "UsageError": "errors",
    "WeightsError": "errors", "Watch": "training.watch", "read_timeline": "training.timeline",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'blocktrace' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"blocktrace.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def _show_pages_in_notebooks() -> None:
    """Inside IPython or Jupyter (already imported: a running kernel), a Trace and a Timeline display as their
    --html page (render/notebook.py). Elsewhere nothing more is imported: the CLI and scripts pay nothing."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is not None and getattr(shell, "display_formatter", None) is not None:
        importlib.import_module("blocktrace.render.notebook").register(shell.display_formatter.formatters)


_show_pages_in_notebooks()
