"""Tensors are allowed, not denied (sources/checkpoint.READ_DTYPES): a weight stored as float32/64, float16 or
bfloat16 is read, float8 is read upcast with a note, and every other kind is refused by name before any conversion,
from a .pt and a .safetensors file alike. One name, one tensor: keys that map to the same name are read once when
equal and refused, naming both, when not."""

from __future__ import annotations

import json

import pytest
import torch
from nanogpt import GPTConfig, randomised
from safetensors.torch import save_file

IDS = ["5", "17", "9", "0", "42"]
TARGET = "transformer.h.1.attn.c_attn.weight"


def _nano_pt(path, change=None, prefix=False):
    model = randomised(GPTConfig(), seed=5)
    state = model.state_dict()
    if change is not None:
        state = change(dict(state))
    torch.save({"model": {f"_orig_mod.{k}" if prefix else k: v for k, v in state.items()},
                "model_args": {k: v for k, v in vars(model.config).items() if k != "dropout"}, "iter_num": 10}, path)
    return path


def _one_error(result, *words):
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


KINDS = {
    "uint16": lambda t: t.to(torch.uint16), "uint32": lambda t: t.to(torch.uint32), "int32": lambda t: t.to(torch.int32),
    "bool": lambda t: t > 0, "complex": lambda t: torch.complex(t, t), "sparse": lambda t: t.to_sparse(),
    "quantized": lambda t: torch.quantize_per_tensor(t, 0.01, 0, torch.qint8),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_weight_of_any_other_kind_is_refused_by_name_from_a_pt_file(invoke, tmp_path, kind):
    path = _nano_pt(tmp_path / "ckpt.pt", lambda state: {**state, TARGET: KINDS[kind](state[TARGET])})
    _one_error(invoke("check", "--weights", str(path), "--token-ids", *IDS), TARGET, "stored as", "float32")


@pytest.mark.parametrize("dtype, name", [(torch.uint16, "U16"), (torch.uint32, "U32"), (torch.int64, "I64")])
def test_unsigned_and_wide_integers_are_refused_from_safetensors_too(invoke, tmp_path, dtype, name):
    state = randomised(GPTConfig(), seed=5).state_dict()
    state = {k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}
    state[TARGET] = state[TARGET].to(dtype)
    save_file(state, str(tmp_path / "model.safetensors"))
    _one_error(invoke("check", "--weights", str(tmp_path), "--heads", "4", "--token-ids", *IDS), TARGET,
               f"stored as {name}")


def test_float8_weights_are_read_upcast_and_said_so(invoke, tmp_path):
    """float8 holds values exactly representable in float32: the trace equals the float32 copy's, and a note says
    the model computes in the wider format."""
    model = randomised(GPTConfig(), seed=5)
    state = {k: v.to(torch.float8_e4m3fn).float() for k, v in model.state_dict().items()}  # float8's own values
    wide = _nano_pt(tmp_path / "wide.pt", lambda _: dict(state))
    narrow = _nano_pt(tmp_path / "narrow.pt", lambda _: {k: v.to(torch.float8_e4m3fn) for k, v in state.items()})
    reports = [json.loads(invoke("check", "--weights", str(p), "--token-ids", *IDS, "--json").stdout)
               for p in (wide, narrow)]
    assert reports[1]["loss"] == pytest.approx(reports[0]["loss"], rel=1e-6)
    assert any("F8_E4M3" in note and "upcast" in note for note in reports[1]["notes"])


def test_two_copies_of_the_model_under_a_wrapper_prefix_and_without_are_refused_when_they_differ(invoke, tmp_path):
    model = randomised(GPTConfig(), seed=5)
    state = model.state_dict()
    changed = {f"_orig_mod.{k}": (v + 1 if k == TARGET else v) for k, v in state.items()}
    torch.save({"model": {**state, **changed}, "model_args": {"n_layer": 3, "n_head": 4, "n_embd": 32,
                                                              "block_size": 64, "vocab_size": 96}}, tmp_path / "c.pt")
    _one_error(invoke("check", "--weights", str(tmp_path / "c.pt"), "--token-ids", *IDS), TARGET,
               f"_orig_mod.{TARGET}", "different values")
    same = {f"_orig_mod.{k}": v for k, v in state.items()}
    torch.save({"model": {**state, **same}, "model_args": {"n_layer": 3, "n_head": 4, "n_embd": 32, "block_size": 64,
                                                           "vocab_size": 96}}, tmp_path / "same.pt")
    report = json.loads(invoke("check", "--weights", str(tmp_path / "same.pt"), "--token-ids", *IDS, "--json").stdout)
    assert any("duplicates" in note and "read once" in note for note in report["notes"])


def test_layers_under_two_model_prefixes_are_refused_when_they_differ(invoke, tmp_path):
    from helpers import make_gpt2

    model = make_gpt2(head=True)
    state = {k: v.clone().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    bare = {k[len("transformer."):]: v.clone() for k, v in state.items() if k.startswith("transformer.h.")}
    bare["h.0.attn.c_attn.weight"] += 1
    save_file({**state, **bare}, str(tmp_path / "model.safetensors"))
    model.config.to_json_file(tmp_path / "config.json")
    _one_error(invoke("check", "--weights", str(tmp_path), "--token-ids", *IDS), "h.0.attn.c_attn.weight",
               "transformer.h.0.attn.c_attn.weight", "different values")


def test_a_lightning_model_prefix_is_removed_with_a_config_beside_it_too(invoke, tmp_path):
    from helpers import make_gpt2

    model = make_gpt2(head=False)
    save_file({f"model.{k}": v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "model.safetensors"))
    model.config.to_json_file(tmp_path / "config.json")
    report = json.loads(invoke("check", "--weights", str(tmp_path), "--token-ids", *IDS, "--json").stdout)
    assert report["weights"]["family"] == "gpt2"
    assert any("'model.'" in note for note in report["notes"])


def test_model_arguments_naming_a_family_whose_layers_are_missing_are_not_called_config_json(invoke, tmp_path):
    torch.save({"model": {"wte.weight": torch.zeros(4, 2)}, "model_args": {"model_type": "llama"}}, tmp_path / "c.pt")
    result = invoke("check", "--weights", str(tmp_path / "c.pt"), "--token-ids", "1")
    _one_error(result, "the model arguments stored in the file say model_type 'llama'")
    assert "config.json" not in result.output


@pytest.mark.parametrize("protocol", [4, 5])
def test_a_legacy_file_at_pickle_protocol_4_or_5_is_one_line_naming_the_format(invoke, tmp_path, protocol):
    path = tmp_path / "legacy.pt"
    torch.save({"model": {"h.0.ln_1.weight": torch.ones(4)}}, path, _use_new_zipfile_serialization=False,
               pickle_protocol=protocol)
    result = invoke("inspect", str(path))
    _one_error(result, f"pickle protocol {protocol}", "legacy (non-zip) format")
    assert "Warning" not in result.output


@pytest.mark.parametrize("suffix", [".PT", ".Pth", ".BIN"])
def test_a_torch_files_suffix_is_read_in_any_case(invoke, tmp_path, suffix):
    path = _nano_pt(tmp_path / f"ckpt{suffix}")
    result = invoke("check", "--weights", str(tmp_path), "--token-ids", *IDS, "--json")
    assert result.exit_code in (0, 1), result.output
    assert path.name in " ".join(json.loads(result.stdout)["notes"])


def test_rows_come_back_in_the_order_asked_repeats_included(tmp_path):
    """An embedding lookup reads only the rows its ids name (each distinct row once) and returns one per id."""
    from blocktrace.sources.checkpoint import Checkpoint

    table = torch.arange(40.0).reshape(10, 4)
    save_file({"wte.weight": table}, tmp_path / "model.safetensors")
    ids = [7, 2, 7, 7, 0, 2]
    assert torch.equal(Checkpoint(tmp_path / "model.safetensors").get("wte.weight", torch.float32, rows=ids),
                       table[ids])
