"""Reading a checkpoint's files ahead of the layers that need them, while the current layer computes.

A whole-model check reads every byte of its files, one layer at a time, by page faults on safetensors' mapping: on
a cold page cache each layer waits for its bytes. `ReadAhead` asks the kernel for the files, in order, from a
background thread (`posix_fadvise(WILLNEED)`: the kernel reads; nothing is copied here), at most `budget` bytes ahead
of what the check has read, so a checkpoint larger than memory is not read ahead only to be evicted before use.
Advisory: where the platform has no posix_fadvise nothing happens, and no number depends on it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Callable, Optional, Sequence

# Bytes advised per call. One call over a whole file (length 0, "to the end") cached next to nothing of an 800 MB
# shard on this project's machines (Linux 6.18), while 8 MB calls cached all of it (benchmarks/bench_read_ahead.py).
CHUNK = 8 << 20
WAIT_SECONDS = 0.05  # how often a read-ahead that is far enough ahead looks again
# How far ahead of the reads: a share of the memory available when a check starts (the page cache it fills is the
# kernel's to drop, but a read-ahead past memory would be evicted unused), or a fixed amount where that is unknown.
SHARE_OF_AVAILABLE = 0.25
UNKNOWN_MEMORY_BUDGET = 1 << 30


def supported() -> bool:
    return hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_WILLNEED")


def budget(available: Optional[int]) -> int:
    """Bytes a read-ahead may run ahead of the reads, given the memory available (None: unknown)."""
    return int(SHARE_OF_AVAILABLE * available) if available else UNKNOWN_MEMORY_BUDGET


class ReadAhead:
    """Advises `files` chunk by chunk, in order, while `consumed()` (bytes the caller has read) stays within
    `budget` of what was advised; `stop()` ends it and waits for the thread."""

    def __init__(self, files: Sequence[Path], consumed: Callable[[], int], budget: int,
                 advise: Optional[Callable[[int, int, int], None]] = None):
        self.files, self.consumed, self.budget = list(files), consumed, budget
        self.advise = advise or (lambda descriptor, offset, length:
                                 os.posix_fadvise(descriptor, offset, length, os.POSIX_FADV_WILLNEED))
        self.advised = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="blocktrace-read-ahead", daemon=True)

    def start(self) -> "ReadAhead":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _far_enough_ahead(self) -> bool:
        return self.advised - self.consumed() >= self.budget

    def _run(self) -> None:
        for file in self.files:
            try:
                descriptor = os.open(file, os.O_RDONLY)
            except OSError:
                continue  # the reader will say what is wrong with it
            try:
                self._advise_file(descriptor)
            except OSError:
                pass  # advisory only
            finally:
                os.close(descriptor)
            if self._stopped.is_set():
                return

    def _advise_file(self, descriptor: int) -> None:
        size = os.fstat(descriptor).st_size
        for offset in range(0, size, CHUNK):
            while self._far_enough_ahead():
                if self._stopped.wait(WAIT_SECONDS):
                    return
            if self._stopped.is_set():
                return
            length = min(CHUNK, size - offset)
            self.advise(descriptor, offset, length)
            self.advised += length
