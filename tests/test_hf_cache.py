"""sources/hf_cache.py: checkpoints where users keep them — a model id read from the local HuggingFace cache
(HF_HUB_CACHE, or HF_HOME's hub), never downloaded."""

from __future__ import annotations

import json
import shutil

from helpers import SAMPLES


def _fake_cache(root, repo: str, sample: str):
    folder = root / ("models--" + repo.replace("/", "--"))
    snapshot = folder / "snapshots" / "0123abcd"
    shutil.copytree(SAMPLES / sample, snapshot)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text("0123abcd")
    return snapshot


def test_weights_by_model_id_from_the_local_cache(invoke, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    _fake_cache(tmp_path / "hub", "someone/tiny-gpt2", "gpt2-tiny")
    by_id = invoke("run", "--weights", "someone/tiny-gpt2", "--token-ids", "1", "2", "--json")
    by_path = invoke("run", "--weights", str(SAMPLES / "gpt2-tiny"), "--token-ids", "1", "2", "--json")
    assert by_id.exit_code == 0, by_id.output
    assert json.loads(by_id.stdout)["steps"] == json.loads(by_path.stdout)["steps"]
    assert invoke("inspect", "someone/tiny-gpt2").exit_code == 0
    missing = invoke("run", "--weights", "someone/not-here", "--token-ids", "1")
    assert missing.exit_code == 2 and "is in the local HuggingFace cache" in missing.stderr
    assert "never downloads" in missing.stderr


def test_hf_home_is_honoured_too(invoke, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    _fake_cache(tmp_path / "home" / "hub", "llama-tiny", "llama-tiny")
    assert invoke("run", "--weights", "llama-tiny", "--token-ids", "1", "2").exit_code == 0
