"""training/timeline.py: the timeline file — records written one whole line at a time as strict JSON (a NaN or an
infinity as a string that reads back as the float), read back in step order; a line cut short at the end is left out
and said, anywhere else refused; another version or a repeated step is refused naming the line; a writer never mixes
two runs in one file."""

import json
import math

import pytest

from blocktrace.errors import InputError, UsageError
from blocktrace.training.timeline import TimelineWriter, read_timeline, record


def _layer(rms: float) -> dict:
    return {"layer": 0, "steps": {}, "rms": rms}


def _write(path, *steps, **options):
    writer = TimelineWriter(path, **options)
    for step in steps:
        writer.write(record(step, "watch", [_layer(float(step))], [], [], loss=1.0 / (step + 1)))
    writer.close()


def _strict(line: str):
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_non_finite_numbers_travel_as_strict_json_and_read_back_as_floats(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path)
    writer.write(record(0, "watch", [_layer(float("nan"))], [], [], loss=float("inf"), grad_norm=-float("inf")))
    writer.close()
    line = path.read_text(encoding="utf-8").splitlines()[0]
    assert _strict(line)["version"] == 1
    (entry,) = read_timeline(path)
    assert math.isnan(entry["layers"][0]["rms"]) and entry["loss"] == math.inf and entry["grad_norm"] == -math.inf


def test_records_read_in_step_order_and_a_repeated_step_is_refused_naming_both_lines(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(path, 20, 0, 10)
    assert [entry["step"] for entry in read_timeline(path)] == [0, 10, 20]
    _write(path, 10, append=True)
    with pytest.raises(InputError, match=r"t.jsonl:4 repeats step 10 of line 3"):
        read_timeline(path)


def test_a_last_line_cut_short_is_left_out_and_said_elsewhere_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(path, 0, 1)
    whole = path.read_text(encoding="utf-8")
    path.write_text(whole + whole.splitlines()[0][:25], encoding="utf-8")
    torn: list = []
    assert [entry["step"] for entry in read_timeline(path, torn)] == [0, 1] and torn == [3]
    path.write_text(whole.splitlines()[0][:25] + "\n" + whole, encoding="utf-8")
    with pytest.raises(InputError, match=r"t.jsonl:1 is not a JSON line"):
        read_timeline(path)


def test_another_version_is_refused_naming_it(tmp_path):
    path = tmp_path / "t.jsonl"
    entry = record(0, "watch", [_layer(1.0)], [], [])
    path.write_text(json.dumps({**entry, "version": 2}) + "\n", encoding="utf-8")
    with pytest.raises(InputError, match="t.jsonl:1 is timeline version 2; this blocktrace reads version 1"):
        read_timeline(path)


def test_a_writer_continues_or_replaces_a_timeline_only_when_told(tmp_path):
    path = tmp_path / "t.jsonl"
    _write(path, 0)
    with pytest.raises(UsageError, match="already holds a timeline"):
        TimelineWriter(path)
    _write(path, 5, append=True)
    assert [entry["step"] for entry in read_timeline(path)] == [0, 5]
    _write(path, 7, overwrite=True)
    assert [entry["step"] for entry in read_timeline(path)] == [7]


# the characters str.splitlines breaks a line at that JSON leaves unescaped in a string (issue 45.6)
LINE_BREAKS_JSON_KEEPS = ["\u2028", "\u2029", "\x85", "\x1c", "\x1d", "\x1e", "\x0b", "\x0c"]


@pytest.mark.parametrize("character", LINE_BREAKS_JSON_KEEPS)
def test_a_string_holding_any_line_break_of_str_splitlines_reads_back_as_written(tmp_path, character):
    path = tmp_path / "t.jsonl"
    writer = TimelineWriter(path)
    note = f"probe not run: ValueError: a{character}b"
    for step in (0, 10):
        writer.write(record(step, "watch", [dict(_layer(1.0), notes=[note])], [], [], path=f"dir{character}/ckpt"))
    writer.close()
    assert path.read_bytes().count(b"\n") == 2  # one record a line, the character escaped in it
    assert [r["layers"][0]["notes"] for r in read_timeline(path)] == [[note], [note]]
    assert read_timeline(path)[1]["path"] == f"dir{character}/ckpt"


def test_a_line_another_writer_left_unescaped_still_ends_only_at_a_newline(tmp_path):
    """A reader takes a line as JSON lines define it (ended by \\n, a \\r before it dropped), whoever wrote it."""
    path = tmp_path / "t.jsonl"
    _write(path, 0, 10)
    lines = path.read_text(encoding="utf-8").splitlines()
    raw = [line.replace('"steps": {}', '"steps": {}, "notes": ["a\u2028b"]') for line in lines]
    path.write_text("\r\n".join(raw) + "\r\n", encoding="utf-8")
    assert [r["layers"][0]["notes"] for r in read_timeline(path)] == [["a\u2028b"], ["a\u2028b"]]


def test_a_whole_line_too_deep_is_refused_with_why_a_line_without_its_newline_is_cut_short(tmp_path):
    """Issue 45.8: a last line nested too deep was said to be "cut short", and a file of that line alone "holds no
    timeline records": a line written whole ends in a newline, one cut by a crash does not."""
    good = json.dumps(record(0, "watch", [], [], [])) + "\n"
    deep = "[" * 1000 + "]" * 1000
    (tmp_path / "deep.jsonl").write_text(good + deep + "\n")
    with pytest.raises(InputError, match="deep.jsonl:2 is not a JSON line .*nested deeper"):
        read_timeline(tmp_path / "deep.jsonl")
    (tmp_path / "only.jsonl").write_text(deep + "\n")
    with pytest.raises(InputError, match="only.jsonl:1 is not a JSON line"):
        read_timeline(tmp_path / "only.jsonl")
    (tmp_path / "torn.jsonl").write_text(good + good[: len(good) // 2])
    torn: list = []
    assert [r["step"] for r in read_timeline(tmp_path / "torn.jsonl", torn)] == [0] and torn == [2]


def test_a_version_too_long_to_print_is_said_by_its_size(tmp_path):
    """Issue 45.8: version 10³⁰ was printed cut to 20 characters, as 10¹⁹."""
    (tmp_path / "v.jsonl").write_text(json.dumps({**record(0, "watch", [], [], []), "version": 10 ** 30}) + "\n")
    with pytest.raises(InputError, match=r"version 10000000… \(31 characters long\)"):
        read_timeline(tmp_path / "v.jsonl")
