"""Qwen3.5's and Qwen3.5-MoE's language models saved alone (qwen3_5_text, qwen3_5_moe_text): Qwen3-Next's hybrid
without experts and with them in every layer, its delta net's projections stored apart and read into Qwen3-Next's
grouping. Every traced step of both layer kinds equal to HF's
(both weight scales), HF's own layers traced bare, the model's loss and per-layer gradients, the regrouping against
a hand-built grouping of HF's projections, and HF's defaults."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import capture, randomise_hf

from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.families.qwen3_5 import Qwen3_5MoeText, Qwen3_5Text
from blocktrace.sources.loader import load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]
KINDS = ["linear_attention", "linear_attention", "full_attention"]
SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
             num_hidden_layers=3, vocab_size=101, max_position_embeddings=64, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, layer_types=KINDS,
             attn_implementation="eager")


EXPERTS = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24)


def hf_qwen3_5(randomised: bool = True, experts: bool = False):
    import transformers

    torch.manual_seed(5)
    if experts:
        model = transformers.Qwen3_5MoeForCausalLM(transformers.Qwen3_5MoeTextConfig(**{
            key: value for key, value in {**SMALL, **EXPERTS}.items() if key != "intermediate_size"})).eval()
    else:
        model = transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**SMALL)).eval()
    if randomised:
        randomise_hf(model, seed=5)
    return model


def places(model, layer: int) -> dict:
    block = model.model.layers[layer]
    mixer = block.linear_attn if KINDS[layer] == "linear_attention" else block.self_attn
    return {"norm1": (block.input_layernorm, "out"), "attn": (mixer, "out"),
            "residual1": (block.post_attention_layernorm, "in"), "norm2": (block.post_attention_layernorm, "out"),
            "ffn": (block.mlp, "out"), "residual2": (block, "out")}


@pytest.fixture(scope="module", params=[(True, False), (False, False), (True, True), (False, True)],
                ids=["randomised", "hf-initialised", "experts-randomised", "experts-hf-initialised"])
def saved(request, tmp_path_factory):
    randomised, experts = request.param
    model = hf_qwen3_5(randomised=randomised, experts=experts)
    directory = tmp_path_factory.mktemp("qwen3_5")
    model.save_pretrained(directory)
    return directory, model


def loaded(directory, layer: int):
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name in ("qwen3_5_text", "qwen3_5_moe_text")
    return load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))


@pytest.mark.parametrize("layer", [0, 2])  # a delta-rule layer, gated attention
def test_every_step_of_both_layer_kinds_matches_huggingface(saved, layer):
    directory, model = saved
    expected = capture(model, places(model, layer), IDS)
    tensors = trace(loaded(directory, layer), expected["hidden_states"][layer][0], keep_tensors=True).tensors()
    for step in places(model, layer):
        delta = (tensors[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"


@pytest.mark.parametrize("layer", [0, 2])
def test_the_hf_layer_of_either_kind_traced_bare_equals_itself_inside_its_model(saved, layer):
    _, model = saved
    expected = capture(model, places(model, layer), IDS)
    tensors = trace(model.model.layers[layer], expected["hidden_states"][layer], keep_tensors=True).tensors()
    for step in places(model, layer):
        delta = (tensors[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"


def test_the_projections_are_regrouped_by_key_head_as_qwen3_next_stores_them():
    """Against a grouping written out row by row: key head h's q, k, then v and z of its value heads 2h, 2h + 1."""
    model = hf_qwen3_5()
    net = model.model.layers[0].linear_attn
    from blocktrace.config import GatedDeltaNet

    spec = GatedDeltaNet(key_heads=2, value_heads=4, key_dims=8, value_dims=8, kernel=4)
    tensors = {"linear_attn.in_proj_qkv.weight": net.in_proj_qkv.weight, "linear_attn.in_proj_z.weight":
               net.in_proj_z.weight, "linear_attn.in_proj_b.weight": net.in_proj_b.weight,
               "linear_attn.in_proj_a.weight": net.in_proj_a.weight}

    class Widths:
        token_mixer, d_model = spec, 32

    grouped = Qwen3_5Text.delta_projections(lambda name, shape: tensors[name], Widths)
    q, k, v = net.in_proj_qkv.weight.split([16, 16, 32])
    z, b, a = net.in_proj_z.weight, net.in_proj_b.weight, net.in_proj_a.weight
    rows = []
    for h in range(2):
        rows += [q[8 * h:8 * h + 8], k[8 * h:8 * h + 8], v[16 * h:16 * h + 16], z[16 * h:16 * h + 16]]
    assert torch.equal(grouped["attn.in_proj_qkvz.weight"], torch.cat(rows))
    assert torch.equal(grouped["attn.in_proj_ba.weight"], torch.cat([b[0:2], a[0:2], b[2:4], a[2:4]]))


def test_hfs_defaults_and_its_multimodal_rope_note(tmp_path):
    import transformers

    for family, config_class in ((Qwen3_5Text, "Qwen3_5TextConfig"), (Qwen3_5MoeText, "Qwen3_5MoeTextConfig")):
        hf = getattr(transformers, config_class)()
        for key, value in family.defaults.items():
            assert getattr(hf, key) == value, (config_class, key)
    model = hf_qwen3_5()
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"]["mrope_section"] = [1, 1, 0]
    (tmp_path / "config.json").write_text(json.dumps(config))
    info = model_info(Checkpoint(tmp_path))
    assert any("mRoPE's sections read for text" in note for note in info.notes)


def test_qwen3_next_settings_qwen3_5_moe_does_not_have_are_said_unread(tmp_path):
    """mlp_only_layers would leave a layer dense in Qwen3-Next; Qwen3.5-MoE's config deletes it and HF ignores it:
    ignored here too (every layer's experts read), and said."""
    model = hf_qwen3_5(experts=True)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["mlp_only_layers"] = [0]
    (tmp_path / "config.json").write_text(json.dumps(config))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    assert any(note.startswith("mlp_only_layers in config.json not read") for note in info.notes)
    assert load_block(checkpoint, info, 0, checkpoint_config(checkpoint, info, {})).config.experts.n_experts == 4
