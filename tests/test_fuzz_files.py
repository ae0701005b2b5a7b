"""Property tests for what blocktrace reads and every number it takes: random types, nesting and NaN in
timelines, config.json and trace metadata; huge and non-finite numbers in every numeric option; FIFOs and
symbolic links as every input and output. The contract each time: a result or one `Error:` line with
exit 2 — never a traceback, a hang or a file written where it should not be.

Hypothesis draws new inputs on every local run; CI fixes the seed (conftest.py's profile)."""

from __future__ import annotations

import json
import os
import shutil
import threading

import click
import pytest
from helpers import SAMPLES, watched_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from blocktrace.cli import cli

GPT2 = SAMPLES / "gpt2-tiny"
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-10**30, max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(["nan", "inf", "-inf", "", "error", "x" * 50]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


def _keeps_the_contract(result) -> None:
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr


@pytest.fixture(scope="module")
def timeline(tmp_path_factory) -> list[dict]:
    return watched_records(tmp_path_factory.mktemp("fuzz") / "run.jsonl", seed=1)


def _paths(value, prefix=()):
    """Every place inside a JSON value, as a tuple of keys and indices."""
    yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, (*prefix, key))


def _replaced(value, path, new):
    if not path:
        return new
    copy = json.loads(json.dumps(value))
    target = copy
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = new
    return copy


@FUZZ
@given(data=st.data())
def test_any_field_of_a_timeline_replaced_by_anything(invoke, tmp_path, timeline, data):
    places = list(_paths(timeline[1]))
    place = data.draw(st.sampled_from(places))
    broken = _replaced(timeline[1], place, data.draw(JSON_VALUES))
    path = tmp_path / "fuzzed.jsonl"
    path.write_text(json.dumps(timeline[0]) + "\n" + json.dumps(broken) + "\n")  # NaN as JSON's NaN literal too
    for args in ([], ["--json"], ["--brief"]):
        _keeps_the_contract(invoke("track", str(path), *args))


CONFIG_KEYS = ["n_embd", "n_head", "n_layer", "n_positions", "vocab_size", "layer_norm_epsilon", "activation_function",
               "model_type", "n_inner", "pad_token_id", "tie_word_embeddings", "scale_attn_weights"]


@FUZZ
@given(key=st.sampled_from(CONFIG_KEYS), value=JSON_VALUES)
def test_any_config_value(invoke, tmp_path, key, value):
    weights = tmp_path / "w"
    if not weights.exists():
        shutil.copytree(GPT2, weights)
    config = json.loads((GPT2 / "config.json").read_text())
    config[key] = value
    (weights / "config.json").write_text(json.dumps(config))
    _keeps_the_contract(invoke("check", "--weights", str(weights), "--token-ids", "1", "2"))


@FUZZ
@given(field=st.sampled_from(["step_order", "config", "tokens", "layout", "placement"]), value=JSON_VALUES)
def test_any_trace_metadata(invoke, tmp_path, field, value):
    path = tmp_path / "t.safetensors"
    if not path.exists():
        assert invoke("run", "--seq-len", "3", "--save", str(path)).exit_code == 0
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        metadata = dict(handle.metadata())
    metadata[field] = json.dumps(value)
    broken = tmp_path / "broken.safetensors"
    save_file(tensors, str(broken), metadata=metadata)
    _keeps_the_contract(invoke("diff", str(broken), str(path)))


HUGE = ["100000000000000000000000", "-100000000000000000000000", "1e400", "nan", "-0", "0"]
BASES = {"run": ["--seq-len", "3"], "compare": ["--pre-ln", "--post-ln", "--seq-len", "3"],
         "check": ["--seq-len", "3"], "inspect": [str(GPT2)],
         "track": [str(SAMPLES / "nanogpt" / "ckpt_0000.pt"), "--token-ids", "1"]}


def _numeric_options():
    for name, base in BASES.items():
        for option in cli.commands[name].params:
            if isinstance(option, click.Option) and not option.is_flag and isinstance(
                    option.type, (click.types.IntParamType, click.types.FloatParamType)) or (
                    isinstance(option, click.Option) and getattr(option.type, "name", "") in ("float", "N[,N...]")):
                yield name, base, option.opts[0]


@pytest.mark.parametrize("command, base, option", list(_numeric_options()), ids=lambda v: v if isinstance(v, str) else "")
def test_huge_and_non_finite_numbers_in_every_numeric_option(invoke, command, base, option):
    for value in HUGE:
        done = []
        worker = threading.Thread(target=lambda: done.append(invoke(command, *base, option, value)), daemon=True)
        worker.start()
        worker.join(timeout=60)
        assert done, f"{command} {option} {value} did not return within 60 s"
        _keeps_the_contract(done[0])


def _fifo(tmp_path, name: str):
    path = tmp_path / name
    os.mkfifo(path)
    return str(path)


def _link(tmp_path, name: str, target):
    path = tmp_path / name
    path.symlink_to(target)
    return str(path)


SPECIAL_INPUTS = [  # (command line with {p} for the special file's path, its file name)
    (["run", "--input", "{p}"], "x.safetensors"),
    (["run", "--weights", "{p}", "--token-ids", "1"], "model.safetensors"),
    (["check", "--weights", str(GPT2), "--text-file", "{p}"], "t.txt"),
    (["check", "--weights", str(GPT2), "--token-ids-file", "{p}"], "ids.bin"),
    (["run", "--module", "{p}"], "block.py"),
    (["track", "{p}"], "run.jsonl"),
    (["track", str(SAMPLES / "nanogpt" / "ckpt_0000.pt"), "--token-ids", "1", "--log", "{p}"], "log.jsonl"),
    (["inspect", "{p}"], "model.safetensors"),
    (["diff", "{p}", "{p}"], "t.safetensors"),
]


@pytest.mark.parametrize("args, name", SPECIAL_INPUTS, ids=[a[0] + " " + n for a, n in SPECIAL_INPUTS])
def test_a_fifo_as_any_input_is_refused_without_blocking(invoke, tmp_path, args, name):
    path = _fifo(tmp_path, name)
    done = []
    worker = threading.Thread(target=lambda: done.append(invoke(*[a.replace("{p}", path) for a in args])), daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert done, f"{' '.join(args)} blocked on a FIFO"
    assert done[0].exit_code == 2 and done[0].stderr.startswith("Error: "), done[0].output


SPECIAL_OUTPUTS = [
    ["run", "--seq-len", "3", "--save", "{p}"],
    ["run", "--seq-len", "3", "--plot", "{p}"],
    ["compare", "--pre-ln", "--post-ln", "--layers", "2", "--plot", "{p}"],
    ["track", str(SAMPLES / "nanogpt" / "ckpt_0000.pt"), "--token-ids", "1", "--out", "{p}"],
]


@pytest.mark.parametrize("args", SPECIAL_OUTPUTS, ids=[" ".join(a[:1] + a[-2:-1]) for a in SPECIAL_OUTPUTS])
@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_fifo_or_symlink_as_any_output_is_never_written_through(invoke, tmp_path, args, kind):
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    suffix = ".png" if "--plot" in args else ".jsonl" if "--out" in args else ".safetensors"
    path = _fifo(tmp_path, "out" + suffix) if kind == "fifo" else _link(tmp_path, "out" + suffix, precious)
    for force in ([], ["--force"]):
        result = invoke(*[a.replace("{p}", path) for a in args], *force)
        assert result.exit_code == 2 and result.stderr.startswith("Error: "), result.output
    assert precious.read_text() == "keep"


CHECKPOINT_FUZZ = settings(FUZZ, max_examples=8)  # each example writes and checks a whole checkpoint


TENSOR_KINDS = {  # how a weight may be stored in a .pt, and whether blocktrace reads it (READ_DTYPES)
    "float32": (lambda t: t, True), "float64": (lambda t: t.double(), True), "float16": (lambda t: t.half(), True),
    "bfloat16": (lambda t: t.bfloat16(), True), "float8_e5m2": (lambda t: t.to(torch_dtype("float8_e5m2")), True),
    "int64": (lambda t: t.long(), False), "uint8": (lambda t: t.to(torch_dtype("uint8")), False),
    "uint16": (lambda t: t.to(torch_dtype("uint16")), False), "bool": (lambda t: t > 0, False),
    "complex64": (lambda t: t.to(torch_dtype("complex64")), False), "sparse": (lambda t: t.to_sparse(), False),
}


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


@CHECKPOINT_FUZZ
@given(kinds=st.dictionaries(st.sampled_from(["h.0.attn.c_attn.weight", "h.1.mlp.c_fc.weight", "h.0.ln_1.weight",
                                              "wte.weight"]), st.sampled_from(sorted(TENSOR_KINDS)), max_size=3))
def test_every_tensor_kind_is_read_or_refused_by_name(invoke, tmp_path_factory, kinds):
    """Any mix of stored kinds: the check reads it when every tensor's kind is one blocktrace reads, and is
    otherwise one error line naming a tensor stored in another kind — never a traceback, never a silent cast."""
    import torch
    from nanogpt import GPTConfig, randomised

    model = randomised(GPTConfig(), seed=1)
    state = model.state_dict()
    for key, kind in kinds.items():
        state[f"transformer.{key}"] = TENSOR_KINDS[kind][0](state[f"transformer.{key}"])
    path = tmp_path_factory.mktemp("kinds") / "ckpt.pt"
    torch.save({"model": state, "model_args": {"n_layer": 3, "n_head": 4, "n_embd": 32, "block_size": 64,
                                               "vocab_size": 96}}, path)
    result = invoke("check", "--weights", str(path), "--token-ids", "1", "2", "3")
    refused = sorted(key for key, kind in kinds.items() if not TENSOR_KINDS[kind][1])
    _keeps_the_contract(result)
    if refused:
        assert result.exit_code == 2 and any(key in result.stderr for key in refused), (kinds, result.output)
    else:
        assert result.exit_code in (0, 1), (kinds, result.output)


@CHECKPOINT_FUZZ
@given(duplicated=st.sets(st.sampled_from(["h.0.attn.c_attn.weight", "h.1.mlp.c_proj.bias", "ln_f.weight"]),
                          min_size=1), changed=st.sets(st.sampled_from(["h.0.attn.c_attn.weight",
                                                                        "h.1.mlp.c_proj.bias", "ln_f.weight"])))
def test_a_name_held_twice_is_read_once_when_equal_and_refused_naming_both_when_not(invoke, tmp_path_factory,
                                                                                 duplicated, changed):
    import torch
    from nanogpt import GPTConfig, randomised

    state = randomised(GPTConfig(), seed=2).state_dict()
    extra = {f"_orig_mod.transformer.{key}": state[f"transformer.{key}"] + (1 if key in changed else 0)
             for key in duplicated}
    path = tmp_path_factory.mktemp("twice") / "ckpt.pt"
    torch.save({"model": {**state, **extra}, "model_args": {"n_layer": 3, "n_head": 4, "n_embd": 32,
                                                            "block_size": 64, "vocab_size": 96}}, path)
    result = invoke("check", "--weights", str(path), "--token-ids", "1", "2", "3")
    _keeps_the_contract(result)
    differ = duplicated & changed
    if differ:
        assert result.exit_code == 2 and "different values" in result.stderr
        assert any(f"_orig_mod.transformer.{key}" in result.stderr for key in differ)
    else:
        assert result.exit_code in (0, 1), result.output
