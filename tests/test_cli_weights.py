"""`run --weights` and `inspect` end to end, and every bad checkpoint a user can hand us."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers import SAMPLES, TOKEN_IDS, bert_reference, hf_block_values, llama_reference, make_gpt2
from safetensors.torch import load_file, save_file

SAMPLE = SAMPLES / "gpt2-tiny"
STEPS = ["norm1", "attn", "residual1", "norm2", "ffn", "residual2", "attn_weights"]


def test_cli_trace_of_the_last_layer_equals_huggingface(invoke, gpt2_checkpoint, tmp_path):
    directory, hf_model = gpt2_checkpoint
    path = tmp_path / "t.safetensors"
    ids = [str(i) for i in TOKEN_IDS]
    result = invoke("run", "--weights", str(directory), "--layer", "2", "--token-ids", *ids, "--save", str(path))
    assert result.exit_code == 0, result.output
    ours = load_file(str(path))
    reference = hf_block_values(hf_model, 2, TOKEN_IDS)
    assert (ours["x"] - reference["hidden_state"][0]).abs().max() <= 1e-5
    for name in STEPS:
        assert (ours[name] - reference[name][0]).abs().max() <= 1e-5, name


def test_half_precision_checkpoints_are_computed_in_float32(invoke, tmp_path):
    model = make_gpt2(head=False).half()
    model.save_pretrained(tmp_path)
    report = json.loads(invoke("run", "--weights", str(tmp_path), "--token-ids", "1", "2", "3", "--json").stdout)
    assert {step["dtype"] for step in report["steps"]} == {"float32"}
    reference = hf_block_values(model.float(), 0, [1, 2, 3])
    assert report["steps"][-1]["stats"]["max"] == pytest.approx(reference["residual2"].max().item(), abs=1e-5)


def test_sample_checkpoint_runs_with_token_ids_and_text(invoke):
    by_ids = invoke("run", "--weights", str(SAMPLE), "--layer", "1", "--token-ids", "1", "2", "3")
    assert by_ids.exit_code == 0, by_ids.output
    assert "tokens: 猫 吃 鱼" in by_ids.stdout and "layer 1 of 0–3" in by_ids.stdout
    by_text = invoke("run", "--weights", str(SAMPLE), "--layer", "1", "--text", "猫 吃 鱼")
    assert by_text.stdout == by_ids.stdout


def test_input_file_feeds_the_exact_hidden_state(invoke, tmp_path):
    x = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(0))
    save_file({"x": x}, str(tmp_path / "x.safetensors"))
    report = json.loads(invoke("run", "--weights", str(SAMPLE), "--input", str(tmp_path / "x.safetensors"),
                               "--json").stdout)
    assert report["input"]["shape"] == [2, 4, 64]
    assert report["input"]["stats"]["max"] == pytest.approx(x.max().item())


def test_inspect_reports_family_config_and_tensors(invoke):
    report = json.loads(invoke("inspect", str(SAMPLE), "--json").stdout)
    assert (report["family"], report["n_layers"], report["config"]["n_heads"]) == ("gpt2", 4, 4)
    tensors = load_file(str(SAMPLE / "model.safetensors"))
    entry = next(t for t in report["layers"][3]["tensors"] if t["name"] == "mlp.c_fc.weight")
    assert entry["shape"] == [64, 256] and entry["dtype"] == "F32"
    assert entry["norm"] == pytest.approx(tensors["h.3.mlp.c_fc.weight"].norm().item(), rel=1e-6)
    text = invoke("inspect", str(SAMPLE)).stdout
    assert "family gpt2" in text and "h.0" not in text.splitlines()[0]


def test_sample_weights_regenerate_byte_for_byte(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_samples", SAMPLE.parent / "make_samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make_samples(tmp_path)
    for name in module.SAMPLES:  # every checkpoint folder, file by file
        for committed in sorted((SAMPLE.parent / name).iterdir()):
            assert (tmp_path / name / committed.name).read_bytes() == committed.read_bytes(), committed.name


@pytest.mark.parametrize("name, loader, reference", [
    ("gpt2-tiny", "GPT2Model", "gpt2"), ("bert-tiny", "BertModel", "bert"), ("llama-tiny", "LlamaForCausalLM", "llama"),
])
def test_sample_weights_load_in_huggingface_and_match(invoke, tmp_path, name, loader, reference):
    import transformers

    model = getattr(transformers, loader).from_pretrained(SAMPLE.parent / name, attn_implementation="eager").eval()
    base = model.model if loader == "LlamaForCausalLM" else model
    ids = [4, 8, 15, 16, 23]
    expected = {"gpt2": lambda: hf_block_values(base, 3, ids), "bert": lambda: bert_reference(base, 3, ids),
                "llama": lambda: llama_reference(base, 3, ids)}[reference]()
    path = tmp_path / "t.safetensors"
    result = invoke("run", "--weights", str(SAMPLE.parent / name), "--layer", "3", "--token-ids",
                    *map(str, ids), "--save", str(path))
    assert result.exit_code == 0, result.output
    ours = load_file(str(path))
    block_input = expected["hidden_state"] if "hidden_state" in expected else expected["hidden_states"][3]
    assert (ours["x"] - block_input[0]).abs().max() <= 1e-5
    for step in STEPS:
        assert (ours[step] - expected[step][0]).abs().max() <= 1e-5, step


# --- bad files and bad combinations -----------------------------------------------------------

def _copy_sample(tmp_path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(SAMPLE, target)
    return target


def _lying_header(tmp_path) -> Path:
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4_000_000]}}).encode()
    path = tmp_path / "lies.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 64)
    return path


def _truncated(tmp_path) -> Path:
    data = (SAMPLE / "model.safetensors").read_bytes()
    path = tmp_path / "cut.safetensors"
    path.write_bytes(data[: len(data) // 2])
    return path


def _wrong_shape(tmp_path) -> Path:
    target = _copy_sample(tmp_path)
    tensors = load_file(str(target / "model.safetensors"))
    tensors["h.1.mlp.c_fc.weight"] = torch.zeros(64, 200)
    save_file(tensors, str(target / "model.safetensors"))
    return target


def _no_config(tmp_path) -> Path:
    target = _copy_sample(tmp_path)
    (target / "config.json").unlink()
    return target


def _unknown_layout(tmp_path) -> Path:
    path = tmp_path / "other.safetensors"
    save_file({"encoder.weight": torch.zeros(2), "decoder.bias": torch.zeros(2)}, str(path))
    return path


def _zip_that_lies(tmp_path) -> Path:
    """torch.save's zip whose central directory claims every entry is a gigabyte (issue 45: headers that lie)."""
    import struct

    path = tmp_path / "lies.pt"
    torch.save({"h.0.attn.c_attn.weight": torch.zeros(8, 24)}, path)
    data = bytearray(path.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        data[at + 20:at + 28] = struct.pack("<II", 10**9, 10**9)  # compressed and uncompressed sizes
        at = data.find(b"PK\x01\x02", at + 4)
    path.write_bytes(bytes(data))
    return path


BAD_FILES = {
    "missing": (lambda tmp: tmp / "nope", "does not exist"),
    "empty directory": (lambda tmp: tmp, "holds no model.safetensors, model.safetensors.index.json or PyTorch checkpoint"),
    "random bytes": (lambda tmp: (tmp / "r.safetensors").write_bytes(bytes(range(256)) * 4) and tmp / "r.safetensors",
                     "is not a valid safetensors file"),
    "truncated": (_truncated, "is not a valid safetensors file"),
    "header lies about sizes": (_lying_header, "is not a valid safetensors file"),
    # a file no checkpoint format starts like, named as nothing or as a torch file (nanoGPT's raw token ids)
    "text": (lambda tmp: (tmp / "README.md").write_text("# notes\n") and tmp / "README.md",
             "README.md is not a checkpoint: neither safetensors (an 8-byte length, then a JSON header) nor torch.save"),
    "raw token ids": (lambda tmp: (tmp / "train.bin").write_bytes(bytes(range(64)) * 8) and tmp / "train.bin",
                      "train.bin is not a PyTorch checkpoint: torch.save writes a zip archive or a pickle, and this "
                      "file starts with neither; raw token ids (such as nanoGPT's train.bin) are an input: "
                      "--token-ids-file"),
    "a zip whose headers lie": (_zip_that_lies, "lies.pt is not a readable PyTorch checkpoint"),
    "wrong shape": (_wrong_shape, "tensor 'h.1.mlp.c_fc.weight' has shape [64, 200], expected [64, 256]"),
    "unknown layout": (_unknown_layout, "unknown checkpoint layout; tried gpt2 (h.{k}.* or transformer.h.{k}.*); "
                       "bert"),
    "unknown layout, what it holds": (_unknown_layout, "the file holds 2 tensors in no numbered layer: decoder.bias [2], "
                                      "encoder.weight [2]"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_files_give_one_error_line_and_exit_2(invoke, tmp_path, case):
    make, message = BAD_FILES[case]
    path = make(tmp_path)
    result = invoke("run", "--weights", str(path), "--layer", "1", "--token-ids", "1", "2")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_a_pickle_renamed_to_safetensors_is_refused_with_the_way_to_read_it(invoke, tmp_path):
    path = tmp_path / "model.safetensors"
    torch.save({"w": torch.zeros(2)}, path)
    result = invoke("run", "--weights", str(path), "--token-ids", "1")
    assert result.exit_code == 2 and "is a pickle named .safetensors: rename it to .pt" in result.stderr


USAGE_CASES = [
    (["--layer", "4", "--token-ids", "1"], 2, "--layer 4 is out of range: the checkpoint has 4 layers: 0–3"),
    (["--tokens", "猫"], 2, "with --weights the input must come from the checkpoint: --token-ids"),
    ([], 2, "with --weights the input must come from the checkpoint"),
    (["--token-ids", "1", "999"], 2, "token ids [999] are out of range: the vocabulary has"),
    (["--token-ids", "1", "x"], 2, "--token-ids takes integers"),
    (["--d-model", "32", "--token-ids", "1"], 2, "--d-model 32 conflicts with the checkpoint's d_model = 64"),
    (["--token-ids", "1", "--text", "猫"], 2, "--token-ids and --text both give the input"),
]


@pytest.mark.parametrize("args, code, message", USAGE_CASES)
def test_bad_combinations_with_weights(invoke, args, code, message):
    result = invoke("run", "--weights", str(SAMPLE), *args)
    assert result.exit_code == code, result.output
    assert result.stderr.startswith(f"Error: {message}") and len(result.stderr.strip().splitlines()) == 1


def test_without_config_json_heads_are_required(invoke, tmp_path):
    target = _no_config(tmp_path)
    result = invoke("run", "--weights", str(target), "--token-ids", "1", "2")
    assert result.exit_code == 2 and "has no config.json: pass --heads" in result.stderr
    with_heads = invoke("run", "--weights", str(target), "--token-ids", "1", "2", "--heads", "4", "--json")
    assert json.loads(with_heads.stdout)["config"]["d_ff"] == 256


def test_text_without_a_tokenizer_names_token_ids(invoke, gpt2_checkpoint):
    directory, _ = gpt2_checkpoint
    result = invoke("run", "--weights", str(directory), "--text", "hello")
    assert result.exit_code == 2 and "pass --token-ids instead" in result.stderr


def test_token_ids_need_weights(invoke):
    result = invoke("run", "--token-ids", "1", "2")
    assert result.exit_code == 2 and "--token-ids needs real weights: add --weights PATH" in result.stderr


def test_sharded_checkpoints_are_read_through_their_index(invoke, tmp_path):
    model = make_gpt2(head=True)
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    path = tmp_path / "t.safetensors"
    result = invoke("run", "--weights", str(tmp_path), "--layer", "2", "--token-ids", "3", "1", "4", "--save", str(path))
    assert result.exit_code == 0, result.output
    ours, reference = load_file(str(path)), hf_block_values(model.transformer, 2, [3, 1, 4])
    for name in STEPS:
        assert (ours[name] - reference[name][0]).abs().max() <= 1e-5, name


def test_text_without_the_tokenizers_package_names_the_extra(invoke, monkeypatch):
    import sys

    from blocktrace.sources.tokenizer import _parsed

    monkeypatch.setitem(sys.modules, "tokenizers", None)
    _parsed.cache_clear()  # as in a fresh process: a tokenizer an earlier test loaded would need no import
    result = invoke("run", "--weights", str(SAMPLE), "--text", "猫 吃 鱼")
    assert result.exit_code == 2
    assert "--text needs the tokenizers package: pip install -e '.[text]'" in result.stderr


def test_bfloat16_checkpoint_is_upcast_unless_dtype_says_otherwise(invoke, tmp_path):
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(str(SAMPLE / "model.safetensors")).items()}
    target = _copy_sample(tmp_path)
    save_file(tensors, str(target / "model.safetensors"))
    upcast = json.loads(invoke("run", "--weights", str(target), "--token-ids", "1", "2", "--json").stdout)
    assert {s["dtype"] for s in upcast["steps"]} == {"float32"}
    native = json.loads(invoke("run", "--weights", str(target), "--token-ids", "1", "2", "--dtype", "bfloat16",
                               "--json").stdout)
    assert {s["dtype"] for s in native["steps"]} == {"bfloat16"}
    assert native["steps"][-1]["stats"]["rms"] == pytest.approx(upcast["steps"][-1]["stats"]["rms"], rel=0.05)
