"""The exit-code contract CI relies on: 0 clean, 1 findings only, 2 every error — a typo in a path
is never mistaken for a diverging run."""

from __future__ import annotations

from helpers import SAMPLES

import pytest

RUN = SAMPLES / "training" / "gpt2-lr-high"
EVAL = SAMPLES / "training" / "eval.txt"
GPT2 = SAMPLES / "gpt2-tiny"

ERRORS = {
    "track: a glob that matches nothing": ["track", "nothere/step_*", "--token-ids", "1"],
    "track: a checkpoint that does not exist": ["track", "nothere/step_100", "--token-ids", "1"],
    "track: an unknown option": ["track", str(RUN / "watch.jsonl"), "--no-such-option"],
    "check: a missing checkpoint": ["check", "--weights", "nothere", "--token-ids", "1"],
    "check: a layer out of range": ["check", "--weights", str(GPT2), "--layer", "9", "--token-ids", "5"],
    "check: a missing text file": ["check", "--weights", str(GPT2), "--text-file", "nothere.txt"],
    "run: a bad option value": ["run", "--heads", "0"],
    "run: heads that do not divide the width": ["run", "--d-model", "6", "--heads", "4"],
    "diff: a missing trace": ["diff", "nothere.safetensors", "nothere2.safetensors"],
    "inspect: a missing checkpoint": ["inspect", "nothere"],
}


@pytest.mark.parametrize("case", list(ERRORS))
def test_every_error_exits_2_with_one_line(invoke, case):
    result = invoke(*ERRORS[case])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr


def test_findings_exit_1_and_a_clean_run_0(invoke):
    failing = invoke("track", str(RUN / "watch.jsonl"))
    assert failing.exit_code == 1 and failing.stderr == ""
    assert invoke("track", str(RUN / "watch.jsonl"), "--fail-on", "error").exit_code == 1
    clean = invoke("check", "--weights", str(RUN / "step_0000"), "--text-file", str(EVAL), "--fail-on", "error")
    assert clean.exit_code in (0, 1)
    assert invoke("run", "--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼").exit_code == 0
    assert invoke("run", "--check", "--d-model", "4", "--heads", "2").exit_code == 0


def test_the_contract_is_in_the_help(invoke):
    text = " ".join(invoke("--help").stdout.split())
    assert "0 clean; 1 findings at --fail-on or worse" in text and "2 any error" in text
