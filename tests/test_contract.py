"""The bad-input contract: one `Error:` line, exit 2 for any error, no traceback, no option
accepted and ignored, no file lost (docs/reference.md: Errors)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import ROOT, SAMPLES
from safetensors.torch import load_file, save_file

GPT2 = SAMPLES / "gpt2-tiny"


def strict_json(text: str):
    """JSON without NaN / Infinity, which json.loads would otherwise accept."""
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def one_error_line(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in result.output


def copy_sample(tmp_path: Path, name: str = "gpt2-tiny") -> Path:
    target = tmp_path / name
    shutil.copytree(SAMPLES / name, target)
    return target


# --- 1. NaN / Inf reaching attention ------------------------------------------------------------

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


# --- 2. diff ------------------------------------------------------------------------------------

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


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_tolerances_must_be_finite_and_non_negative(invoke, tmp_path, value):
    path = _trace_file(invoke, tmp_path / "t.safetensors")
    one_error_line(invoke("diff", str(path), str(path), "--atol", value), 2, "--atol")
    one_error_line(invoke("diff", str(path), str(path), "--rtol", value), 2, "--rtol")


# --- 3./4. files that must not be replaced or lost ----------------------------------------------

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


# --- 5. sizes that cannot fit -------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--d-model", "20000", "--heads", "1"], ["--layers", "1000", "--d-model", "4096"],
                                  ["--d-model", "100000", "--seq-len", "100000"]])
def test_runs_that_cannot_fit_are_refused_with_the_estimate(invoke, monkeypatch, args):
    import blocktrace.sizing

    monkeypatch.setattr(blocktrace.sizing, "available_bytes", lambda device: 8 * 2**30)
    one_error_line(invoke("run", *args), 2, "this run needs about", "8.0 GiB is available")


@pytest.mark.parametrize("args, option", [
    (["run", "--layers", "100000"], "--layers"), (["run", "--seq-len", "1000000"], "--seq-len"),
    (["run", "--d-model", "99999999999999999999999"], "--d-model"),
    (["compare", "--pre-ln", "--post-ln", "--layers", "6,2000", "--grad"], "--layers"),
    (["check", "--weights", str(GPT2), "--token-ids", "1", "--grad", "--batches", "1000000000"], "--batches")])
def test_sizes_past_any_model_are_refused_before_any_work(invoke, args, option):
    """Each would fit in memory at a small width, and run for hours: refused as options, naming the bound."""
    one_error_line(invoke(*args), 2, f"Invalid value for '{option}'", "at most" if option == "--layers" else "<=x<=")


def test_a_head_hint_for_any_width_is_computed_at_once():
    from blocktrace.config import BlockConfig

    with pytest.raises(ValueError, match=r"pick heads among 1, 89, 101 \(the divisors up to 128\)"):
        BlockConfig(d_model=10**22 + 1, n_heads=7)  # 89 · 101 · 1112470797641561909: listing every divisor never ends


def test_the_estimate_covers_what_a_run_really_allocates():
    """The guard errs large: a stack's parameters and one block's activations, measured here."""
    from blocktrace.config import BlockConfig
    from blocktrace.model.stack import build_stack
    from blocktrace.sizing import Shape, estimate_bytes

    config = BlockConfig(d_model=64, n_heads=4)
    blocks = build_stack(config, 3)
    parameters = sum(p.numel() * p.element_size() for b in blocks for p in b.parameters())
    estimate = estimate_bytes(config, 3, Shape(2, 32), 4, grad=False, keep_tensors=False,
                              chunk_bytes=2**28, attn_chunk=None)
    assert parameters <= estimate <= 4 * parameters + 2 * 32 * (8 * 64 + 2 * 256 + 2 * 4 * 32) * 4


# --- 6. valid JSON of the wrong type, and other files that are not what they claim --------------

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


# --- 7. errors blamed on the right thing --------------------------------------------------------

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


# --- 8. options accepted and ignored ------------------------------------------------------------

MODULE = "examples.tutorial_block:healthy"
REFUSED = [
    (["run", "--block-steps"], "--block-steps"),
    (["run", "--batches", "2"], "--batches"),
    (["run", "--fail-on", "warning"], "--fail-on"),
    (["run", "--layer", "1"], "--layer"),
    (["run", "--values", "2", "--layers", "2"], "--values"),
    (["run", "--token-index", "1"], "--token-index"),
    (["run", "--weights", str(GPT2), "--token-ids", "1", "--seed", "3"], "--seed"),
    (["run", "--weights", str(GPT2), "--token-ids", "1", "--init", "xavier"], "--init"),
    (["run", "--pre-ln", "--post-ln"], "--pre-ln and --post-ln"),
    (["run", "--json", "--format", "grid"], "--format"),
    (["run", "--json", "--lang", "zh"], "--lang"),
    (["run", "--json", "--explain"], "--explain"),
    (["run", "--check", "--explain"], "--explain"),
    (["run", "--check", "--values", "2"], "--values"),
    (["run", "--check", "--lang", "zh"], "--lang"),
    (["run", "--check", "--layers", "2", "--block-steps"], "--block-steps"),
    (["run", "--weights", str(GPT2), "--token-ids", "1", "--seq-len", "3"], "--seq-len"),
    (["compare", "--pre-ln", "--post-ln", "--block-steps"], "--block-steps"),
    (["compare", "--pre-ln", "--post-ln", "--weights", str(GPT2), "--token-ids", "1", "--seed", "2"], "--seed"),
    (["compare", "--pre-ln", "--post-ln", "--json", "--lang", "zh"], "--lang"),
    (["check", "--lang", "zh"], "--lang sets the words of the --html page"),
    (["track", str(SAMPLES / "training" / "gpt2-lr-high" / "watch.jsonl"), "--lang", "zh"],
     "--lang sets the words of the --html page"),
    (["compare", "--pre-ln", "--post-ln", "--json", "--explain"], "--explain"),
    (["compare", "--pre-ln", "--post-ln", "--layers", "2", "--explain"], "--explain"),
    (["compare", "--pre-ln", "--post-ln", "--plot", "/tmp/never-written.png"], "--plot"),
    (["run", "--force"], "--force lets --save or --plot"),
    (["compare", "--pre-ln", "--post-ln", "--force"], "--force lets --plot"),
    (["track", str(SAMPLES / "nanogpt" / "ckpt_0000.pt"), "--token-ids", "1", "--force"], "--force lets --out"),
    (["run", "--layers", "2", "--block-steps", "--json"], "--block-steps"),
    (["compare", "--pre-ln", "--post-ln", "--layers", "2", "--block-steps", "--json"], "--block-steps"),
    (["run", "--tokens", "a", "b", "--grad", "--batches", "2"], "--batches"),
    (["check", "--weights", str(GPT2), "--token-ids", "1", "2", "--grad", "--batches", "2"], "--batches"),
    (["run", "--d-model", "4", "--heads", "2", "--d-model", "8"], "--d-model is given twice"),
    (["inspect", str(GPT2), "--format", "grid", "--format=simple"], "--format is given twice"),
    *[(["run", "--module", MODULE, *extra], extra[0]) for extra in (
        ["--post-ln"], ["--deepnorm"], ["--norm", "rmsnorm"], ["--ffn", "relu"], ["--attn-chunk", "2"],
        ["--init", "xavier"], ["--heads", "2"], ["--no-bias"], ["--eps", "0.001"])],
]


@pytest.mark.parametrize("args, option", REFUSED, ids=[" ".join(a[0:1] + a[-2:]) for a, _ in REFUSED])
def test_options_that_would_be_ignored_are_refused(invoke, args, option, monkeypatch):
    monkeypatch.chdir(ROOT)
    one_error_line(invoke(*args), 2, option)


@pytest.mark.parametrize("option", ["--explain", "--values", "--block-steps", "--token-index"])
def test_check_has_no_display_options_but_the_table_format(invoke, option):
    result = invoke("check", option, "2")
    assert result.exit_code == 2 and f"No such option '{option}'" in result.stderr


def test_a_batched_input_file_with_another_batch_is_refused(invoke, tmp_path):
    save_file({"x": torch.randn(2, 3, 16)}, str(tmp_path / "x.safetensors"))
    one_error_line(invoke("run", "--input", str(tmp_path / "x.safetensors"), "--batch", "5"), 2, "--batch 5")
    same = invoke("run", "--input", str(tmp_path / "x.safetensors"), "--batch", "2")
    assert same.exit_code == 0


def test_plot_without_matplotlib_fails_before_the_computation(invoke, tmp_path, monkeypatch):
    import blocktrace.pipeline

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr(blocktrace.pipeline, "run_request", lambda *a: pytest.fail("computed before failing"))
    one_error_line(invoke("run", "--plot", str(tmp_path / "p.png")), 2, "--plot needs matplotlib")


# Each option, added to a working command, changes the output or is refused: never ignored.
HONOURED = [
    (["run"], ["--seed", "1"]), (["run"], ["--init", "xavier"]), (["run"], ["--no-causal"]),
    (["run"], ["--post-ln"]), (["run"], ["--deepnorm"]), (["run"], ["--norm", "rmsnorm"]),
    (["run"], ["--ffn", "relu"]), (["run"], ["--eps", "0.5"]), (["run"], ["--no-bias"]), (["run"], ["--d-ff", "8"]),
    (["run"], ["--batch", "2"]), (["run"], ["--seq-len", "3"]), (["run"], ["--lang", "zh"]),
    (["run"], ["--format", "grid"]), (["run"], ["--explain"]), (["run"], ["--values", "2"]),
    (["run", "--values", "2"], ["--token-index", "1"]), (["run"], ["--dtype", "float64"]),
    (["run"], ["--layers", "2"]), (["run", "--layers", "2"], ["--block-steps"]), (["run"], ["--grad"]),
    (["run", "--grad"], ["--batches", "2"]), (["run", "--post-ln", "--explain"], ["--deepnorm"]),
    (["run", "--weights", str(GPT2), "--token-ids", "1", "2"], ["--layer", "1"]),
    (["run", "--module", MODULE], ["--seed", "2"]), (["run", "--module", MODULE], ["--dtype", "float64"]),
    (["run", "--module", MODULE], ["--no-causal"]),
    (["check", "--module", "examples.tutorial_block:forgot_residual"], ["--json"]),
    (["compare", "--pre-ln", "--post-ln"], ["--layers", "2"]),
    (["compare", "--gelu", "--swiglu", "--weights", str(GPT2), "--token-ids", "1", "2"], ["--seed", "2"]),
    (["compare", "--pre-ln", "--post-ln", "--layers", "2"], ["--block-steps"]),
    (["compare", "--pre-ln", "--post-ln", "--layers", "2", "--block-steps"], ["--lang", "zh"]),
    (["compare", "--pre-ln", "--post-ln"], ["--lang", "zh"]), (["compare", "--pre-ln", "--post-ln"], ["--explain"]),
    (["check", "--weights", str(GPT2), "--token-ids", "1", "2", "3"], ["--format", "github"]),
    (["run", "--check", "--weights", str(GPT2), "--token-ids", "1", "2", "3"], ["--format", "github"]),
]


@pytest.mark.parametrize("base, extra", HONOURED, ids=[" ".join(b[:1] + e) for b, e in HONOURED])
def test_every_option_changes_the_output_or_is_refused(invoke, base, extra, monkeypatch):
    monkeypatch.chdir(ROOT)
    without, with_option = invoke(*base), invoke(*base, *extra)
    assert without.exit_code in (0, 1), without.output
    assert with_option.exit_code == 2 or with_option.stdout != without.stdout, extra


def test_json_is_strict_even_when_statistics_are_infinite(invoke, tmp_path):
    x = torch.randn(3, 16)
    x[0, 0] = float("inf")
    save_file({"x": x}, str(tmp_path / "x.safetensors"))
    report = strict_json(invoke("run", "--input", str(tmp_path / "x.safetensors"), "--json").stdout)
    assert report["input"]["stats"]["max"] is None
    assert {"path": "$.input.stats.max", "value": "inf"} in report["non_finite"]


# --- 9. words -----------------------------------------------------------------------------------

def test_deepnorm_explains_deepnorm_and_post_ln_norm2_is_true_to_learned_gains(invoke):
    deep = invoke("run", "--deepnorm", "--explain").stdout
    assert "α·x" in deep and "only attention sees x_norm1" not in deep
    post = invoke("run", "--post-ln", "--explain").stdout
    assert "always has unit scale" not in post and "before the learned gain" in post


def test_no_seed_file_names_reach_the_user(invoke, monkeypatch):
    monkeypatch.chdir(ROOT)
    text = invoke("check", "--module", "examples.tutorial_block:forgot_residual").stdout
    assert "residual_not_added" in text and "seed 0" not in text


def test_bare_blocktrace_prints_help_and_h_is_help(invoke):
    bare = invoke()
    assert bare.exit_code == 0 and bare.stdout.startswith("Usage: ") and "Commands:" in bare.stdout
    assert bare.stderr == ""
    for args in (["-h"], ["run", "-h"], ["check", "-h"]):
        result = invoke(*args)
        assert result.exit_code == 0 and "Usage:" in result.stdout


def test_help_texts_say_what_each_option_does(invoke):
    run_help = invoke("run", "--help").stdout
    assert "--norm [layernorm|rmsnorm]" in run_help and "RMSNorm" in run_help
    compare_help = " ".join(invoke("compare", "--help").stdout.split())
    assert "--force Let --plot / --html overwrite" in compare_help and "--save" not in compare_help
    check_help = invoke("check", "--help").stdout
    assert "With --check" not in check_help and "--fail-on" in check_help


# --- 10. the suite itself -----------------------------------------------------------------------

def test_test_modules_do_not_import_each_other():
    """So the suite runs under --import-mode=importlib and from any directory."""
    for path in (ROOT / "tests").glob("test_*.py"):
        if path.name == Path(__file__).name:
            continue  # this test spells the imports it looks for
        text = path.read_text(encoding="utf-8")
        assert "from conftest" not in text and "import conftest" not in text, path.name
        assert not any(line.lstrip().startswith(("from test_", "import test_")) for line in text.splitlines()), path.name


def test_module_leaves_sys_path_and_sys_modules_as_they_were(invoke, tmp_path, monkeypatch):
    block = ("import torch\nfrom torch import nn\n"
             "class B(nn.Module):\n"
             "    def __init__(self, scale):\n"
             "        super().__init__()\n"
             "        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)\n"
             "        self.attn, self.ffn = nn.Linear(16, 16), nn.Linear(16, 16)\n"
             "        self.scale = scale\n"
             "    def forward(self, x):\n"
             "        x = x + self.attn(self.ln1(x))\n"
             "        return x + self.scale * self.ffn(self.ln2(x))\n"
             "def make():\n"
             "    torch.manual_seed(0)\n"
             "    return B({scale})\n")
    outputs = []
    for name, scale in (("one", 1.0), ("two", 5.0)):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "ub.py").write_text(block.replace("{scale}", str(scale)))
        monkeypatch.chdir(directory)
        path_before = list(sys.path)
        outputs.append(invoke("run", "--module", "ub:make", "--json"))
        assert sys.path == path_before and "ub" not in sys.modules
    first, second = (strict_json(r.stdout)["steps"][-1]["stats"]["rms"] for r in outputs)
    assert first != second  # the second directory's own block, not the cached first one


def test_module_keeps_the_packages_of_a_virtual_environment_below_the_working_directory(invoke, tmp_path,
                                                                                       monkeypatch):
    """Once: run from a project holding its .venv, --module forgot transformers' own modules (they live below
    the working directory too) and the next import of them crashed."""
    packages = tmp_path / ".venv" / "lib" / "site-packages"
    (packages / "venvpkg").mkdir(parents=True)
    (packages / "venvpkg" / "__init__.py").write_text("from torch import nn\nmake = lambda: nn.Identity()\n")
    (tmp_path / "userblock_v.py").write_text(
        "import torch\nfrom torch import nn\nimport venvpkg\n"
        "class B(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.ln1, self.ln2 = nn.LayerNorm(16), nn.LayerNorm(16)\n"
        "        self.attn, self.ffn = nn.Linear(16, 16), nn.Linear(16, 16)\n"
        "        self.extra = venvpkg.make()\n"
        "    def forward(self, x):\n"
        "        x = x + self.attn(self.ln1(x))\n"
        "        return x + self.ffn(self.ln2(x))\n"
        "def make():\n"
        "    return B()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(packages))
    monkeypatch.delitem(sys.modules, "venvpkg", raising=False)
    assert invoke("run", "--module", "userblock_v:make", "--json").exit_code == 0
    assert "venvpkg" in sys.modules and "userblock_v" not in sys.modules
    sys.modules.pop("venvpkg")


def test_a_plot_that_cannot_be_drawn_leaves_no_trace_file_behind(invoke, tmp_path):
    trace, plot = tmp_path / "a.safetensors", tmp_path / "b.png"
    one_error_line(invoke("run", "--seq-len", "200", "--save", str(trace), "--plot", str(plot)), 2,
                   "--plot draws heatmaps for up to 16 tokens")
    assert not trace.exists() and not plot.exists()


@pytest.mark.parametrize("flag", ["--pre-ln", "--post-ln", "--deepnorm", "--sandwich", "--reordered"])
def test_every_wiring_flag_is_refused_for_a_module_block_without_step_names(invoke, flag):
    """Once --reordered was accepted and ignored with --module (the rule listed the other four flags by hand)."""
    one_error_line(invoke("run", "--module", MODULE, flag), 2, flag, "a --module block has its own")


def test_a_document_kind_is_one_module_that_show_and_the_options_read(monkeypatch, capsys):
    """render/documents: --json is json_document.py's DOCUMENT; show renders whichever document the options chose,
    and two documents at once are refused (a kind added as a module of that package gets its flag the same way)."""
    import blocktrace.render.documents as documents
    from blocktrace.cli.app import show
    from blocktrace.cli.options import DOCUMENT_OPTIONS
    from blocktrace.errors import UsageError

    assert [f.flag for f in documents.DOCUMENTS] == ["--json"] and documents.DOCUMENTS[0].parameter == "as_json"
    assert documents.DOCUMENTS[0].render.__module__ == "blocktrace.render.documents.json_document"

    @DOCUMENT_OPTIONS
    def command(**params):
        return params

    assert [p.opts for p in command.__click_params__] == [["--json"]]
    shouting = documents.Document("--shout", "Every key in capitals.", lambda report: str(sorted(report)).upper())
    monkeypatch.setattr(documents, "DOCUMENTS", [*documents.DOCUMENTS, shouting])
    show({"kind": "block"}, {"as_shout": True}, lambda: "the tables")
    assert capsys.readouterr().out == "['KIND']\n"
    show({"kind": "block"}, {}, lambda: "the tables")
    assert capsys.readouterr().out == "the tables"
    with pytest.raises(UsageError, match="--json and --shout each print the whole report: choose one"):
        show({"kind": "block"}, {"as_json": True, "as_shout": True}, lambda: "")


def test_the_weights_help_names_every_family_and_every_kind_of_file(invoke):
    """--weights' help listed ten safetensors families while .pt files and MoE checkpoints worked; a family added
    without its name in the help fails here."""
    from blocktrace.sources.families import FAMILIES

    shown = {"gpt2": "GPT-2", "bert": "BERT", "gpt_neox": "GPT-NeoX", "llama": "Llama", "mistral": "Mistral",
             "qwen2": "Qwen2/3", "qwen3": "Qwen2/3", "qwen2_moe": "Qwen-MoE", "qwen3_moe": "Qwen-MoE",
             "mixtral": "Mixtral", "olmo2": "OLMo-2/3", "olmo3": "OLMo-2/3", "olmoe": "OLMoE", "gemma": "Gemma 1–3",
             "gemma2": "Gemma 1–3", "gemma3": "Gemma 1–3", "phi3": "Phi-3", "starcoder2": "StarCoder2",
             "granite": "Granite", "smollm3": "SmolLM3", "exaone4": "EXAONE-4", "cohere": "Cohere 1–2",
             "cohere2": "Cohere 1–2", "gpt_oss": "gpt-oss", "deepseek_v2": "DeepSeek-V2/V3",
             "deepseek_v3": "DeepSeek-V2/V3", "llama4_text": "Llama-4", "nanogpt": "nanoGPT"}
    assert set(shown) == set(FAMILIES)
    text = " ".join(invoke("run", "--help").stdout.split())
    for name in {*shown.values(), ".pt", "sharded index", "HuggingFace cache"}:
        assert name in text, name
