"""sources/torchfile.py and sources/training_step.py: checkpoints as people save them: each written by the code that
really writes it (nanoGPT's train.py, safetensors' save_model, torch.compile, DDP, Lightning, HF's sharded and .bin
forms), each read to the numbers the writing model computes itself."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from helpers import make_gpt2
from nanogpt import GPTConfig, randomised, save_ckpt

from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [5, 17, 9, 0, 42, 7, 63, 11]


def nano_loss(model, ids=IDS) -> float:
    x = torch.tensor([ids])
    with torch.no_grad():
        return model(x[:, :-1], x[:, 1:].contiguous())[1].item()


def check_json(invoke, *args) -> dict:
    result = invoke("check", *args, "--token-ids", *map(str, IDS), "--json")
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_ckpt_pt_reads_every_block_as_nanogpt_computes_it(tmp_path, bias):
    model = randomised(GPTConfig(bias=bias), seed=3)
    save_ckpt(model, tmp_path / "ckpt.pt", iter_num=250, compiled_prefix=True)
    checkpoint = Checkpoint(tmp_path / "ckpt.pt")
    info = model_info(checkpoint)
    assert info.family_name == "nanogpt" and checkpoint.step == 250
    assert any("_orig_mod." in note for note in info.notes) and any("restricted loader" in n for n in info.notes)
    config = checkpoint_config(checkpoint, info, {})
    assert (config.n_heads, config.bias, config.ffn.value) == (4, bias, "gelu")
    states = model.hidden(torch.tensor([IDS]))
    x = hidden_state_before(checkpoint, info, config, embed_token_ids(checkpoint, info, IDS), 2)
    assert (x - states[2][0]).abs().max().item() <= 1e-5
    block_output = trace(load_block(checkpoint, info, 2, config), x, keep_tensors=True).tensors()["residual2"]
    assert (block_output - states[3][0]).abs().max().item() <= 1e-5


def test_nanogpt_ckpt_pt_gives_nanogpts_own_loss_and_its_step(invoke, tmp_path):
    model = randomised(GPTConfig(), seed=4)
    save_ckpt(model, tmp_path / "ckpt.pt", iter_num=1200)
    report = check_json(invoke, "--weights", str(tmp_path))  # the directory holding ckpt.pt
    assert report["loss"] == pytest.approx(nano_loss(model), rel=1e-5)
    assert report["step"] == 1200 and report["weights"]["family"] == "nanogpt"


def test_save_model_of_a_tied_model_keeps_only_the_head_and_is_read(invoke, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_model

    model = randomised(GPTConfig(), seed=5)
    save_model(model, str(tmp_path / "model.safetensors"))
    keys = set(safe_open(str(tmp_path / "model.safetensors"), "pt").keys())
    assert "lm_head.weight" in keys and "transformer.wte.weight" not in keys  # what save_model really writes
    report = check_json(invoke, "--weights", str(tmp_path), "--heads", "4")
    assert report["loss"] == pytest.approx(nano_loss(model), rel=1e-5)
    assert any("lm_head.weight" in note and "tied" in note for note in report["notes"])


@pytest.mark.parametrize("prefix, why", [("module.", "DistributedDataParallel"), ("_orig_mod.", "torch.compile"),
                                         ("module._orig_mod.", "DistributedDataParallel and torch.compile")])
def test_wrapper_prefixes_are_removed_and_said(invoke, tmp_path, prefix, why):
    from safetensors.torch import save_file

    model = make_gpt2(head=True)
    state = {f"{prefix}{k}": v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    # (GPT2LMHeadModel's head is its tied wte: save_file refuses to store a shared tensor twice)
    save_file(state, str(tmp_path / "model.safetensors"))
    model.config.save_pretrained(tmp_path)
    report = check_json(invoke, "--weights", str(tmp_path))
    x = torch.tensor([IDS])
    with torch.no_grad():
        expected = model(x, labels=x).loss.item()
    assert report["loss"] == pytest.approx(expected, rel=1e-5)
    assert any(f"{prefix!r}" in note and why in note for note in report["notes"]), report["notes"]


def test_lightning_checkpoint_is_read_with_its_hyperparameters_and_step(invoke, tmp_path):
    import lightning  # in the test extras: a checkpoint Lightning itself writes

    class Lit(lightning.LightningModule):
        def __init__(self, n_layer=2, n_head=4, n_embd=32, block_size=64, vocab_size=96, bias=True):
            super().__init__()
            self.save_hyperparameters()
            self.model = randomised(GPTConfig(block_size=block_size, vocab_size=vocab_size, n_layer=n_layer,
                                              n_head=n_head, n_embd=n_embd, bias=bias), seed=6)

        def training_step(self, batch, index):
            return self.model(*batch)[1]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    lit = Lit()
    batches = [(torch.randint(0, 96, (16,)), torch.randint(0, 96, (16,))) for _ in range(4)]
    trainer = lightning.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, accelerator="cpu", default_root_dir=str(tmp_path))
    trainer.fit(lit, torch.utils.data.DataLoader(batches, batch_size=2))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    report = check_json(invoke, "--weights", str(tmp_path / "last.ckpt"))
    assert report["loss"] == pytest.approx(nano_loss(lit.model.eval()), rel=1e-5)
    assert report["step"] == 3
    assert any("'model.'" in note for note in report["notes"])


def _save_pytorch_bin(model, folder: Path, shards: int) -> None:
    """What save_pretrained(safe_serialization=False) wrote before transformers 5 (which writes only safetensors):
    pytorch_model.bin, or pytorch_model-0000k-of-0000n.bin shards with pytorch_model.bin.index.json."""
    folder.mkdir()
    model.config.save_pretrained(folder)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: saved once, as HF does
    if shards == 1:
        torch.save(state, folder / "pytorch_model.bin")
        return
    names = sorted(state)
    weight_map = {}
    for index in range(shards):
        file = f"pytorch_model-{index + 1:05d}-of-{shards:05d}.bin"
        part = {name: state[name] for name in names[index::shards]}
        torch.save(part, folder / file)
        weight_map.update(dict.fromkeys(part, file))
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_huggingface_sharded_and_pickled_checkpoints_give_hfs_loss(invoke, tmp_path):
    model = make_gpt2(head=True)
    x = torch.tensor([IDS])
    with torch.no_grad():
        expected = model(x, labels=x).loss.item()
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    _save_pytorch_bin(model, tmp_path / "bin", shards=1)
    _save_pytorch_bin(model, tmp_path / "sharded-bin", shards=3)
    for folder in ("sharded", "bin", "sharded-bin"):
        assert check_json(invoke, "--weights", str(tmp_path / folder))["loss"] == pytest.approx(expected, rel=1e-5)


def test_track_orders_nanogpt_checkpoints_by_their_stored_step(invoke, tmp_path):
    for name, step, seed in (("a.pt", 500, 1), ("b.pt", 100, 2)):
        save_ckpt(randomised(GPTConfig(n_layer=2), seed=seed), tmp_path / name, iter_num=step)
    result = invoke("track", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--token-ids", *map(str, IDS),
                    "--json")
    assert result.exit_code in (0, 1), result.output
    assert [record["step"] for record in json.loads(result.stdout)["records"]] == [100, 500]


class _Booby:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".ckpt"])
def test_a_pickle_that_holds_code_is_refused_and_never_runs(invoke, tmp_path, suffix):
    marker = tmp_path / "unpickled"
    path = tmp_path / f"model{suffix}"
    torch.save({"model": {"w": torch.zeros(2)}, "trap": _Booby(marker)}, path)
    for target in (path, tmp_path):  # the file itself, and a directory holding only it
        result = invoke("run", "--weights", str(target), "--token-ids", "1")
        assert result.exit_code == 2
        assert "does not unpickle" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
    assert not marker.exists()


def test_a_plain_pickle_file_is_refused_unread(invoke, tmp_path):
    marker = tmp_path / "unpickled"
    path = tmp_path / "model.pkl"
    path.write_bytes(pickle.dumps(_Booby(marker)))
    result = invoke("run", "--weights", str(path), "--token-ids", "1")
    assert result.exit_code == 2 and "plain pickle" in result.stderr and not marker.exists()


def test_a_torch_file_without_a_state_dict_says_what_it_looked_for(invoke, tmp_path):
    torch.save({"epoch": 3, "notes": "x"}, tmp_path / "ckpt.pt")
    result = invoke("run", "--weights", str(tmp_path / "ckpt.pt"), "--token-ids", "1")
    assert result.exit_code == 2 and "holds no state dict" in result.stderr and "'model'" not in result.stderr


def test_track_reads_each_torch_file_once_besides_ordering_it(invoke, tmp_path, monkeypatch):
    import blocktrace.sources.torchfile as torchfile

    for name, step, seed in (("a.pt", 5, 1), ("b.pt", 10, 2), ("c.pt", 15, 3)):
        save_ckpt(randomised(GPTConfig(n_layer=2), seed=seed), tmp_path / name, iter_num=step)
    loads = []
    load = torchfile._load
    monkeypatch.setattr(torchfile, "_load", lambda path: loads.append(path) or load(path))
    result = invoke("track", str(tmp_path / "*.pt"), "--token-ids", *map(str, IDS))
    assert result.exit_code in (0, 1), result.output
    assert len(loads) == 2 * 3  # once for its stored step (the order), once for the check and ‖ΔW‖
