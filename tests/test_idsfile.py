"""sources/idsfile.py, `--token-ids-file`: ids as training code keeps them (nanoGPT's val.bin, .npy, .json, text),
windows drawn as a training loop draws them, each giving the loss the writing model computes on the same ids; parsers
that mean what they say (issue 33): text ids are ASCII decimal digits separated by ASCII whitespace or commas, a .npy
header is checked against the file's size before anything is allocated."""

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


def _one_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


def _check(invoke, path):
    return invoke("check", "--weights", "sample_weights/gpt2-tiny", "--token-ids-file", str(path))


@pytest.mark.parametrize("text, shown", [
    ("1_0 2 3", "'1_0'"),  # Python's int() reads 10
    ("١٢ 3", "'١٢'"),  # Arabic-Indic digits
    ("१ 2", "'१'"), ("๑ 2", "'๑'"), ("１２ 3", "'１２'"),  # Devanagari, Thai, fullwidth
    ("1\u30002 3", "'1\\u30002'"),  # an ideographic space is not a separator
    ("1 two 3", "'two'"),
])
def test_ids_are_ascii_decimal_digits(invoke, tmp_path, text, shown):
    path = tmp_path / "ids.txt"
    path.write_text(text + "\n", encoding="utf-8")
    _one_error(_check(invoke, path), "line 1", shown, "ASCII decimal digits")


def test_ascii_ids_with_commas_tabs_and_signs_still_read(invoke, tmp_path):
    path = tmp_path / "ids.txt"
    path.write_text("1,2\t3 +4\n5, 6\n", encoding="utf-8")
    result = invoke("check", "--weights", "sample_weights/gpt2-tiny", "--token-ids-file", str(path), "--json")
    assert result.exit_code in (0, 1), result.output


@pytest.mark.parametrize("claimed", [10**12, 10**9])
def test_a_npy_header_claiming_more_than_the_file_holds_is_refused_before_any_allocation(invoke, tmp_path, claimed):
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(4, dtype=np.int64))
    data = path.read_bytes().replace(b"(4,)", f"({claimed},)".encode())
    header_end = data.index(b"\n") + 1  # keep the header's padded length a multiple of 64, as numpy wants
    padding = (64 - header_end % 64) % 64
    data = data[: header_end - 1] + b" " * padding + b"\n" + data[header_end:]
    data = data[:8] + int.to_bytes(header_end - 10 + padding, 2, "little") + data[10:]
    path.write_bytes(data)
    _one_error(_check(invoke, path), f"({claimed},)", "the file holds 32 bytes")


def test_a_npy_header_numpy_refuses_is_one_line(invoke, tmp_path):
    path = tmp_path / "ids.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00" + (65535).to_bytes(2, "little") + b"{" + b" " * 100)
    _one_error(_check(invoke, path), "not a readable .npy file")


@pytest.mark.parametrize("options, named", [
    (["--windows", "0"], "--windows"), (["--windows", "99999999999"], "--windows"),
    (["--windows", "4", "--context", "0"], "--context"), (["--windows", "4", "--context", "99999999999"], "--context"),
    (["--windows", "2", "--seed", "-1"], "--seed"), (["--windows", "2", "--seed", str(2**80)], "--seed"),
    (["--ids-dtype", "float32"], "--ids-dtype"), (["--ids-dtype", "int8"], "--ids-dtype"),
])
def test_extreme_values_of_the_window_options_are_one_line_naming_the_option(invoke, options, named):
    result = invoke("check", "--weights", "sample_weights/nanogpt/ckpt_0200.pt", "--token-ids-file",
                    "sample_weights/nanogpt/val.bin", *options)
    _one_error(result, named)
