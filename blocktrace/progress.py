"""Progress of long work, reported to whoever listens: the library never prints.

Loops that can run for seconds (every layer of a checkpoint, a compare sweep) call `tick`;
nothing happens unless a caller — the CLI, on a terminal — installed a listener with
`listening(...)`. A context variable, so nested or concurrent work does not cross wires.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator, Optional

Listener = Callable[[str, int, int], None]  # (what, done, total)

_listener: contextvars.ContextVar[Optional[Listener]] = contextvars.ContextVar("blocktrace_progress", default=None)


def tick(what: str, done: int, total: int) -> None:
    listener = _listener.get()
    if listener is not None:
        listener(what, done, total)


@contextlib.contextmanager
def listening(listener: Optional[Listener]) -> Iterator[None]:
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)
