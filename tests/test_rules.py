"""blocktrace/cli/rules.py: no option is accepted and ignored — each either changes the output or is refused by
name, beside --json, --check, --module and the wirings alike."""
from __future__ import annotations

import sys

import pytest
import torch
from helpers import GPT2, ROOT, SAMPLES, one_error_line, strict_json
from safetensors.torch import save_file
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

@pytest.mark.parametrize("flag", ["--pre-ln", "--post-ln", "--deepnorm", "--sandwich", "--reordered"])
def test_every_wiring_flag_is_refused_for_a_module_block_without_step_names(invoke, flag):
    """Once --reordered was accepted and ignored with --module (the rule listed the other four flags by hand)."""
    one_error_line(invoke("run", "--module", MODULE, flag), 2, flag, "a --module block has its own")
