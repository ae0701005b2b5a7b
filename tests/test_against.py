"""training/against.py: a reference is checked against the run it judges (issue 33): runs of another family, model,
width, depth or vocabulary are refused by name, so is a run or reference without layer records, and nothing is
written (--out) before every input is read and matched."""

from __future__ import annotations

import json

import pytest

HEALTHY = "sample_weights/training/gpt2-twin-healthy/watch.jsonl"
DETACHED = "sample_weights/training/gpt2-twin-detached/watch.jsonl"
MIXTRAL = "sample_weights/training/mixtral-router-lr-high/watch.jsonl"
LR_HIGH = "sample_weights/training/gpt2-lr-high/watch.jsonl"


def _one_error(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


def _edited(tmp_path, source, name, change):
    lines = [json.loads(line) for line in open(source, encoding="utf-8")]
    path = tmp_path / name
    path.write_text("".join(json.dumps(change(entry)) + "\n" for entry in lines))
    return path


def test_a_reference_of_another_depth_is_refused(invoke, tmp_path):
    deeper = _edited(tmp_path, HEALTHY, "deeper.jsonl", lambda e: {**e, "layers": e["layers"] + [
        {**e["layers"][-1], "layer": len(e["layers"])}]})
    _one_error(invoke("track", DETACHED, "--against", str(deeper)), "3 layers", "the run 2")


@pytest.mark.parametrize("key, value, words", [("vocab", 1000, "vocabulary"), ("width", 64, "width"),
                                               ("model", "LlamaForCausalLM", "model class")])
def test_a_reference_of_another_model_is_refused_naming_what_differs(invoke, tmp_path, key, value, words):
    run = _edited(tmp_path, DETACHED, "run.jsonl", lambda e: {**e, "width": 32, "model": "GPT2LMHeadModel"})
    other = _edited(tmp_path, HEALTHY, "other.jsonl",
                    lambda e: {**e, "width": 32, "model": "GPT2LMHeadModel", key: value})
    _one_error(invoke("track", str(run), "--against", str(other)), "another model", words)


def test_a_reference_of_another_family_and_vocabulary_is_refused(invoke):
    """The twin GPT-2 (vocabulary 99) against the tiny Mixtral's run: both 2 layers, yet not runs of one model."""
    _one_error(invoke("track", DETACHED, "--against", MIXTRAL), "another model", "kinds of weight tensor")


@pytest.mark.parametrize("which", ["run", "reference"])
def test_records_without_layers_are_refused_not_called_never_parted(invoke, tmp_path, which):
    empty = _edited(tmp_path, HEALTHY, "empty.jsonl", lambda e: {**e, "layers": []})
    run, reference = (str(empty), HEALTHY) if which == "run" else (HEALTHY, str(empty))
    _one_error(invoke("track", run, "--against", reference), "no layer records")


def test_nothing_is_written_when_the_reference_shares_no_step(invoke, tmp_path):
    import shutil

    reference = tmp_path / "reference"
    shutil.copytree("sample_weights/training/gpt2-lr-high/step_0010", reference / "step_0007")
    out = tmp_path / "out.jsonl"
    result = invoke("track", "sample_weights/training/gpt2-lr-high/step_0000", "sample_weights/training/gpt2-lr-high/step_0010",
                    "--text-file", "sample_weights/training/eval.txt", "--out", str(out), "--against",
                    str(reference / "step_0007"))
    _one_error(result, "no step in common")
    assert not out.exists()


def test_a_timeline_whose_last_line_is_torn_is_read_and_said_so(invoke, tmp_path):
    """Tolerating a line torn by a killed writer is right; saying nothing is not."""
    text = open(HEALTHY, encoding="utf-8").read()
    path = tmp_path / "torn.jsonl"
    path.write_text(text + text.splitlines()[0][:40])
    result = invoke("track", str(path), "--brief")
    assert result.exit_code == 0
    assert f"note: line {len(text.splitlines()) + 1} of {path} is cut short" in result.stderr


def test_a_trainer_state_log_is_known_by_its_suffix_in_any_case(invoke, tmp_path):
    log = tmp_path / "trainer_state.JSON"
    log.write_text(json.dumps({"log_history": [{"step": 0, "loss": 4.5}, {"step": 10, "loss": 4.4}]}))
    result = invoke("track", HEALTHY, "--log", str(log), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"][0]["log"] == {"loss": 4.5}


def test_a_mistyped_weights_path_is_named_before_any_rule_about_the_input(invoke):
    """issue 32's stumble: `run --weights sample_weights/gpt2-tinyy` complained about a missing input."""
    _one_error(invoke("run", "--weights", "sample_weights/gpt2-tinyy"), "sample_weights/gpt2-tinyy does not exist")


def test_a_missing_weights_file_is_not_offered_as_a_model_to_download(invoke):
    result = invoke("diff", "nope.safetensors", "sample_weights/traces/layer1.safetensors")
    _one_error(result, "nope.safetensors does not exist")
    assert "huggingface-cli" not in result.output
