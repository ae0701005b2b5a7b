"""--token-ids-file parsers that mean what they say (issue 33): text ids are ASCII decimal digits separated by ASCII
whitespace or commas; a .npy header is checked against the file's size before anything is allocated."""

from __future__ import annotations

import numpy as np
import pytest


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
