"""Files built to break a reader: timelines of the wrong types, JSON nested past any sane depth, FIFOs
where a file is expected. Each is refused with one `Error:` line and exit 2, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
import torch
from helpers import SAMPLES, watched_records

from blocktrace.errors import InputError
from blocktrace.sources.reading import MAX_JSON_DEPTH
from blocktrace.training.timeline import read_timeline

GPT2 = SAMPLES / "gpt2-tiny"
TOO_DEEP = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
DEEPER_THAN_PYTHON = "[" * 100_000 + "]" * 100_000


def one_error_line(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def timeline_lines(tmp_path_factory) -> list[dict]:
    """The two records of a real Watch's timeline, as parsed JSON."""
    return watched_records(tmp_path_factory.mktemp("watch") / "run.jsonl")


def _write(tmp_path, records) -> str:
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return str(path)


def _set(record: dict, where: str, value) -> dict:
    """A deep copy of the record with the field at a dotted path (list indices as numbers) set to value."""
    record = json.loads(json.dumps(record))
    *parents, last = where.split(".")
    target = record
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return record


BROKEN_FIELDS = [  # (field, value, what the error says)
    ("step", "400", "step must be an integer"),
    ("step", [1], "step must be an integer"),
    ("step", 1.5, "step must be an integer"),
    ("step", "nan", "step must be an integer"),
    ("step", None, "step must be an integer"),
    ("step", -3, "step must be an integer"),
    ("layers", {"0": {}}, "layers must be a list"),
    ("layers.0.steps", [], "layers[0].steps must be an object"),
    ("layers.0.rms", "big", "layers[0].rms must be a number"),
    ("layers.0.entropy_per_head", "x", "layers[0].entropy_per_head must be a list"),
    ("layers.0.notes", "one note", "layers[0].notes must be a list"),
    ("layers.0.layer", True, "layers[0].layer must be an integer"),
    ("loss", "abc", "loss must be a number"),
    ("lr", [0.1], "lr must be a number"),
    ("source", "notebook", "source must be one of watch, checkpoint"),
    ("flags", [{"level": "error"}], "flags[0].name must be a string"),
    ("flags", [{"name": "x", "level": "fatal"}], "flags[0].level must be one of info, warning, error"),
    ("flags", "none", "flags must be a list"),
    ("diagnosis", [{"evidence": "e"}], "diagnosis[0].cause must be a string"),
]


@pytest.mark.parametrize("field, value, said", BROKEN_FIELDS, ids=[f"{f}={v!r}" for f, v, _ in BROKEN_FIELDS])
def test_a_timeline_field_of_the_wrong_type_is_refused_naming_line_and_field(invoke, tmp_path, timeline_lines,
                                                                            field, value, said):
    path = _write(tmp_path, [timeline_lines[0], _set(timeline_lines[1], field, value)])
    one_error_line(invoke("track", path), f"{path}:2: {said}")


def test_a_step_written_twice_is_refused(invoke, tmp_path, timeline_lines):
    path = _write(tmp_path, [timeline_lines[0], timeline_lines[1], timeline_lines[0]])
    one_error_line(invoke("track", path), f"{path}:3 repeats step 0 of line 1")


def test_strings_stay_strings_and_only_numbers_come_back_from_nan(tmp_path, timeline_lines):
    record = _set(_set(timeline_lines[1], "path", "nan"), "layers.0.notes", ["inf"])
    record = _set(record, "layers.0.max_logit", "inf")
    read = read_timeline(_write(tmp_path, [record]))[0]
    assert read["path"] == "nan" and read["layers"][0]["notes"] == ["inf"]
    assert read["layers"][0]["max_logit"] == float("inf")


def _gpt2_copy(tmp_path):
    target = tmp_path / "gpt2"
    shutil.copytree(GPT2, target)
    return target


@pytest.mark.parametrize("nesting", [TOO_DEEP, DEEPER_THAN_PYTHON], ids=["past the limit", "past Python's recursion"])
def test_json_nested_too_deep_is_one_error_everywhere(invoke, tmp_path, nesting):
    weights = _gpt2_copy(tmp_path)
    (weights / "config.json").write_text('{"a": ' + nesting + "}")
    one_error_line(invoke("check", "--weights", str(weights), "--token-ids", "1", "2"), "nested deeper than")
    (tmp_path / "deep.jsonl").write_text(nesting + "\n{}\n")
    one_error_line(invoke("track", str(tmp_path / "deep.jsonl")), "deep.jsonl:1")
    one_error_line(invoke("track", str(tmp_path / "deep.jsonl"), "--log", str(tmp_path / "deep.jsonl")), "deep.jsonl:1")
    one_error_line(invoke("run", "--step-names", '{"a": ' + nesting + "}"), "--step-names")
    (tmp_path / "ids.json").write_text(nesting)
    one_error_line(invoke("run", "--weights", str(GPT2), "--token-ids-file", str(tmp_path / "ids.json")),
                   "nested deeper than")


def test_trainer_state_that_is_not_an_object_is_not_a_step(invoke, tmp_path):
    weights = _gpt2_copy(tmp_path)
    for content in ("[1, 2]", '"global_step"', TOO_DEEP):
        (weights / "trainer_state.json").write_text(content)
        result = invoke("check", "--weights", str(weights), "--token-ids", "1", "2", "--json")
        assert result.exit_code in (0, 1) and "Traceback" not in result.output, result.output
        assert json.loads(result.stdout)["step"] is None


def _fifo_refused(invoke, args: list[str], fragment: str) -> None:
    """One error line; a read that blocks on the FIFO fails the test after 30 s instead of hanging the suite."""
    def hung(signum, frame):
        raise AssertionError(f"blocked on a FIFO: {' '.join(args)}")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        result = invoke(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("Error: ") and fragment in result.stderr, result.stderr


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json"])
def test_a_fifo_inside_a_checkpoint_folder_is_refused_not_read(invoke, tmp_path, name):
    weights = _gpt2_copy(tmp_path)
    if name != "config.json":
        (weights / "model.safetensors").rename(weights / "model-00001-of-00001.safetensors")
    (weights / name).unlink(missing_ok=True)
    os.mkfifo(weights / name)
    _fifo_refused(invoke, ["check", "--weights", str(weights), "--token-ids", "1", "2"], "FIFO")


def test_reading_a_timeline_directly_names_the_field(tmp_path, timeline_lines):
    path = _write(tmp_path, [_set(timeline_lines[0], "step", "3")])
    with pytest.raises(InputError, match=r"broken.jsonl:1: step must be an integer ≥ 0, not '3'"):
        read_timeline(path)


def _edit_weights(folder, change) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def test_a_stray_layer_index_is_refused_before_anything_is_sized(invoke, tmp_path):
    """h.999999999.… once made inspect allocate a list per missing layer (7.4 GB)."""
    import resource

    weights = _gpt2_copy(tmp_path)
    _edit_weights(weights, lambda t: t.update({"h.999999999.ln_1.weight": torch.ones(64)}))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    one_error_line(invoke("check", "--weights", str(weights), "--token-ids", "1"),
                   "layer 4 is missing but layer 999999999 is there")
    shown = json.loads(invoke("inspect", str(weights), "--json").stdout)  # inspect shows the file, and why it fails
    assert "layer 4 is missing but layer 999999999 is there" in shown["layout_note"]
    assert "h.999999999.ln_1.weight" in {t["name"] for t in shown["other_tensors"]} and shown["n_layers"] == 4
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing sized from it


def test_integer_weights_are_refused_not_traced_as_floats(invoke, tmp_path):
    weights = _gpt2_copy(tmp_path)
    _edit_weights(weights, lambda t: t.update({"h.0.attn.c_attn.weight": t["h.0.attn.c_attn.weight"].to(torch.int8)}))
    one_error_line(invoke("check", "--weights", str(weights), "--token-ids", "1", "2"),
                   "h.0.attn.c_attn.weight", "stored as I8", "dequantise")
    listed = invoke("inspect", str(weights))  # inspect lists what is there, integers too
    assert listed.exit_code == 0 and "I8" in listed.stdout


def test_an_embedding_narrower_than_the_blocks_is_named(invoke, tmp_path):
    weights = _gpt2_copy(tmp_path)
    _edit_weights(weights, lambda t: t.update({"wte.weight": t["wte.weight"][:, :32].contiguous()}))
    for command in ("run", "check"):
        one_error_line(invoke(command, "--weights", str(weights), "--token-ids", "1", "2"),
                       "wte.weight has shape [118, 32] but the blocks are 64 wide")


def _config(weights, change) -> None:
    config = json.loads((weights / "config.json").read_text())
    change(config)
    (weights / "config.json").write_text(json.dumps(config))


def test_a_config_that_contradicts_its_tensors_is_named_not_sized(invoke, tmp_path):
    """Once: "needs 14210.9 PiB" — the memory estimate believed the config over the tensors."""
    weights = _gpt2_copy(tmp_path)
    _config(weights, lambda c: c.update(n_embd=6_400_000))
    one_error_line(invoke("check", "--weights", str(weights), "--token-ids", "1"),
                   "n_embd = 6400000 but the weights' d_model is 64", "does not belong to these weights")


def test_a_config_without_heads_is_not_called_missing(invoke, tmp_path):
    weights = _gpt2_copy(tmp_path)
    _config(weights, lambda c: c.pop("n_head"))
    one_error_line(invoke("check", "--weights", str(weights), "--token-ids", "1"),
                   "config.json does not say the number of heads (n_head): pass --heads")


def test_a_bad_pad_token_id_is_blamed_on_the_config(invoke, tmp_path):
    weights = _gpt2_copy(tmp_path)
    _config(weights, lambda c: c.update(pad_token_id=99999))
    one_error_line(invoke("check", "--weights", str(weights), "--token-ids", "1 2 3 / 4"),
                   "config.json: pad_token_id 99999 is outside the vocabulary: 0–117")
    alone = invoke("check", "--weights", str(weights), "--token-ids", "1", "2", "3")  # nothing to pad: not needed
    assert alone.exit_code in (0, 1), alone.output


def test_a_timeline_is_known_by_its_suffix_in_any_case(invoke, tmp_path, timeline_lines):
    path = tmp_path / "RUN.JSONL"
    path.write_text("".join(json.dumps(record) + "\n" for record in timeline_lines))
    result = invoke("track", str(path))
    assert result.exit_code in (0, 1) and "2 watch records" in result.stdout, result.output


def test_an_empty_vocabulary_is_said_so(invoke, tmp_path):
    weights = _gpt2_copy(tmp_path)
    _edit_weights(weights, lambda t: t.update({"wte.weight": torch.zeros(0, 64)}))
    result = invoke("check", "--weights", str(weights), "--token-ids", "1")
    one_error_line(result, "the vocabulary has 0 ids: none")
    assert "0–-1" not in result.stderr
