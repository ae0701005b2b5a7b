"""Property-based tests of the bad-input contract: generated option combinations and corrupted
safetensors, config.json and tokenizer.json files. Whatever comes in, blocktrace exits 0, 1
or 2, never with a traceback, and never changes a file that existed before (unless --force
names it)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import ROOT, SAMPLES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from blocktrace.cli import cli

FUZZ = settings(max_examples=40, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args), catch_exceptions=True)


def assert_contract(result) -> None:
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output)
    if result.exception is not None:
        assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code != 0 and result.stderr:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr


def digests(directory: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir() if p.is_file()}


# Small values only: the point is the combinations, not the sizes.
VALUE_OPTIONS = {
    "--d-model": st.sampled_from(["4", "8", "6", "0", "x"]),
    "--heads": st.sampled_from(["1", "2", "3", "-1"]),
    "--d-ff": st.sampled_from(["4", "16"]),
    "--seq-len": st.sampled_from(["1", "3", "0"]),
    "--batch": st.sampled_from(["1", "2"]),
    "--seed": st.sampled_from(["0", "7", "-3", "99999999999999999999"]),
    "--init": st.sampled_from(["default", "xavier", "xiong", "bogus"]),
    "--norm": st.sampled_from(["layernorm", "rmsnorm"]),
    "--ffn": st.sampled_from(["gelu", "gelu_tanh", "relu", "swiglu"]),
    "--eps": st.sampled_from(["1e-5", "0", "nan", "0.5"]),
    "--layers": st.sampled_from(["1", "2", "2,3", "0", "a"]),
    "--batches": st.sampled_from(["1", "2"]),
    "--values": st.sampled_from(["1", "3"]),
    "--token-index": st.sampled_from(["0", "2", "-1", "9"]),
    "--lang": st.sampled_from(["en", "zh", "fr"]),
    "--format": st.sampled_from(["simple", "grid", "github"]),
    "--fail-on": st.sampled_from(["warning", "error"]),
    "--attn-chunk": st.sampled_from(["1", "2"]),
    "--dtype": st.sampled_from(["float32", "float64", "bfloat16"]),
    "--tokens": st.sampled_from(["猫 吃 鱼", "a", "x y z w"]),
    "--token-ids": st.sampled_from(["1 2 3", "1 / 2 3", "999"]),
    "--layer": st.sampled_from(["0", "1", "7"]),
    "--text": st.sampled_from(["猫 吃 鱼", ""]),
    "--step-names": st.sampled_from(['{"norm1": "ln1"}', "[1]", "{"]),
}
FLAG_OPTIONS = ["--post-ln", "--pre-ln", "--deepnorm", "--no-causal", "--no-bias", "--grad", "--block-steps", "--json",
                "--explain", "--check", "--force"]
PATH_OPTIONS = ["--weights", "--module", "--save", "--plot", "--input"]


def _path_value(option: str, index: int, tmp: Path) -> str:
    return {
        "--weights": [str(SAMPLES / "gpt2-tiny"), str(SAMPLES / "llama-tiny"), str(tmp / "missing")][index % 3],
        "--module": ["examples.tutorial_block:healthy", "examples.tutorial_block:nope", "nope"][index % 3],
        "--save": [str(tmp / "existing.safetensors"), str(tmp / "new.safetensors"), str(tmp)][index % 3],
        "--plot": [str(tmp / "existing.safetensors"), str(tmp / "new.png")][index % 2],
        "--input": [str(tmp / "existing.safetensors"), str(SAMPLES / "traces" / "layer1.safetensors")][index % 2],
    }[option]


@st.composite
def option_lists(draw, tmp: Path):
    chosen = draw(st.lists(st.sampled_from([*VALUE_OPTIONS, *FLAG_OPTIONS, *PATH_OPTIONS]), max_size=5, unique=True))
    args = []
    for option in chosen:
        args.append(option)
        if option in VALUE_OPTIONS:
            args.append(draw(VALUE_OPTIONS[option]))
        elif option in PATH_OPTIONS:
            args.append(_path_value(option, draw(st.integers(0, 5)), tmp))
    return args


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # --module examples.* resolves from the repository
    (tmp_path / "existing.safetensors").write_bytes(b"a file the user already had")
    return tmp_path


@pytest.mark.parametrize("command", ["run", "check"])
def test_generated_option_combinations_keep_the_contract(workspace, command):
    @FUZZ
    @given(args=option_lists(workspace))
    def check(args):
        if command == "check":
            args = [a for a in args if a not in ("--block-steps", "--explain", "--check")]
        before = digests(workspace)
        result = invoke(command, *args)
        assert_contract(result)
        if "--force" not in args:
            assert {name: digest for name, digest in digests(workspace).items() if name in before} == before
    check()


@FUZZ
@given(axis=st.sampled_from([["--pre-ln", "--post-ln"], ["--layernorm", "--rmsnorm"], ["--relu", "--swiglu"],
                             ["--pre-ln"], ["--gelu", "--rmsnorm"]]),
       extra=st.lists(st.sampled_from(["--layers 2", "--block-steps", "--json", "--grad", "--lang zh", "--norm rmsnorm",
                                       "--placement post", "--d-model 8", "--heads 3", "--layers 2,3", "--seed 3",
                                       f"--weights {SAMPLES / 'gpt2-tiny'} --token-ids 1 2", "--init xiong"]),
                      max_size=3, unique=True))
def test_generated_compare_combinations_keep_the_contract(axis, extra):
    assert_contract(invoke("compare", *axis, *" ".join(extra).split()))


def _checkpoint_copy(tmp: Path) -> Path:
    target = tmp / "ckpt"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(SAMPLES / "gpt2-tiny", target)
    return target


@FUZZ
@given(cut=st.integers(0, 3000), flips=st.lists(st.tuples(st.integers(0, 3000), st.integers(0, 255)), max_size=6),
       header_length=st.one_of(st.none(), st.integers(0, 2**64 - 1)))
def test_corrupted_safetensors_keep_the_contract(tmp_path_factory, cut, flips, header_length):
    target = _checkpoint_copy(tmp_path_factory.mktemp("st"))
    data = bytearray((target / "model.safetensors").read_bytes())
    for position, value in flips:
        data[position % len(data)] = value
    if header_length is not None:
        data[:8] = header_length.to_bytes(8, "little")
    if cut:
        data = data[: len(data) - cut]
    (target / "model.safetensors").write_bytes(bytes(data))
    before = digests(target)
    assert_contract(invoke("run", "--weights", str(target), "--token-ids", "1", "2"))
    assert_contract(invoke("inspect", str(target)))
    assert digests(target) == before


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False)
                           | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
CONFIG_KEYS = ["n_embd", "n_head", "n_inner", "n_layer", "n_positions", "layer_norm_epsilon", "activation_function",
               "model_type", "vocab_size", "scale_attn_weights", "pad_token_id", "rope_theta", "rope_scaling"]


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON_VALUES, min_size=1, max_size=3),
       whole=st.one_of(st.none(), JSON_VALUES))
def test_corrupted_config_json_keeps_the_contract(tmp_path_factory, changes, whole):
    target = _checkpoint_copy(tmp_path_factory.mktemp("cfg"))
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config if whole is None else whole))
    before = digests(target)
    for args in (["run", "--weights", str(target), "--token-ids", "1", "2"], ["inspect", str(target)],
                 ["compare", "--pre-ln", "--post-ln", "--weights", str(target), "--token-ids", "1"]):
        assert_contract(invoke(*args))
    assert digests(target) == before


@FUZZ
@given(content=st.one_of(st.binary(max_size=200), JSON_VALUES.map(json.dumps),
                         st.sampled_from(['{"model": {"type": "WordLevel", "vocab": {}, "unk_token": "x"}}',
                                          '{"version": "1.0", "model": null}'])))
def test_corrupted_tokenizer_json_keeps_the_contract(tmp_path_factory, content):
    target = _checkpoint_copy(tmp_path_factory.mktemp("tok"))
    path = target / "tokenizer.json"
    path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    for args in (["--text", "猫 吃 鱼"], ["--token-ids", "1", "2"]):
        assert_contract(invoke("run", "--weights", str(target), *args))


@st.composite
def valid_run_arguments(draw, command: str) -> list[str]:
    """Options of `run`/`check` on a random block that go together (cli/rules.py), with values that are valid:
    each example must reach the pipeline and finish (exit 0, or 1 for findings), never stop at parsing."""
    d_model = draw(st.sampled_from([4, 8, 12]))
    args = ["--d-model", str(d_model), "--heads", str(draw(st.sampled_from([h for h in (1, 2, 4) if d_model % h == 0])))]
    tokens = draw(st.sampled_from([["--seq-len", "1"], ["--seq-len", "5"], ["--tokens", "猫", "吃", "鱼"]]))
    args += tokens
    n_tokens = 3 if tokens[0] == "--tokens" else int(tokens[1])
    for option, values in {"--batch": ["1", "2"], "--seed": ["0", "7"], "--init": ["default", "xavier", "xiong"],
                           "--norm": ["layernorm", "rmsnorm"], "--ffn": ["gelu", "gelu_tanh", "relu", "swiglu"],
                           "--eps": ["1e-5", "0.5"], "--attn-chunk": ["1", "2"], "--dtype": ["float32", "float64"]}.items():
        if draw(st.booleans()):
            args += [option, draw(st.sampled_from(values))]
    args += draw(st.sampled_from([[], ["--pre-ln"], ["--post-ln"], ["--deepnorm"]]))
    args += [flag for flag in ("--no-causal", "--no-bias") if draw(st.booleans())]
    depth = draw(st.sampled_from([None, 2, 3]))
    if depth is not None:
        args += ["--layers", str(depth)]
    if draw(st.booleans()):
        args += ["--grad"] + (["--batches", "2"] if tokens[0] == "--seq-len" and draw(st.booleans()) else [])
    checking = command == "check" or draw(st.booleans())
    output = draw(st.sampled_from(["json", "text"]))
    if output == "json":
        args.append("--json")
    elif not checking:  # check and run --check print only the findings: no table to shape
        args += ["--format", draw(st.sampled_from(["simple", "github", "grid"])),
                 "--lang", draw(st.sampled_from(["en", "zh"]))]
        args += ["--block-steps"] if depth is not None and draw(st.booleans()) else []
        args += ["--explain"] if draw(st.booleans()) else []
        if depth is None and draw(st.booleans()):
            args += ["--values", "2", "--token-index", str(draw(st.integers(-n_tokens, n_tokens - 1)))]
    if command == "run" and checking:
        args += ["--check", "--fail-on", draw(st.sampled_from(["warning", "error"]))]
    return args


@pytest.mark.parametrize("command", ["run", "check"])
def test_valid_option_combinations_reach_the_pipeline_and_finish(command):
    @FUZZ
    @given(args=valid_run_arguments(command))
    def check(args):
        result = invoke(command, *args)
        assert result.exit_code in (0, 1), (args, result.output)
        assert result.exit_code == 0 or command == "check" or "--check" in args, (args, result.output)
    check()
