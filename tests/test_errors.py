"""The bad-input contract (docs/reference.md: Errors): NaN and Inf traced, not a crash; files that are not what
they claim and values of the wrong type refused in one `Error:` line, exit 2, no traceback; each error blamed on the
right thing (a config.json value names the file, not an option)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, copy_sample, one_error_line, strict_json
from safetensors.torch import load_file, save_file


def test_nan_in_the_input_is_traced_not_a_crash(invoke, tmp_path):
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(0))
    x[1, 2] = float("nan")
    save_file({"x": x}, str(tmp_path / "n.safetensors"))
    text = invoke("run", "--input", str(tmp_path / "n.safetensors"))
    assert text.exit_code == 0, text.output
    assert "nan" in text.stdout and "?" in text.stdout  # the heatmap marks cells it cannot shade
    report = strict_json(invoke("run", "--input", str(tmp_path / "n.safetensors"), "--json").stdout)
    assert report["input"]["stats"]["nan"] == 1
    assert any(entry["path"].startswith("$.steps") for entry in report["non_finite"])
    assert any(f["name"] == "non_finite" for f in report["flags"])


@pytest.mark.parametrize("tensor, row", [("h.0.attn.c_attn.weight", 3), ("wte.weight", 2)])
def test_nan_in_the_weights_is_traced_not_a_crash(invoke, tmp_path, tensor, row):
    target = copy_sample(tmp_path)
    tensors = load_file(str(target / "model.safetensors"))
    tensors[tensor][row] = float("nan")
    save_file(tensors, str(target / "model.safetensors"))
    result = invoke("run", "--weights", str(target), "--token-ids", "1", "2", "3")
    assert result.exit_code == 0, result.output
    check = invoke("check", "--weights", str(target), "--token-ids", "1", "2", "3", "--json")
    assert check.exit_code == 1 and strict_json(check.stdout)["flags"][0]["name"] == "non_finite"

def _config_with(tmp_path, **fields) -> Path:
    target = copy_sample(tmp_path)
    config = json.loads((target / "config.json").read_text())
    config.update(fields)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("content, fragment", [
    ("[1, 2]", "must hold a JSON object, not list"),
    ('{"model_type": "gpt2", "n_head": "four"}', "n_head must be a positive integer, not \"four\""),
    ("{not json", "is not valid JSON"),
])
def test_config_json_of_the_wrong_shape(invoke, tmp_path, content, fragment):
    target = copy_sample(tmp_path)
    (target / "config.json").write_text(content)
    one_error_line(invoke("run", "--weights", str(target), "--token-ids", "1"), 2, "config.json", fragment)


@pytest.mark.parametrize("fields, fragment", [
    ({"rope_theta": "ten thousand"}, "rope_theta must be a positive number"),
    ({"rope_scaling": [1, 2]}, "rope_scaling must be a JSON object"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "x"}}, "rope_scaling.factor must be a positive number"),
])
def test_llama_rope_fields_of_the_wrong_type(invoke, tmp_path, fields, fragment):
    target = copy_sample(tmp_path, "llama-tiny")
    config = json.loads((target / "config.json").read_text())
    config.update(fields)
    (target / "config.json").write_text(json.dumps(config))
    one_error_line(invoke("run", "--weights", str(target), "--token-ids", "1"), 2, fragment)


def test_an_index_whose_weight_map_is_a_list(invoke, tmp_path):
    target = copy_sample(tmp_path)
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model.safetensors"]}))
    one_error_line(invoke("run", "--weights", str(target), "--token-ids", "1"), 2, "weight_map must map")


@pytest.mark.parametrize("order", ["not json", "7", '{"a": 1}', '[1, 2]'])
def test_trace_files_whose_step_order_is_not_a_list_of_names(invoke, tmp_path, order):
    path = tmp_path / "t.safetensors"
    save_file({"x": torch.zeros(2, 4)}, str(path), metadata={"step_order": order})
    one_error_line(invoke("diff", str(path), str(path)), 2, "step_order")


def test_traces_without_any_step_are_not_within_tolerance(invoke, tmp_path):
    path = tmp_path / "t.safetensors"
    save_file({"unrelated": torch.zeros(2)}, str(path), metadata={"step_order": '["norm1", "attn"]'})
    one_error_line(invoke("diff", str(path), str(path)), 2, "holds a traced step", "nothing to compare")


def test_zero_size_and_zero_dim_tensors(invoke, tmp_path):
    target = copy_sample(tmp_path)
    tensors = load_file(str(target / "model.safetensors"))
    tensors["h.0.ln_1.weight"] = torch.tensor(1.0)
    save_file(tensors, str(target / "model.safetensors"))
    one_error_line(invoke("run", "--weights", str(target), "--token-ids", "1"), 2, "h.0.ln_1.weight", "has shape []")
    path = tmp_path / "z.safetensors"
    save_file({"x": torch.zeros(0, 4), "norm1": torch.zeros(0, 4)}, str(path), metadata={"step_order": '["norm1"]'})
    result = invoke("diff", str(path), str(path))
    assert result.exit_code == 0 and "Traceback" not in result.output
    one_error_line(invoke("run", "--input", str(path)), 2, "expected [T, 16]")


def test_a_corrupt_tokenizer_file(invoke, tmp_path):
    target = copy_sample(tmp_path)
    (target / "tokenizer.json").write_text('{"version": "1.0", "model": 12}')
    one_error_line(invoke("run", "--weights", str(target), "--text", "猫"), 2, "tokenizer.json is not a valid tokenizer")
    labels_only = invoke("run", "--weights", str(target), "--token-ids", "1", "2", "--json")
    assert labels_only.exit_code == 0
    assert strict_json(labels_only.stdout)["tokens"] == ["1", "2"]


def test_unreadable_files_inside_a_checkpoint(invoke, tmp_path, monkeypatch):
    target = copy_sample(tmp_path)
    real_read_bytes = Path.read_bytes  # as root, chmod cannot make a file unreadable: the read itself fails

    def denied(self, *args, **kwargs):
        if self.name == "config.json":
            raise PermissionError(13, "Permission denied")
        return real_read_bytes(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_bytes", denied)
    one_error_line(invoke("run", "--weights", str(target), "--token-ids", "1"), 2, "cannot read", "Permission denied")
    monkeypatch.setattr(Path, "read_bytes", real_read_bytes)
    monkeypatch.setattr(Path, "iterdir", lambda self: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    (target / "model.safetensors").rename(target / "weights.safetensors")
    one_error_line(invoke("run", "--weights", str(target), "--token-ids", "1"), 2, "cannot read", "Permission denied")


def test_a_forward_that_returns_a_dict(invoke, tmp_path, monkeypatch):
    (tmp_path / "dict_block.py").write_text(
        "import torch\n"
        "class Block(torch.nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.ln1, self.ln2 = torch.nn.LayerNorm(16), torch.nn.LayerNorm(16)\n"
        "        self.attn, self.ffn = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)\n"
        "    def forward(self, x):\n"
        "        x = x + self.attn(self.ln1(x))\n"
        "        return {'hidden': x + self.ffn(self.ln2(x))}\n"
        "def make():\n"
        "    return Block()\n")
    monkeypatch.chdir(tmp_path)
    one_error_line(invoke("run", "--module", "dict_block:make"), 2, "returned dict")


def test_out_of_range_seed_and_invalid_utf8_tokens(invoke):
    one_error_line(invoke("run", "--seed", "18446744073709551615"), 2, "--seed")
    one_error_line(invoke("run", "--tokens", "\udcff\udcfe"), 2, "--tokens", "not valid UTF-8")


def _main_writing_to_a_full_disk(args: list[str]) -> tuple[int, str]:
    """blocktrace's main() with its standard output on /dev/full, in a forked child of this process (torch is
    imported already: no interpreter start-up); its exit code and standard error."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        code = 70
        try:
            os.dup2(os.open("/dev/full", os.O_WRONLY), 1)
            os.dup2(write_end, 2)
            sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
            torch.set_num_threads(1)  # a forked child does not reuse its parent's thread pool
            sys.argv = ["blocktrace", *args]
            from blocktrace.cli import main

            try:
                main()
                code = 0
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, encoding="utf-8") as pipe:
        stderr = pipe.read()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status), stderr


@pytest.mark.parametrize("args", [["run"], ["--help"], ["--version"], []])  # click writes the last three itself
def test_standard_output_that_cannot_be_written(args):
    code, stderr = _main_writing_to_a_full_disk(args)
    assert code == 2, stderr
    assert stderr.strip().splitlines() == ["Error: cannot write to standard output: No space left on device"]


def test_standard_output_closed_from_the_start():
    """Refused before anything is imported, whatever the command (a real interpreter: sys.stdout is None)."""
    closed = subprocess.run(["sh", "-c", f"'{sys.executable}' -m blocktrace --version >&-"], stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)
    assert closed.returncode == 2
    assert closed.stderr.strip().splitlines() == ["Error: standard output is closed: redirect it to a file or to "
                                                  "/dev/null"]

def test_a_bad_value_in_config_json_names_the_file_not_an_option(invoke, tmp_path):
    target = _config_with(tmp_path, n_head=3)
    result = invoke("run", "--weights", str(target), "--token-ids", "1")
    one_error_line(result, 2, "config.json", "n_head = 3")
    assert "--heads" not in result.stderr


def test_fifos_and_link_loops_as_weights(invoke, tmp_path):
    fifo = tmp_path / "weights.safetensors"
    os.mkfifo(fifo)
    one_error_line(invoke("run", "--weights", str(fifo), "--token-ids", "1"), 2, "is a FIFO")
    loop = tmp_path / "loop"
    loop.symlink_to(tmp_path / "loop")
    one_error_line(invoke("run", "--weights", str(loop), "--token-ids", "1"), 2, "symbolic link loop")
    directory = tmp_path / "ckpt"
    directory.mkdir()
    os.mkfifo(directory / "model.safetensors")
    one_error_line(invoke("run", "--weights", str(directory), "--token-ids", "1"), 2, "is a FIFO")
