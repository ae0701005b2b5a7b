"""The `blocktrace` command line: click only — options → a request → the pipeline → a renderer.

app.py holds the group and its error boundary; each command lives in a module of its own
(run.py: run and check; compare.py; files.py: inspect and diff; track.py), registered on import here.
"""

from blocktrace.cli import compare, files, run, track  # noqa: F401  (registers the commands)
from blocktrace.cli.app import cli


def main():
    cli(prog_name="blocktrace")


__all__ = ["cli", "main"]
