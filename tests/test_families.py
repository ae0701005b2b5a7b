"""BERT and Llama checkpoints: every step equals what HuggingFace computes at the same place."""

import pytest
import torch
from helpers import bert_reference, llama_reference, make_bert, make_llama

from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8]
STEPS = ["norm1", "attn", "residual1", "norm2", "ffn", "residual2", "attn_weights"]


FAMILY_CASES = {
    "BertModel": (lambda: make_bert(False), bert_reference, "bert"),
    "BertForMaskedLM": (lambda: make_bert(True), bert_reference, "bert"),
    "LlamaModel": (lambda: make_llama(False), llama_reference, "llama"),
    "LlamaForCausalLM": (lambda: make_llama(True), llama_reference, "llama"),
    "Llama head_dim 16, linear RoPE scaling": (
        lambda: make_llama(False, head_dim=16, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                "rope_theta": 500.0}),
        llama_reference, "llama"),
}


@pytest.fixture(scope="module", params=list(FAMILY_CASES))
def family_checkpoint(request, tmp_path_factory):
    make, reference, layout = FAMILY_CASES[request.param]
    saved, base = make()
    directory = tmp_path_factory.mktemp(request.param.replace(" ", "_").replace(",", ""))
    saved.save_pretrained(directory)
    return directory, base, reference, layout


@pytest.mark.parametrize("layer", [0, 2])
def test_every_step_matches_huggingface(family_checkpoint, layer):
    directory, model, reference, layout = family_checkpoint
    expected = reference(model, layer, IDS)
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name == layout
    config = checkpoint_config(checkpoint, info, {})
    block = load_block(checkpoint, info, layer, config)
    traced = trace(block, expected["hidden_states"][layer][0], keep_tensors=True).tensors()
    for name in STEPS:
        delta = (traced[name] - expected[name][0]).abs().max().item()
        assert delta <= 1e-5, f"{name}: max |Δ| {delta}"


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_token_ids_give_the_input_huggingface_feeds_the_block(family_checkpoint, layer):
    directory, model, reference, _ = family_checkpoint
    expected = reference(model, layer, IDS)["hidden_states"][layer][0]
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    x = hidden_state_before(checkpoint, info, config, embed_token_ids(checkpoint, info, IDS), layer)
    assert (x - expected).abs().max().item() <= 1e-5


def test_rotary_substeps_match_huggingface_rotation():
    """q and k before and after RoPE, traced inside attn, against HF's apply_rotary_pos_emb."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    _, model = make_llama(False, head_dim=16, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0})
    from blocktrace.config import BlockConfig
    from blocktrace.model.block import build_block

    config = BlockConfig(d_model=32, n_heads=4, kv_heads=2, head_size=16, d_ff=64, norm="rmsnorm", ffn="swiglu",
                         bias=False, rope_theta=500.0, rope_scaling=2.0)
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(0))
    traced = trace(build_block(config, seed=1), x, keep_tensors=True)
    t = traced.tensors()
    assert [s.name for s in traced.substeps] == ["attn.q", "attn.q_rope", "attn.k", "attn.k_rope"]
    cos, sin = LlamaRotaryEmbedding(model.config)(x, torch.arange(7)[None].expand(2, 7))
    q_rope, k_rope = apply_rotary_pos_emb(t["attn.q"], t["attn.k"], cos, sin)
    assert torch.allclose(t["attn.q_rope"], q_rope, atol=1e-6) and torch.allclose(t["attn.k_rope"], k_rope, atol=1e-6)
    # A rotation keeps every head vector's length.
    assert torch.allclose(t["attn.q_rope"].norm(dim=-1), t["attn.q"].norm(dim=-1), atol=1e-5)


def test_padded_batch_of_different_lengths_matches_huggingface_attention_mask(invoke, tmp_path):
    """Two sequences, 7 and 4 ids: padded keys get no weight, as with HF's attention_mask."""
    import json

    import numpy as np
    from safetensors.torch import load_file

    saved, model = make_bert(False)
    saved.save_pretrained(tmp_path / "bert")
    long, short = IDS, IDS[:4]
    ids = torch.tensor([long, short + [0] * 3])
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    layer = model.encoder.layer[2]
    seen = {}
    hooks = [layer.attention.output.LayerNorm.register_forward_hook(lambda m, a, o: seen.__setitem__("norm1", o)),
             layer.output.LayerNorm.register_forward_hook(lambda m, a, o: seen.__setitem__("norm2", o))]
    with torch.no_grad():
        hidden = model(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    path = tmp_path / "t.safetensors"
    args = ["run", "--weights", str(tmp_path / "bert"), "--layer", "2", "--token-ids", *map(str, long), "/",
            *map(str, short), "--save", str(path), "--json"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    ours, real = load_file(str(path)), mask.bool()
    assert (ours["x"][real] - hidden[2][real]).abs().max() <= 1e-5
    for name in ("norm1", "norm2"):
        assert (ours[name][real] - seen[name][real]).abs().max() <= 1e-5, name
    assert ours["attn_weights"][1, :, :, 4:].abs().max() == 0  # no weight on the padded keys
    report = json.loads(result.stdout)
    values = ours["norm2"][real].double().numpy()
    assert report["steps"][-1]["stats"]["mean"] == pytest.approx(values.mean(), abs=1e-6)
    assert report["steps"][-1]["stats"]["std"] == pytest.approx(values.std(), rel=1e-5)
    assert "2 sequences right-padded to 7" in report["input"]["source"]
    assert np.isfinite(report["attention"]["entropy_per_head"]).all()


def test_a_roberta_without_config_is_not_passed_off_as_bert(tmp_path):
    """Keys alone cannot tell RoBERTa from BERT: read without config.json, the note says so; with it, refused."""
    import json as json_module

    from click.testing import CliRunner
    from transformers import RobertaConfig, RobertaModel

    from blocktrace.cli import cli

    RobertaModel(RobertaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                               vocab_size=60, max_position_embeddings=40)).save_pretrained(tmp_path)
    run = CliRunner().invoke(cli, ["check", "--weights", str(tmp_path), "--token-ids", "5", "6", "7"])
    assert run.exit_code == 2 and "model_type 'roberta' is not supported" in run.stderr
    (tmp_path / "config.json").unlink()
    read = CliRunner().invoke(cli, ["check", "--weights", str(tmp_path), "--heads", "4", "--token-ids", "5", "6", "7",
                                    "--json"])
    notes = json_module.loads(read.stdout)["notes"]
    assert any("RoBERTa" in note and "add its config.json" in note for note in notes)
