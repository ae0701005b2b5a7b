"""OLMo-Hybrid: gated delta-rule layers (Pre-LN, β up to 2, the output norm at its own eps) among OLMo-3 attention
layers (norms after each sublayer, QK-norm over all heads, NoPE without rope_parameters). Every traced step of both
kinds equal to HF's at both weight scales, with and without RoPE; HF's own layers of both classes traced bare; HF's
defaults (the model's loss, per-layer gradients and a padded batch: tests/test_model.py)."""

from __future__ import annotations

import pytest
import torch
from helpers import capture, randomise_hf

from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.families.olmo_hybrid import OlmoHybrid
from blocktrace.sources.loader import load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]
KINDS = ["linear_attention", "full_attention", "linear_attention"]
SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, num_hidden_layers=3,
             vocab_size=101, max_position_embeddings=64, linear_num_key_heads=2, linear_num_value_heads=4,
             pad_token_id=0, eos_token_id=1,
             linear_key_head_dim=8, linear_value_head_dim=8, layer_types=KINDS, attn_implementation="eager")


def hf_olmo_hybrid(randomised: bool = True, rope: bool = False):
    """rope=False: rope_parameters null, as the released checkpoints have it (HF's config default is RoPE)."""
    import transformers

    torch.manual_seed(3)
    config = transformers.OlmoHybridConfig(**SMALL)
    if not rope:
        config.rope_parameters = None
    model = transformers.OlmoHybridForCausalLM(config).eval()
    assert (model.model.rotary_emb is None) is (not rope)
    if randomised:
        randomise_hf(model, seed=3)
    return model


def places(model, layer: int) -> dict:
    block = model.model.layers[layer]
    if KINDS[layer] == "linear_attention":
        return {"norm1": (block.input_layernorm, "out"), "attn": (block.linear_attn, "out"),
                "residual1": (block.post_attention_layernorm, "in"), "norm2": (block.post_attention_layernorm, "out"),
                "ffn": (block.mlp, "out"), "residual2": (block, "out")}
    return {"attn": (block.self_attn, "out"), "norm1": (block.post_attention_layernorm, "out"),
            "ffn": (block.mlp, "out"), "norm2": (block.post_feedforward_layernorm, "out"), "residual2": (block, "out")}


@pytest.fixture(scope="module", params=[(True, False), (False, False), (True, True)],
                ids=["randomised-nope", "hf-initialised-nope", "randomised-rope"])
def saved(request, tmp_path_factory):
    randomised, rope = request.param
    model = hf_olmo_hybrid(randomised, rope)
    directory = tmp_path_factory.mktemp("olmo_hybrid")
    model.save_pretrained(directory)
    return directory, model


def loaded(directory, layer: int):
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name == "olmo_hybrid"
    return load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))


@pytest.mark.parametrize("layer", [0, 1])  # a delta-rule layer, an attention layer
def test_every_step_of_both_layer_kinds_matches_huggingface(saved, layer):
    directory, model = saved
    expected = capture(model, places(model, layer), IDS)
    tensors = trace(loaded(directory, layer), expected["hidden_states"][layer][0], keep_tensors=True).tensors()
    for step in places(model, layer):
        delta = (tensors[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"


@pytest.mark.parametrize("layer", [0, 1])
def test_the_hf_layer_of_either_class_traced_bare_equals_itself_inside_its_model(saved, layer):
    _, model = saved
    expected = capture(model, places(model, layer), IDS)
    tensors = trace(model.model.layers[layer], expected["hidden_states"][layer], keep_tensors=True).tensors()
    for step in places(model, layer):
        delta = (tensors[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"


def test_the_delta_layers_beta_scale_and_norm_eps_are_olmo_hybrids(tmp_path):
    model = hf_olmo_hybrid()
    model.save_pretrained(tmp_path)
    spec = loaded(tmp_path, 0).config.token_mixer
    assert spec.beta_scale == 2.0 and spec.norm_eps == 1e-5 and (spec.key_heads, spec.value_heads) == (2, 4)
    assert loaded(tmp_path, 1).config.token_mixer is None and loaded(tmp_path, 1).config.nope


def test_hfs_defaults():
    import transformers

    hf = transformers.OlmoHybridConfig()
    for key, value in OlmoHybrid.defaults.items():
        assert getattr(hf, key) == value, key
    family = OlmoHybrid()
    from blocktrace.sources.configfile import ConfigFile

    config = ConfigFile("config.json", {"hidden_size": 3840, "num_attention_heads": 30, "num_hidden_layers": 6})
    spec = family.delta_net_spec(config)
    assert (spec.key_heads, spec.key_dims, spec.value_heads, spec.value_dims) == (
        hf.linear_num_key_heads, hf.linear_key_head_dim, hf.linear_num_value_heads, hf.linear_value_head_dim)
    assert family.layer_kinds(ConfigFile("config.json", {"num_hidden_layers": 6})) == \
        transformers.OlmoHybridConfig(num_hidden_layers=6).layer_types
