"""Progress on stderr for a person watching: both streams a terminal, tables not a document (--json), no --quiet."""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import click

from blocktrace.progress import listening


def progress_wanted(document: bool, quiet: bool = False) -> bool:
    """document: the output is a document (render/documents), read by a program, not tables."""
    return not quiet and not document and sys.stderr.isatty() and sys.stdout.isatty()


WIDTH = 40  # the progress line is overwritten in place, then blanked


def _line(what: str, done: int, total: int) -> None:
    click.echo(f"\r{f'{what} {done + 1}/{total}' if done < total else '':<{WIDTH}}", nl=False, err=True)


@contextlib.contextmanager
def shown(wanted: bool) -> Iterator[None]:
    """Ticks of the work inside become one self-erasing line on stderr, when wanted."""
    with listening(_line if wanted else None):
        try:
            yield
        finally:
            if wanted:
                click.echo("\r" + " " * WIDTH + "\r", nl=False, err=True)
