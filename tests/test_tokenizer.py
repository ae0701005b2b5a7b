"""sources/tokenizer.py: tokenizers as their models use them (no padding reaches the block, special tokens by name,
BERT's token types)."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import SAMPLES, make_bert
from safetensors.torch import load_file

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "eats", "fish", "a", "dog", "drinks", "water", "."]


def padding_tokenizer(path):
    """A BERT-style tokenizer.json that pads every text to 32 tokens and wraps it in [CLS] … [SEP]."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(w, special=True) for w in WORDS[:4]])
    tokenizer.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]",
                                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    tokenizer.enable_padding(length=32, pad_id=0, pad_token="[PAD]")
    tokenizer.enable_truncation(max_length=32)
    tokenizer.save(str(path))


@pytest.fixture
def bert_with_padding(tmp_path):
    saved, model = make_bert(False)
    saved.save_pretrained(tmp_path)
    padding_tokenizer(tmp_path / "tokenizer.json")
    return tmp_path, model


def test_padding_from_tokenizer_json_never_reaches_the_block(invoke, bert_with_padding):
    directory, model = bert_with_padding
    path = directory / "t.safetensors"
    result = invoke("run", "--weights", str(directory), "--layer", "2", "--text", "the cat eats fish .",
                    "--save", str(path), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["tokens"] == ["[CLS]", "the", "cat", "eats", "fish", ".", "[SEP]"]
    ids = [2, 4, 5, 6, 7, 12, 3]
    seen = {}
    layer = model.encoder.layer[2]
    hook = layer.output.LayerNorm.register_forward_hook(lambda m, a, o: seen.__setitem__("norm2", o))
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    hook.remove()
    ours = load_file(str(path))
    assert ours["x"].shape == (7, 32)
    assert (ours["x"] - hidden[2][0]).abs().max() <= 1e-5
    assert (ours["norm2"] - seen["norm2"][0]).abs().max() <= 1e-5


def test_token_type_ids_reach_the_embeddings(invoke, tmp_path):
    saved, model = make_bert(False)
    saved.save_pretrained(tmp_path)
    path = tmp_path / "t.safetensors"
    result = invoke("run", "--weights", str(tmp_path), "--layer", "1", "--token-ids", "3", "14", "15", "9",
                    "--token-type-ids", "0", "0", "1", "1", "--save", str(path))
    assert result.exit_code == 0, result.output
    with torch.no_grad():
        hidden = model(torch.tensor([[3, 14, 15, 9]]), token_type_ids=torch.tensor([[0, 0, 1, 1]]),
                       output_hidden_states=True).hidden_states
    assert (load_file(str(path))["x"] - hidden[1][0]).abs().max() <= 1e-5


@pytest.mark.parametrize("args, message", [
    (["--token-type-ids", "0", "1"], "must give one type per token"),
    (["--token-type-ids", "0", "1", "5"], "--token-type-ids [5] are out of range"),
])
def test_bad_token_type_ids(invoke, args, message):
    result = invoke("run", "--weights", str(SAMPLES / "bert-tiny"), "--token-ids", "1", "2", "3", *args)
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_token_types_on_a_family_without_them(invoke):
    result = invoke("run", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", "1", "2", "--token-type-ids", "0",
                    "0")
    assert result.exit_code == 2 and "gpt2 checkpoints have no token types" in result.stderr


def test_words_outside_the_vocabulary_are_said_to_be_traced_as_the_unknown_token(invoke, bert_with_padding):
    directory, _ = bert_with_padding
    result = invoke("run", "--weights", str(directory), "--text", "the cat eats hello", "--json")
    notes = json.loads(result.output)["notes"]
    # [CLS] the cat eats [UNK] [SEP]: one of six tokens is unknown (WordLevel's [UNK], id 1)
    assert ("1 of the text's 6 tokens are [UNK] (id 1): words outside the tokenizer's vocabulary, each traced as "
            "that one token") in notes
    known = json.loads(invoke("run", "--weights", str(directory), "--text", "the cat eats fish", "--json").output)
    assert not any("[UNK]" in note for note in known["notes"])
