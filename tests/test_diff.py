"""`blocktrace diff`: a trace against itself, and against one with a perturbed step."""

import json
from pathlib import Path

import pytest
import torch
from helpers import one_error_line, strict_json
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def _saved(invoke, path, *args):
    length = () if "--seq-len" in args else ("--seq-len", "4")
    assert invoke("run", *length, *args, "--save", str(path)).exit_code == 0
    return path


def test_a_trace_against_itself_exits_0(invoke, tmp_path):
    path = _saved(invoke, tmp_path / "a.safetensors")
    result = invoke("diff", str(path), str(path))
    assert result.exit_code == 0 and "every step within atol=1e-05, rtol=0.0001" in result.stdout


def test_a_perturbed_step_is_named_and_exits_1(invoke, tmp_path):
    path = _saved(invoke, tmp_path / "a.safetensors")
    with safe_open(str(path), framework="pt") as f:
        tensors, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    tensors["ffn"] = tensors["ffn"] + 1e-3  # ffn, and only ffn: later steps are copied unchanged
    save_file(tensors, str(tmp_path / "b.safetensors"), metadata=metadata)
    result = invoke("diff", str(path), str(tmp_path / "b.safetensors"))
    assert result.exit_code == 1
    assert "first step beyond atol=1e-05, rtol=0.0001: ffn" in result.stdout
    report = json.loads(invoke("diff", str(path), str(tmp_path / "b.safetensors"), "--json").stdout)
    ffn = next(s for s in report["steps"] if s["name"] == "ffn")
    assert ffn["max_abs_diff"] == 1e-3 or abs(ffn["max_abs_diff"] - 1e-3) < 1e-6
    assert report["first_divergence"] == "ffn"
    loose = invoke("diff", str(path), str(tmp_path / "b.safetensors"), "--atol", "0.01")
    assert loose.exit_code == 0


def test_different_shapes_diverge(invoke, tmp_path):
    a = _saved(invoke, tmp_path / "a.safetensors")
    b = _saved(invoke, tmp_path / "b.safetensors", "--seq-len", "4", "--batch", "2")
    result = invoke("diff", str(a), str(b))
    assert result.exit_code == 1 and "first step beyond" in result.stdout and "[4, 16] vs [2, 4, 16]" in result.stdout


def test_a_file_that_is_not_a_trace(invoke, tmp_path):
    import torch

    save_file({"w": torch.zeros(2)}, str(tmp_path / "w.safetensors"))
    result = invoke("diff", str(tmp_path / "w.safetensors"), str(tmp_path / "w.safetensors"))
    assert result.exit_code == 2 and "is not a blocktrace trace file" in result.stderr
    missing = invoke("diff", str(tmp_path / "nope.safetensors"), str(tmp_path / "w.safetensors"))
    assert missing.exit_code == 2 and missing.stderr.startswith("Error: ") and "does not exist" in missing.stderr


def _trace_file(invoke, path: Path, *args: str) -> Path:
    assert invoke("run", "--seq-len", "4", "--save", str(path), *args).exit_code == 0
    return path


def test_a_trace_with_nan_does_not_differ_from_itself(invoke, tmp_path):
    x = torch.randn(4, 16)
    x[0, 0] = float("nan")
    save_file({"x": x}, str(tmp_path / "x.safetensors"))
    path = tmp_path / "t.safetensors"
    assert invoke("run", "--input", str(tmp_path / "x.safetensors"), "--save", str(path)).exit_code == 0
    result = invoke("diff", str(path), str(path))
    assert result.exit_code == 0, result.output
    other = tmp_path / "u.safetensors"
    assert invoke("run", "--seq-len", "4", "--save", str(other)).exit_code == 0
    assert invoke("diff", str(path), str(other)).exit_code == 1  # NaN against a number differs


def test_a_step_missing_on_either_side_diverges(invoke, tmp_path):
    full = _trace_file(invoke, tmp_path / "full.safetensors")
    tensors = load_file(str(full))
    with open(full, "rb"):
        from safetensors import safe_open

        metadata = safe_open(str(full), "pt").metadata()
    del tensors["ffn"]
    save_file(tensors, str(tmp_path / "less.safetensors"), metadata=metadata)
    for a, b in ((tmp_path / "less.safetensors", full), (full, tmp_path / "less.safetensors")):
        result = invoke("diff", str(a), str(b), "--json")
        assert result.exit_code == 1
        report = strict_json(result.stdout)
        assert report["first_divergence"] == "ffn"


def _without(source: Path, path: Path, *names: str, order=None) -> Path:
    """The trace file `source` less the tensors `names` (and, given `order`, with that step order)."""
    tensors = load_file(str(source))
    metadata = safe_open(str(source), "pt").metadata()
    if order is not None:
        metadata = {**metadata, "step_order": json.dumps(order)}
    save_file({k: v for k, v in tensors.items() if k not in names}, str(path), metadata=metadata)
    return path


def test_attention_weights_only_one_side_traced_are_said_and_the_rest_compared(invoke, tmp_path):
    """Issue 42.4: an implementation whose attention a fused kernel hides saves no attention weights; against one
    that saves them, every step both hold is compared, and what only one side has is said, not a divergence."""
    full = _trace_file(invoke, tmp_path / "full.safetensors")
    assert "attn_weights" in load_file(str(full))
    fused = _without(full, tmp_path / "fused.safetensors", "attn_weights")
    for a, b, side in ((full, fused, "A"), (fused, full, "B")):
        report = strict_json(invoke("diff", str(a), str(b), "--json").stdout)
        assert report["diverged"] is False and report["only_in_one"] == [{"name": "attn_weights", "only_in": side}]
        assert [s["name"] for s in report["steps"]] == ["x", *json.loads(safe_open(str(full), "pt").metadata()
                                                                         ["step_order"])]
        result = invoke("diff", str(a), str(b))
        assert result.exit_code == 0 and f"only in {side}, not compared: attn_weights" in result.stdout

    perturbed = load_file(str(fused))
    perturbed["residual2"] = perturbed["residual2"] + 1e-2  # a real difference still fails with the rest compared
    save_file(perturbed, str(tmp_path / "off.safetensors"), metadata=safe_open(str(fused), "pt").metadata())
    report = strict_json(invoke("diff", str(full), str(tmp_path / "off.safetensors"), "--json").stdout)
    assert report["first_divergence"] == "residual2"


def test_a_step_only_one_sides_order_names_is_said_not_a_divergence(invoke, tmp_path):
    full = _trace_file(invoke, tmp_path / "full.safetensors")
    order = json.loads(safe_open(str(full), "pt").metadata()["step_order"])
    shorter = _without(full, tmp_path / "short.safetensors", "residual2", order=order[:-1])
    report = strict_json(invoke("diff", str(full), str(shorter), "--json").stdout)
    assert report["diverged"] is False and {"name": "residual2", "only_in": "A"} in report["only_in_one"]


def test_two_traces_with_no_step_in_common_are_refused_in_one_line(invoke, tmp_path):
    for name in ("norm1", "y"):
        save_file({name: torch.ones(2, 4)}, str(tmp_path / f"{name}.safetensors"),
                  metadata={"step_order": json.dumps([name])})
    result = invoke("diff", str(tmp_path / "norm1.safetensors"), str(tmp_path / "y.safetensors"))
    one_error_line(result, 2, "hold no traced step in common (only in one: norm1, y)")


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_tolerances_must_be_finite_and_non_negative(invoke, tmp_path, value):
    path = _trace_file(invoke, tmp_path / "t.safetensors")
    one_error_line(invoke("diff", str(path), str(path), "--atol", value), 2, "--atol")
    one_error_line(invoke("diff", str(path), str(path), "--rtol", value), 2, "--rtol")
