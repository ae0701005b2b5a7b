"""blocktrace: see inside a Transformer block.

The library under the `blocktrace` command: build or load a block, trace it, read the steps.
Names are imported on first use, so that `blocktrace --help` does not pay for `import torch`.
"""

import importlib

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
