"""The `blocktrace` command line: click only — options → a request → the pipeline → a renderer.

app.py holds the group and its error boundary; each command lives in a module of its own
(run.py: run and check; compare.py; files.py: inspect and diff; track.py). Every module of this
package is imported here, and a command registers itself on import: a new command is its module.
"""

import gc
import importlib
import pkgutil

from blocktrace.cli.app import cli

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def main():
    """The console script: the command, then the process ends."""
    try:
        cli(prog_name="blocktrace")
    finally:
        # The process's memory goes back with it: frozen, torch's objects are not traversed by the interpreter's last
        # garbage collection (0.88 s of a 3.90 s `blocktrace run`: benchmarks/bench_startup.py). Only the finalizers
        # of objects in reference cycles are skipped, and blocktrace leaves none to run at exit.
        gc.freeze()


__all__ = ["cli", "main"]
