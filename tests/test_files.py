"""blocktrace/files.py: no output file is lost or half-written — --force replaces only regular files, a file made
while blocktrace works is not overwritten, concurrent saves and SIGTERM leave one whole file or none, the umask is
honoured, a full disk is one error line, and a plot that cannot be drawn leaves no trace file behind."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SAMPLES, one_error_line
from safetensors.torch import load_file

from blocktrace.files import OutputError


def test_force_replaces_only_regular_files(invoke, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_error_line(invoke("run", "--save", str(fifo), "--force"), 2, "a FIFO", "only a regular file")
    assert fifo.is_fifo()
    real = tmp_path / "real.safetensors"
    real.write_bytes(b"keep")
    link = tmp_path / "link.safetensors"
    link.symlink_to(real)
    one_error_line(invoke("run", "--save", str(link), "--force"), 2, "a symbolic link")
    assert link.is_symlink() and real.read_bytes() == b"keep"
    one_error_line(invoke("run", "--save", str(tmp_path), "--force"), 2, "is a directory")


def test_device_nodes_are_refused_before_anything_is_written():
    from blocktrace.files import OutputError, check_output_path

    with pytest.raises(OutputError, match="a character device; only a regular file may be replaced"):
        check_output_path(Path("/dev/null"), force=True)


def test_a_file_made_while_blocktrace_works_is_not_overwritten(invoke, tmp_path, monkeypatch):
    import blocktrace.sources.tracefile as tracefile

    path = tmp_path / "t.safetensors"
    original = tracefile.write_safetensors

    def another_run_saves_first(handle, tensors, metadata):
        path.write_bytes(b"the other run's file")
        original(handle, tensors, metadata)

    monkeypatch.setattr(tracefile, "write_safetensors", another_run_saves_first)
    one_error_line(invoke("run", "--save", str(path)), 2, "already exists", "--force")
    assert path.read_bytes() == b"the other run's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.safetensors"]  # no temporary file left


def test_concurrent_saves_without_force_one_wins(tmp_path):
    import threading

    from blocktrace.files import OutputError, write_atomically

    path, barrier, outcomes = tmp_path / "t.bin", threading.Barrier(4), []

    def save(k: int):
        def write(handle):
            handle.write(bytes([k]) * 1000)
            barrier.wait()  # every writer has its temporary file before any commits
        try:
            write_atomically(path, write, force=False)
            outcomes.append(k)
        except OutputError:
            outcomes.append(None)

    threads = [threading.Thread(target=save, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [k for k in outcomes if k is not None]
    assert len(winners) == 1 and path.read_bytes() == bytes([winners[0]]) * 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.bin"]


SIGTERM_WRITER = """
import sys, time
from pathlib import Path
from blocktrace.files import write_atomically
def write(handle):
    handle.write(b"x" * 1_000_000)
    handle.flush()
    print("writing", flush=True)
    time.sleep(30)
write_atomically(Path(sys.argv[1]), write, force=False)
"""


def test_sigterm_during_a_save_leaves_no_file(tmp_path):
    import signal

    process = subprocess.Popen([sys.executable, "-c", SIGTERM_WRITER, str(tmp_path / "t.bin")],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "writing"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=20) == -signal.SIGTERM  # the signal's own action still ends the process
    assert list(tmp_path.iterdir()) == []


def test_saved_files_honour_the_umask_and_are_byte_identical(invoke, tmp_path):
    previous = os.umask(0o027)
    try:
        first, second = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
        assert invoke("run", "--tokens", "猫 吃 鱼", "--save", str(first)).exit_code == 0
        assert invoke("run", "--tokens", "猫 吃 鱼", "--save", str(second)).exit_code == 0
    finally:
        os.umask(previous)
    assert (first.stat().st_mode & 0o777) == 0o640
    assert first.read_bytes() == second.read_bytes()
    assert set(load_file(str(first))) == {"x", "norm1", "attn", "residual1", "norm2", "ffn", "residual2",
                                          "attn_weights"}


def test_no_space_left_is_one_error_line(invoke, tmp_path, monkeypatch):
    import blocktrace.sources.tracefile as tracefile

    def full_disk(handle, tensors, metadata):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tracefile, "write_safetensors", full_disk)
    one_error_line(invoke("run", "--save", str(tmp_path / "t.safetensors")), 2, "No space left on device")
    assert list(tmp_path.iterdir()) == []

def test_a_plot_that_cannot_be_drawn_leaves_no_trace_file_behind(invoke, tmp_path):
    trace, plot = tmp_path / "a.safetensors", tmp_path / "b.png"
    one_error_line(invoke("run", "--seq-len", "200", "--save", str(trace), "--plot", str(plot)), 2,
                   "--plot draws heatmaps for up to 16 tokens")
    assert not trace.exists() and not plot.exists()


def _html_fails(monkeypatch):
    """The --html page's write fails (a full disk), after the command's other outputs were written."""
    import blocktrace.render.html as html

    def full_disk(path, write, force):
        raise OutputError(f"cannot write {path}: No space left on device")

    monkeypatch.setattr(html, "write_atomically", full_disk)


def test_a_run_whose_page_cannot_be_written_leaves_none_of_its_outputs(invoke, tmp_path, monkeypatch):
    """Issue 45.2: `run --plot P --html H` left P when writing H failed; every output is kept or none is."""
    _html_fails(monkeypatch)
    outputs = [tmp_path / "t.safetensors", tmp_path / "p.png", tmp_path / "page.html"]
    result = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "a", "b", "--save", str(outputs[0]),
                    "--plot", str(outputs[1]), "--html", str(outputs[2]))
    one_error_line(result, 2, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_a_track_whose_page_cannot_be_written_leaves_no_timeline(invoke, tmp_path, monkeypatch):
    _html_fails(monkeypatch)
    timeline = tmp_path / "t.jsonl"
    run = SAMPLES / "training" / "gpt2-lr-high"
    result = invoke("track", str(run / "step_0000"), str(run / "step_0010"), "--token-ids", *"1 2 3 4 5 6 7 8".split(),
                    "--out", str(timeline), "--html", str(tmp_path / "page.html"))
    one_error_line(result, 2, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_an_output_forced_over_an_existing_file_is_not_removed_by_a_later_failure(invoke, tmp_path, monkeypatch):
    """What --force replaced stays replaced (its old content was given up); only files the command created go."""
    _html_fails(monkeypatch)
    plot = tmp_path / "p.png"
    plot.write_bytes(b"old")
    result = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "a", "b", "--plot", str(plot), "--html",
                    str(tmp_path / "page.html"), "--force")
    assert result.exit_code == 2 and plot.exists()


@pytest.mark.parametrize("args", [
    ("run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼", "--html", "{d}/newdir/"),
    ("run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼", "--save", "{d}/newdir/"),
    ("track", str(SAMPLES / "learner" / "watch.jsonl"), "--out", "{d}/newdir/"),
])
def test_an_output_that_names_a_directory_is_refused_and_nothing_is_written(invoke, tmp_path, args):
    """`--html dir/newdir/` once wrote a file `newdir`: a Path drops the trailing separator."""
    result = invoke(*[arg.format(d=tmp_path) for arg in args])
    one_error_line(result, 2, "names a directory", "newdir/report.")
    assert list(tmp_path.iterdir()) == []
