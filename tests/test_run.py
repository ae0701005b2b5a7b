"""cli/run.py: `blocktrace run` as a user types it: the tutorial's table, --json, --save, and every error."""

import json
import re

import numpy as np
import pytest
from safetensors import safe_open

STEPS = ["norm1", "attn", "residual1", "norm2", "ffn", "residual2"]


def table_rows(output: str) -> dict[str, list[str]]:
    """Rows of the step table, by step name: [#, step, operation, shape, ...]."""
    rows = {}
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) >= 4 and cells[1] in STEPS + ["x"]:
            rows[cells[1]] = cells
    return rows


def test_the_tutorial_example(invoke):
    result = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼")
    assert result.exit_code == 0, result.output
    rows = table_rows(result.stdout)
    assert [name for name in rows if name != "x"] == STEPS
    assert all(rows[name][3] == "[3, 4]" for name in STEPS)
    assert rows["residual1"][2] == "x1 = x + attn_out"
    assert "attention_shape=[2, 3, 3]" in result.stdout
    assert "future_weight_sum=0.0000" in result.stdout
    assert result.stdout.rstrip().endswith("block_shape_preserved=True")


def test_quoted_tokens_are_the_same_tokens(invoke):
    spaced = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼")
    quoted = invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "猫 吃 鱼")
    after = invoke("run", "--tokens", "猫", "吃", "鱼", "--d-model", "4", "--heads", "2")
    assert spaced.stdout == quoted.stdout == after.stdout


def test_batched_random_input_and_the_causal_mask(invoke):
    causal = json.loads(invoke("run", "--batch", "2", "--seq-len", "5", "--d-model", "16", "--heads", "4", "--json").stdout)
    assert causal["attention"]["shape"] == [2, 4, 5, 5]
    assert causal["attention"]["future_weight_sum"] == 0.0
    text = invoke("run", "--batch", "2", "--seq-len", "5", "--d-model", "16", "--heads", "4").stdout
    assert "attention_shape=[2, 4, 5, 5]" in text and "future_weight_sum=0.0000" in text
    free = json.loads(invoke("run", "--batch", "2", "--seq-len", "5", "--d-model", "16", "--heads", "4",
                             "--no-causal", "--json").stdout)
    assert free["attention"]["future_weight_sum"] > 0


def test_same_seed_same_numbers_other_seed_other_numbers(invoke):
    first, second = invoke("run", "--seed", "3").stdout, invoke("run", "--seed", "3").stdout
    assert first == second and first != invoke("run", "--seed", "4").stdout


def load_saved(path):
    with safe_open(str(path), framework="np") as f:
        return {key: f.get_tensor(key) for key in f.keys()}, f.metadata()


def layer_norm(x):
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(-1, keepdims=True) + 1e-5)


def test_saved_pre_ln_tensors_recombine(invoke, tmp_path):
    path = tmp_path / "trace.safetensors"
    assert invoke("run", "--tokens", "猫 吃 鱼", "--d-model", "8", "--heads", "2", "--save", str(path)).exit_code == 0
    t, metadata = load_saved(path)
    assert set(t) == {"x", *STEPS, "attn_weights"}
    assert np.allclose(t["residual1"], t["x"] + t["attn"], atol=1e-6)
    assert np.allclose(t["residual2"], t["residual1"] + t["ffn"], atol=1e-6)
    assert np.allclose(t["norm1"].mean(-1), 0, atol=1e-5) and np.allclose(t["norm1"].std(-1), 1, atol=1e-3)
    assert np.allclose(t["attn_weights"].sum(-1), 1, atol=1e-6)
    assert json.loads(metadata["config"])["d_model"] == 8
    assert json.loads(metadata["step_order"]) == STEPS
    assert json.loads(metadata["tokens"]) == ["猫", "吃", "鱼"]


def test_saved_post_ln_tensors_recombine(invoke, tmp_path):
    path = tmp_path / "post.safetensors"
    assert invoke("run", "--post-ln", "--seq-len", "4", "--save", str(path)).exit_code == 0
    t, metadata = load_saved(path)
    assert np.allclose(t["residual1"], t["x"] + t["attn"], atol=1e-6)
    assert np.allclose(t["norm1"], layer_norm(t["residual1"]), atol=1e-5)
    assert json.loads(metadata["step_order"]) == ["attn", "residual1", "norm1", "ffn", "residual2", "norm2"]


def test_json_statistics_equal_statistics_of_the_saved_tensors(invoke, tmp_path):
    path = tmp_path / "t.safetensors"
    report = json.loads(invoke("run", "--batch", "2", "--seq-len", "3", "--json", "--save", str(path)).stdout)
    tensors, _ = load_saved(path)
    for step in [report["input"], *report["steps"]]:
        a = tensors[step["name"]].astype(np.float64)
        expected = [a.mean(), a.std(), a.min(), a.max(), np.sqrt((a**2).mean()), np.abs(a).max(), 0, 0]
        assert list(step["stats"].values()) == pytest.approx(expected, rel=1e-5, abs=1e-6), step["name"]
        assert step["shape"] == list(a.shape)
    assert report["schema"] == 2 and report["block_shape_preserved"] is True


def test_values_show_the_first_numbers_of_the_chosen_token(invoke, tmp_path):
    path = tmp_path / "v.safetensors"
    report = json.loads(invoke("run", "--tokens", "猫 吃 鱼", "--d-model", "8", "--heads", "2", "--values", "3",
                               "--token-index", "1", "--json", "--save", str(path)).stdout)
    tensors, _ = load_saved(path)
    for step in report["steps"]:
        assert step["values"] == pytest.approx(tensors[step["name"]][1, :3].tolist())
    text = invoke("run", "--tokens", "猫 吃 鱼", "--d-model", "8", "--heads", "2", "--values", "3", "--token-index", "1").stdout
    assert "first 3 values of token 1 (吃) at every step" in text


ERROR_CASES = [
    (["--d-model", "6", "--heads", "4"], 2, "Error: Invalid value for '--heads': d_model 6 is not divisible by heads 4"),
    (["--d-model", "0"], 2, "Error: Invalid value for '--d-model': 0 is not in the range 1<=x<="),
    (["--heads", "-2"], 2, "Error: Invalid value for '--heads': -2 is not in the range 1<=x<="),
    (["--d-ff", "0"], 2, "Error: Invalid value for '--d-ff': 0 is not in the range 1<=x<="),
    (["--seq-len", "0"], 2, "Error: Invalid value for '--seq-len': 0 is not in the range 1<=x<="),
    (["--tokens", ""], 2, "Error: --tokens needs at least one token"),
    (["--tokens"], 2, "Error: Option '--tokens' requires an argument."),
    (["--tokens", "a b", "--seq-len", "3"], 2, "Error: --seq-len 3 contradicts the 2 tokens given"),
    (["--values", "2", "--token-index", "7"], 2, "Error: Invalid value for '--token-index': 7 is out of range"),
    (["--norm", "batchnorm"], 2, "Error: Invalid value for '--norm': 'batchnorm' is not one of"),
    (["--save", "/no/such/dir/t.safetensors"], 2, "Error: cannot write /no/such/dir/t.safetensors: directory /no/such/dir does not exist"),
    (["--save", "/proc/blocktrace-test.safetensors"], 2, "Error: cannot write /proc/blocktrace-test.safetensors"),
]


@pytest.mark.parametrize("args, code, message", ERROR_CASES)
def test_errors_are_one_line_with_the_right_exit_code(invoke, args, code, message):
    result = invoke("run", *args)
    assert result.exit_code == code
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), result.stderr
    assert "Traceback" not in result.output


def test_save_refuses_to_overwrite_without_force(invoke, tmp_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"keep me")
    result = invoke("run", "--save", str(path))
    assert result.exit_code == 2 and result.stderr == f"Error: {path} already exists: pass --force to overwrite it\n"
    assert path.read_bytes() == b"keep me"
    assert invoke("run", "--save", str(path), "--force").exit_code == 0
    assert load_saved(path)[0]["x"].shape == (5, 16)


def test_a_failed_write_leaves_no_file(invoke, tmp_path, monkeypatch):
    import blocktrace.sources.tracefile

    def half_write(handle, tensors, metadata):
        handle.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(blocktrace.sources.tracefile, "write_safetensors", half_write)
    result = invoke("run", "--save", str(tmp_path / "t.safetensors"))
    assert result.exit_code == 2
    assert result.stderr == f"Error: cannot write {tmp_path / 't.safetensors'}: No space left on device\n"
    assert list(tmp_path.iterdir()) == []


def test_every_command_has_help_and_the_version_answers(invoke):
    from blocktrace._version import __version__
    from blocktrace.cli import cli

    for name, command in cli.commands.items():
        assert command.help, name
        assert invoke(name, "--help").exit_code == 0
    assert invoke("--version").stdout == f"blocktrace, version {__version__}\n"


def test_attention_chunking_changes_no_number(invoke):
    whole = json.loads(invoke("run", "--seq-len", "9", "--batch", "2", "--json").stdout)
    chunked = json.loads(invoke("run", "--seq-len", "9", "--batch", "2", "--attn-chunk", "2", "--json").stdout)
    for a, b in zip(whole["steps"], chunked["steps"]):
        assert list(a["stats"].values()) == pytest.approx(list(b["stats"].values()), rel=1e-5, abs=1e-6)
    assert chunked["attention"]["entropy_per_head"] == pytest.approx(whole["attention"]["entropy_per_head"], rel=1e-5)
    assert np.allclose(chunked["attention"]["weights_first_sequence"], whole["attention"]["weights_first_sequence"],
                       atol=1e-6)


def test_device_cuda_without_a_gpu_is_a_clear_error_and_auto_falls_back(invoke):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the no-GPU error cannot happen here")
    result = invoke("run", "--device", "cuda")
    assert result.exit_code == 2
    assert result.stderr == "Error: --device cuda: no CUDA device is available here (use --device cpu or auto)\n"
    assert invoke("run", "--device", "auto").stdout == invoke("run").stdout
