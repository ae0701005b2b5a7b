"""A monitor never takes the run down (issue 33): whatever the Watch meets while recording — a full disk, a folder
gone read-only, a statistic that fails, a step after close — the training loop goes on, one warning says so, and
the timeline keeps every whole record. A resumed run continues the file's step numbering."""

from __future__ import annotations

import errno
import os
import warnings

import pytest
import torch
from helpers import NanoGPT, nano_batch

from blocktrace import Watch
from blocktrace.errors import UsageError
from blocktrace.training import timeline, watch as watch_module
from blocktrace.training.timeline import read_timeline


def _loop(model, watch, steps, fail_at=None, fail=None):
    """Train `steps` steps; `fail()` is switched on from step `fail_at`. Returns what watch.step returned."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    returned = []
    for step in range(steps):
        if step == fail_at:
            fail()
        _, loss = model(*nano_batch(step))
        loss.backward()
        returned.append(watch.step(loss))
        optimizer.step()
        optimizer.zero_grad()
    return returned


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_write_that_fails_stops_recording_and_leaves_only_whole_records(tmp_path, monkeypatch, code):
    path = tmp_path / "run.jsonl"
    real_write = os.write

    def half_then_fail(descriptor, data):
        real_write(descriptor, data[: len(data) // 2])  # part of the line reaches the disk, then it is full
        raise OSError(code, os.strerror(code))

    model = NanoGPT()
    watch = Watch(model, path, every=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        returned = _loop(model, watch, 12, fail_at=4, fail=lambda: monkeypatch.setattr(timeline.os, "write",
                                                                                       half_then_fail))
        monkeypatch.undo()
        watch.close()  # returns, and may be called again
        watch.close()
    assert returned[0] is not None and all(r is None for r in returned[1:])
    assert sum("stopped recording" in str(w.message) for w in caught) == 1
    assert [entry["step"] for entry in read_timeline(path)] == [0]
    assert path.read_bytes().endswith(b"}\n")  # no torn line left behind


def test_a_statistic_that_fails_stops_recording_not_training(tmp_path, monkeypatch):
    model = NanoGPT()
    watch = Watch(model, tmp_path / "run.jsonl", every=2)

    def broken(block):
        raise RuntimeError("a statistic failed")

    with pytest.warns(RuntimeWarning, match="RuntimeError: a statistic failed"):
        returned = _loop(model, watch, 5, fail_at=1, fail=lambda: monkeypatch.setattr(watch_module, "weight_moments",
                                                                                      broken))
    watch.close()
    assert returned[0] is not None and returned[1:] == [None] * 4


def test_a_step_after_close_records_nothing_and_raises_nothing(tmp_path):
    model = NanoGPT()
    watch = Watch(model, tmp_path / "run.jsonl", every=1)
    _loop(model, watch, 1)
    watch.close()
    assert _loop(model, watch, 2) == [None, None]
    assert len(read_timeline(tmp_path / "run.jsonl")) == 1


def test_appending_continues_the_files_step_numbering_and_refuses_to_repeat_a_step(tmp_path):
    path = tmp_path / "run.jsonl"
    model = NanoGPT()
    with Watch(model, path, every=5) as first:
        _loop(model, first, 7)  # records at 0 and 5; the run stops at step 6
    with Watch(model, path, every=5, append=True) as resumed:  # no start=: from step 6 on
        _loop(model, resumed, 10)
    assert [entry["step"] for entry in read_timeline(path)] == [0, 5, 10, 15]
    with pytest.raises(UsageError, match="start=3 would repeat step 3"):
        Watch(model, path, every=5, append=True, start=3)
    with Watch(model, path, every=5, append=True, start=20) as later:
        _loop(model, later, 1)
    assert [entry["step"] for entry in read_timeline(path)][-1] == 20


def test_blocks_naming_a_module_that_is_not_a_list_of_blocks_is_refused(tmp_path):
    with pytest.raises(UsageError, match="'wte' is a Embedding, not a list of blocks"):
        Watch(NanoGPT(), tmp_path / "run.jsonl", blocks="wte")


def test_a_statistic_that_fails_inside_the_forward_never_reaches_the_training_loop(tmp_path, monkeypatch):
    """The taps' hooks run inside the training loop's own forward: a statistic failing there is kept, the forward
    returns as it would without the Watch, and the Watch stops recording with one warning."""
    from blocktrace.tracing import recorder

    model = NanoGPT()
    watch = Watch(model, tmp_path / "run.jsonl", every=2)

    def broken(*args, **kwargs):
        raise RuntimeError("a hook's statistic failed")

    with pytest.warns(RuntimeWarning, match="a hook's statistic failed"):
        returned = _loop(model, watch, 4, fail_at=2, fail=lambda: monkeypatch.setattr(recorder, "tensor_moments",
                                                                                      broken))
    watch.close()
    assert returned[0] is not None and returned[2:] == [None, None]


def test_an_optimizer_that_sets_its_own_step_size_is_recorded_without_a_learning_rate(tmp_path):
    """transformers' Adafactor with relative_step=True holds lr=None in its groups (it computes min(1e-2, 1/√t)
    itself): the Watch stopped recording at its first record (float(None)); the records say lr null and go on."""
    from transformers.optimization import Adafactor

    torch.manual_seed(0)
    model = NanoGPT()
    optimizer = Adafactor(model.parameters(), lr=None, relative_step=True, scale_parameter=True, warmup_init=False)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Watch(model, tmp_path / "run.jsonl", every=2, optimizer=optimizer, overwrite=True) as watch:
            for step in range(5):
                _, loss = model(*nano_batch(step))
                loss.backward()
                watch.step(loss)
                optimizer.step()
                optimizer.zero_grad()
    assert not [w for w in said if "stopped recording" in str(w.message)]
    records = timeline.read_timeline(tmp_path / "run.jsonl")
    assert [r["step"] for r in records] == [0, 2, 4] and all(r["lr"] is None for r in records)
    assert records[-1]["loop"]["optimizer"]["class"] == "Adafactor"
