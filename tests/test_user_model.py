"""A user's own model and checkpoint: read as it is (`check --model`), or refused with what the file holds.

The references are the model's own forward (its loss, its attention scores recomputed by hand from its own
modules) and the file's own keys and shapes, never blocktrace's output."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from helpers import one_error_line

LEARNER = Path(__file__).resolve().parents[1] / "sample_weights" / "learner" / "charmodel.py"
ARGS = dict(vocab_size=65, n_embd=32, n_head=4, n_layer=2, block_size=32)  # not the defaults: they are read
IDS = [5, 17, 40, 3, 22, 61, 8, 9, 30, 12, 44, 1]


def _learner(tmp_path: Path, scale_bug: bool = False):
    """The learner's file and a checkpoint of it as nanoGPT's train.py saves one ({"model", "model_args"})."""
    source = LEARNER.read_text()
    if scale_bug:  # the scores multiplied by √d_head instead of divided
        source = source.replace("/ math.sqrt(C // self.heads)", "* math.sqrt(C // self.heads)")
    (tmp_path / "charmodel.py").write_text(source)
    namespace: dict = {}
    exec(compile(source, "charmodel.py", "exec"), namespace)
    torch.manual_seed(0)
    model = namespace["CharGPT"](**ARGS)
    torch.save({"model": model.state_dict(), "model_args": ARGS}, tmp_path / "ckpt.pt")
    return model.eval()


def _check(invoke, tmp_path, *extra):
    return invoke("check", "--model", f"{tmp_path / 'charmodel.py'}:CharGPT", "--weights", str(tmp_path / "ckpt.pt"),
                  "--token-ids", *map(str, IDS), *extra)


def _max_logit_by_hand(model, layer: int) -> float:
    """Layer `layer`'s largest causal attention score q·k/√d, from the model's own modules."""
    ids = torch.tensor([IDS[:-1]])
    with torch.no_grad():
        x = model.transformer.wte(ids) + model.transformer.wpe(torch.arange(ids.shape[1]))
        for block in model.transformer.h[:layer]:
            x = block(x)
        block = model.transformer.h[layer]
        B, T, C = x.shape
        heads = block.attn.heads
        q, k, _ = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in block.attn.c_attn(block.ln_1(x)).split(C, 2))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(C // heads)
        return scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).max().item()


def test_check_model_runs_the_users_own_code_on_its_checkpoint(tmp_path, invoke):
    model = _learner(tmp_path)
    result = _check(invoke, tmp_path, "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    entry = report["records"][0]
    ids = torch.tensor([IDS])
    with torch.no_grad():
        _, own_loss = model(ids[:, :-1], ids[:, 1:])
    assert entry["loss"] == pytest.approx(own_loss.item(), rel=1e-6)  # the model's own loss, not blocktrace's
    for layer in (0, 1):  # attention written by hand is seen: its scores equal those recomputed by hand
        assert entry["layers"][layer]["max_logit"] == pytest.approx(_max_logit_by_hand(model, layer), rel=1e-5)
    assert entry["probe"]["note"] is None  # the causal probe ran, with the targets the forward needs
    assert any("model arguments" in note for note in report["notes"])
    assert any("targets=ids[1:]" in note for note in report["notes"])


def test_a_wrong_attention_scale_in_the_users_model_is_named(tmp_path, invoke):
    _learner(tmp_path, scale_bug=True)
    result = _check(invoke, tmp_path)
    assert result.exit_code == 1
    assert "attention_scale_wrong" in result.stdout and "roll back" not in result.stdout


def test_a_file_that_does_not_fit_the_model_names_the_tensors(tmp_path, invoke):
    _learner(tmp_path)
    state = torch.load(tmp_path / "ckpt.pt")
    state["model"]["extra.weight"] = torch.zeros(2)
    del state["model"]["lm_head.weight"]
    torch.save(state, tmp_path / "ckpt.pt")
    one_error_line(_check(invoke, tmp_path), 2, "lm_head.weight", "extra.weight", "does not fit")


@pytest.mark.parametrize("extra, named", [(("--layer", "1"), "--layer"), (("--grad",), "--grad"),
                                          (("--dtype", "float16"), "--dtype")])
def test_options_the_users_code_would_ignore_are_refused(tmp_path, invoke, extra, named):
    _learner(tmp_path)
    one_error_line(_check(invoke, tmp_path, *extra), 2, named, "does not apply with --model")


def test_without_a_layout_the_error_says_what_was_tried_and_what_the_file_holds(tmp_path, invoke):
    _learner(tmp_path)
    result = invoke("check", "--weights", str(tmp_path / "ckpt.pt"), "--token-ids", "1", "2", "3")
    one_error_line(result, 2, "read as the nanogpt layout", "mlp.0.weight [128, 32]", "mlp.c_fc.weight",
                   "check --model FILE.py:FACTORY")
    state = torch.load(tmp_path / "ckpt.pt")["model"]
    torch.save({key.replace("transformer.h.", "blocks."): value for key, value in state.items()}, tmp_path / "b.pt")
    result = invoke("check", "--weights", str(tmp_path / "b.pt"), "--token-ids", "1", "2", "3")
    one_error_line(result, 2, "unknown checkpoint layout", "tried gpt2", "2 layers as blocks.{k}.*",
                   "attn.c_attn.weight [96, 32]")


def test_inspect_always_shows_the_file(tmp_path, invoke):
    _learner(tmp_path)
    result = invoke("inspect", str(tmp_path / "ckpt.pt"), "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    stored = torch.load(tmp_path / "ckpt.pt")["model"]
    listed = {f"{report['key_prefix']}{layer['layer']}.{t['name']}": t["shape"]
              for layer in report["layers"] for t in layer["tensors"]}
    listed.update({t["name"]: t["shape"] for t in report["other_tensors"]})
    assert listed == {key: list(value.shape) for key, value in stored.items()}
    assert report["family"] is None and "mlp.c_fc.weight" in report["layout_note"]
    text = invoke("inspect", str(tmp_path / "ckpt.pt")).stdout
    assert "read as no family" in text and "mlp.0.weight" in text


def test_a_layout_guessed_from_the_keys_is_said(tmp_path, invoke):
    from nanogpt import GPT, GPTConfig, save_ckpt

    torch.manual_seed(0)
    save_ckpt(GPT(GPTConfig()), tmp_path / "ckpt.pt")
    report = json.loads(invoke("check", "--weights", str(tmp_path / "ckpt.pt"), "--token-ids", "1", "2", "3",
                               "--json").stdout)
    assert any("guessed from the keys" in note and "check --model" in note for note in report["notes"])


def test_nanogpts_own_model_from_a_compiled_runs_checkpoint(tmp_path, invoke):
    """nanoGPT's GPT(GPTConfig(**model_args)) through a two-line factory; train.py's `_orig_mod.` keys and its tied
    head read as they are."""
    from nanogpt import GPTConfig, randomised, save_ckpt

    model = randomised(GPTConfig())
    save_ckpt(model, tmp_path / "ckpt.pt", compiled_prefix=True)
    result = invoke("check", "--model", f"{Path(__file__).with_name('nanogpt.py')}:from_model_args", "--weights",
                    str(tmp_path / "ckpt.pt"), "--token-ids", *map(str, IDS), "--json")
    assert result.exit_code in (0, 1), result.stderr
    entry = json.loads(result.stdout)["records"][0]
    ids = torch.tensor([IDS])
    with torch.no_grad():
        _, own_loss = model(ids[:, :-1], ids[:, 1:])
    assert entry["loss"] == pytest.approx(own_loss.item(), rel=1e-6)


def test_the_learners_sample_runs_show_its_attention_and_the_audit_finding(invoke):
    """sample_weights/learner (make_learner.py): the healthy run clean with its hand-written attention measured
    at every record; the run with AdamW's betas swapped found at its first record, by the optimizer's settings."""
    from blocktrace.training.timeline import read_timeline

    folder = LEARNER.parent
    healthy = read_timeline(folder / "watch.jsonl")
    assert all(layer["max_logit"] is not None and layer["min_entropy"] is not None
               for record in healthy for layer in record["layers"])
    assert invoke("track", str(folder / "watch.jsonl"), "--fail-on", "warning").exit_code == 0
    swapped = json.loads(invoke("track", str(folder / "betas-swapped.jsonl"), "--json").stdout)
    assert swapped["first_sign"]["step"] == 0 and swapped["first_sign"]["name"] == "moment_rates_invalid"
