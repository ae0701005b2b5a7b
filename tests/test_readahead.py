"""sources/readahead.py: the files advised to the kernel in order, chunk by chunk, never more than the budget ahead
of what the check has read, and stopped with the check; Checkpoint.reading_ahead counts the bytes it reads."""

import threading
import time

import pytest
import torch
from safetensors.torch import save_file

from blocktrace.sources import readahead
from blocktrace.sources.checkpoint import Checkpoint


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setattr(readahead, "CHUNK", 4)
    paths = []
    for name, size in (("a", 10), ("b", 6)):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(bytes(size))
    return paths


def _advised(files, consumed, budget):
    calls = []
    ahead = readahead.ReadAhead(files, consumed, budget, advise=lambda fd, offset, length: calls.append((offset, length)))
    return ahead, calls


def test_every_chunk_of_every_file_is_advised_once_in_order(files):
    ahead, calls = _advised(files, lambda: 0, budget=1 << 30)
    ahead.start()
    ahead._thread.join(timeout=30)
    assert calls == [(0, 4), (4, 4), (8, 2), (0, 4), (4, 2)] and ahead.advised == 16


def _settled(ahead, expected: int) -> int:
    """What the thread has advised once it reaches `expected` (waiting as long as a loaded machine needs), and
    still after a further pause: it stopped there."""
    deadline = time.monotonic() + 30
    while ahead.advised < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(5 * readahead.WAIT_SECONDS)
    return ahead.advised


def test_it_waits_a_budget_ahead_of_what_was_read_and_stops_when_told(files):
    read = [0]
    ahead, calls = _advised(files, lambda: read[0], budget=6)
    ahead.start()
    assert _settled(ahead, 8) == 8  # two chunks: 8 - 0 ≥ 6, so it waits
    read[0] = 5  # the check read on: it advises until it is the budget ahead again, at most one chunk past it
    assert _settled(ahead, 14) == 14 and calls[-1] == (0, 4)  # a's last 2 bytes, then b's first chunk: 14 - 5 ≥ 6
    ahead.stop()
    assert not ahead._thread.is_alive()


def test_a_checkpoint_counts_what_it_reads_and_its_read_ahead_ends_with_the_block(tmp_path):
    save_file({"w": torch.ones(3, 5), "b": torch.zeros(7)}, tmp_path / "model.safetensors")
    checkpoint = Checkpoint(tmp_path / "model.safetensors")
    with checkpoint.reading_ahead():
        checkpoint.get("w", torch.float64)
        checkpoint.get("b")
    assert checkpoint.bytes_read == (15 + 7) * 4  # as stored (float32), whatever the dtype asked
    assert not any(thread.name == "blocktrace-read-ahead" for thread in threading.enumerate())
