"""sources/loader.py: a checkpoint's layer as a block — only that layer's tensors read, every tensor it holds used
or refused by name; the model's own embedding rows; ids and padding checked against the vocabulary before use."""

import json

import pytest
import torch
from helpers import SAMPLES, copy_sample
from safetensors.torch import load_file, save_file

from blocktrace.errors import UsageError, WeightsError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import check_token_ids, embed_token_ids, load_block, padding_id

SAMPLE = SAMPLES / "gpt2-tiny"


def _opened(path):
    checkpoint = Checkpoint(path)
    info = model_info(checkpoint)
    return checkpoint, info, checkpoint_config(checkpoint, info, {})


def test_only_the_traced_layer_is_read(monkeypatch):
    checkpoint, info, config = _opened(SAMPLE)
    read = []
    original = Checkpoint.get
    monkeypatch.setattr(Checkpoint, "get", lambda self, key, *a, **k: read.append(key) or original(self, key, *a, **k))
    load_block(checkpoint, info, 3, config)
    assert read and all(key.startswith("h.3.") for key in read)


def test_a_layers_tensor_the_block_would_not_use_is_refused_by_name(tmp_path):
    folder = copy_sample(tmp_path)
    tensors = load_file(folder / "model.safetensors")
    save_file({**tensors, "h.1.attn.extra_gate": torch.ones(4)}, folder / "model.safetensors", metadata={"format": "pt"})
    checkpoint, info, config = _opened(folder)
    load_block(checkpoint, info, 0, config)  # layer 0 holds nothing unexpected
    with pytest.raises(WeightsError, match="attn.extra_gate"):
        load_block(checkpoint, info, 1, config)


def test_the_embedding_is_the_token_rows_plus_the_position_rows_read_from_the_file():
    tensors = load_file(SAMPLE / "model.safetensors")  # read here by safetensors itself
    ids = [5, 0, 17, 5]
    expected = tensors["wte.weight"][ids] + tensors["wpe.weight"][: len(ids)]
    assert torch.equal(embed_token_ids(*_opened(SAMPLE)[:2], ids), expected)


def test_ids_outside_the_vocabulary_are_refused_naming_them_and_the_range():
    _, info, _ = _opened(SAMPLE)
    check_token_ids(info, [[0, info.vocab_size - 1]])
    with pytest.raises(UsageError, match=rf"token ids \[{info.vocab_size}, -1\] are out of range: the vocabulary has "
                                         rf"{info.vocab_size} ids"):
        check_token_ids(info, [[1, info.vocab_size], [-1]])


def test_a_pad_id_outside_the_vocabulary_is_blamed_on_the_config_only_when_padding_is_needed(tmp_path):
    folder = copy_sample(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "pad_token_id": 10**6}))
    _, info, _ = _opened(folder)
    assert padding_id(info, [[1, 2], [3, 4]]) == 10**6  # equal lengths: nothing is padded, nothing to refuse
    with pytest.raises(WeightsError, match="pad_token_id 1000000 is outside the vocabulary"):
        padding_id(info, [[1, 2], [3]])
