"""`--token-ids-file`: ids as training code keeps them (nanoGPT's val.bin, .npy, .json, text), windows drawn
as a training loop draws them, each giving the loss the writing model computes on the same ids."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from nanogpt import GPTConfig, randomised, save_ckpt

STREAM = (np.arange(3000) * 7 % 96).astype(np.uint16)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nano")
    model = randomised(GPTConfig(n_layer=2), seed=9)
    save_ckpt(model, folder / "ckpt.pt", iter_num=10)
    STREAM.tofile(folder / "val.bin")  # exactly as nanoGPT's prepare.py: np.uint16 ids, tofile
    return folder, model


def nano_loss(model, rows) -> float:
    x = torch.tensor(rows)
    with torch.no_grad():
        return model(x[:, :-1], x[:, 1:].contiguous())[1].item()


def check(invoke, folder, *args):
    result = invoke("check", "--weights", str(folder / "ckpt.pt"), *args, "--json")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def test_windows_of_val_bin_are_the_ones_a_seeded_loop_draws(invoke, nano):
    folder, model = nano
    report = check(invoke, folder, "--token-ids-file", str(folder / "val.bin"), "--windows", "3", "--context", "32",
                   "--seed", "5")
    starts = torch.randint(len(STREAM) - 32 + 1, (3,), generator=torch.Generator().manual_seed(5)).tolist()
    rows = [STREAM[s : s + 32].tolist() for s in starts]
    assert report["loss"] == pytest.approx(nano_loss(model, rows), rel=1e-5)
    assert any(f"offsets {', '.join(map(str, starts))}" in note for note in report["notes"])
    again = check(invoke, folder, "--token-ids-file", str(folder / "val.bin"), "--windows", "3", "--context", "32",
                  "--seed", "5")
    assert again["loss"] == report["loss"]


@pytest.mark.parametrize("suffix", [".npy", ".json", ".txt"])
def test_every_format_gives_the_same_ids(invoke, nano, tmp_path, suffix):
    folder, model = nano
    rows = [STREAM[:20].tolist(), STREAM[40:60].tolist()]
    path = tmp_path / f"ids{suffix}"
    if suffix == ".npy":
        np.save(path, np.array(rows, dtype=np.int64))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        path.write_text("\n".join(" ".join(map(str, row)) for row in rows) + "\n")
    report = check(invoke, folder, "--token-ids-file", str(path))
    assert report["loss"] == pytest.approx(nano_loss(model, rows), rel=1e-5)


def test_raw_bin_of_another_dtype(invoke, nano, tmp_path):
    folder, model = nano
    STREAM[:24].astype(np.int32).tofile(tmp_path / "ids.bin")
    report = check(invoke, folder, "--token-ids-file", str(tmp_path / "ids.bin"), "--ids-dtype", "int32")
    assert report["loss"] == pytest.approx(nano_loss(model, [STREAM[:24].tolist()]), rel=1e-5)


def test_track_draws_the_same_windows_for_every_checkpoint(invoke, nano, tmp_path):
    folder, model = nano
    save_ckpt(randomised(GPTConfig(n_layer=2), seed=10), tmp_path / "ckpt_20.pt", iter_num=20)
    result = invoke("track", str(folder / "ckpt.pt"), str(tmp_path / "ckpt_20.pt"), "--token-ids-file",
                    str(folder / "val.bin"), "--windows", "2", "--seed", "1", "--json")
    assert result.exit_code in (0, 1), result.output
    records = json.loads(result.stdout)["records"]
    starts = torch.randint(len(STREAM) - 64 + 1, (2,), generator=torch.Generator().manual_seed(1)).tolist()
    rows = [STREAM[s : s + 64].tolist() for s in starts]  # --context defaults to the model's 64 positions
    assert records[0]["loss"] == pytest.approx(nano_loss(model, rows), rel=1e-5)
    assert [r["step"] for r in records] == [10, 20]


BAD = {
    "missing": (lambda p: p / "none.bin", [], "--token-ids-file", "no such file"),
    "directory": (lambda p: p, [], "--token-ids-file", "is a directory"),
    "odd bytes": (lambda p: (p / "odd.bin").write_bytes(b"\x01\x02\x03") and p / "odd.bin", [],
                  "--token-ids-file", "not a whole number of uint16 ids"),
    "stream too long": (lambda p: STREAM.tofile(p / "long.bin") or p / "long.bin", [], "--token-ids-file",
                        "draw windows of it with --windows N"),
    "not ids": (lambda p: (p / "ids.txt").write_text("1 2 x\n") and p / "ids.txt", [], "--token-ids-file",
                "line 1 holds 'x', not an id"),
    "pickled npy": (lambda p: np.save(p / "o.npy", np.array([{"a": 1}], dtype=object)) or p / "o.npy", [],
                    "--token-ids-file", "is not a .npy array of integers"),
    "dtype for npy": (lambda p: np.save(p / "i.npy", np.arange(4)) or p / "i.npy", ["--ids-dtype", "int32"],
                      "--ids-dtype", "other --token-ids-file formats carry their own type"),
    "context without windows": (lambda p: np.save(p / "i.npy", np.arange(4)) or p / "i.npy", ["--context", "8"],
                                "--context", "add --windows N"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_token_id_files_are_one_error_naming_the_option(invoke, nano, tmp_path, case):
    folder, _ = nano
    make, extra, option, message = BAD[case]
    result = invoke("check", "--weights", str(folder / "ckpt.pt"), "--token-ids-file", str(make(tmp_path)), *extra)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and option in lines[0] and message in lines[0], lines


def test_a_fifo_as_token_ids_file_is_refused_without_blocking(invoke, nano, tmp_path):
    import os

    folder, _ = nano
    os.mkfifo(tmp_path / "pipe.bin")
    result = invoke("check", "--weights", str(folder / "ckpt.pt"), "--token-ids-file", str(tmp_path / "pipe.bin"))
    assert result.exit_code == 2 and "is a FIFO" in result.stderr
