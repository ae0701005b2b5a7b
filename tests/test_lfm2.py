"""LFM2, the first hybrid family: short-convolution layers among attention layers, every traced step equal to what
HF's Lfm2 computes at the same place (both weight scales, every layer kind, HF's own layer traced bare), the
convolution's own sub-steps against HF's Lfm2ShortConv, padding zeroed as HF zeroes it, and the config's rules
(the FFN width, which layers convolve) read as Lfm2Config reads them."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import capture, randomise_hf

from blocktrace.config import BlockConfig, ShortConvolution
from blocktrace.errors import ConfigError
from blocktrace.model.block import build_block
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]
KINDS = ["conv", "full_attention", "conv"]
SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, num_hidden_layers=3,
             vocab_size=101, max_position_embeddings=64, block_multiple_of=16, attn_implementation="eager")
STEPS = ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")


def hf_lfm2(randomised: bool = True, **changes):
    import transformers

    torch.manual_seed(7)
    model = transformers.Lfm2ForCausalLM(transformers.Lfm2Config(**{**SMALL, "layer_types": KINDS, **changes})).eval()
    if randomised:
        randomise_hf(model, seed=7)
    return model


def places(model, layer: int) -> dict:
    block = model.model.layers[layer]
    mixer = block.conv if KINDS[layer] == "conv" else block.self_attn
    found = {"norm1": (block.operator_norm, "out"), "attn": (mixer, "out"), "residual1": (block.ffn_norm, "in"),
             "norm2": (block.ffn_norm, "out"), "ffn": (block.feed_forward, "out"), "residual2": (block, "out")}
    if KINDS[layer] != "conv":
        found["attn_weights"] = (mixer, "weights")
    return found


@pytest.fixture(scope="module", params=[True, False], ids=["randomised", "hf-initialised"])
def saved(request, tmp_path_factory):
    model = hf_lfm2(randomised=request.param)
    directory = tmp_path_factory.mktemp("lfm2")
    model.save_pretrained(directory)
    return directory, model


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_every_step_of_every_layer_kind_matches_huggingface(saved, layer):
    directory, model = saved
    expected = capture(model, places(model, layer), IDS)
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name == "lfm2"
    block = load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, expected["hidden_states"][layer][0], keep_tensors=True, checks=True)
    tensors = traced.tensors()
    for step in places(model, layer):
        delta = (tensors[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"
    if KINDS[layer] == "conv":  # no weights to read the mask from: causality measured by the probe
        assert traced.attention is None and traced.step("attn").probe.causal.causal is True
        assert [s.name for s in traced.substeps] == ["attn.b", "attn.c", "attn.x", "attn.gated", "attn.convolved"]
    else:
        assert traced.attention.future_weight_sum == 0.0


def test_the_embedding_and_each_layers_input_are_huggingfaces(saved):
    directory, model = saved
    hidden = capture(model, {}, IDS)["hidden_states"]
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    embedded = embed_token_ids(checkpoint, info, IDS)
    for layer in range(3):
        x = hidden_state_before(checkpoint, info, config, embedded, layer)
        assert (x - hidden[layer][0]).abs().max().item() <= 1e-5, layer


@pytest.mark.parametrize("layer", [0, 1])
def test_the_hf_layer_of_either_kind_traced_bare_equals_itself_inside_its_model(saved, layer):
    _, model = saved
    expected = capture(model, places(model, layer), IDS)
    for x in (expected["hidden_states"][layer][0], expected["hidden_states"][layer]):  # unbatched, batched
        traced = trace(model.model.layers[layer], x, keep_tensors=True, checks=True)
        tensors = traced.tensors()
        for step in STEPS:
            delta = (tensors[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
            assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"
        assert traced.step("attn").probe.causal.causal is True


def test_the_convolutions_sub_steps_are_hfs_own_intermediates(saved):
    """B, C, x, B ⊙ x and the convolution, against HF's Lfm2ShortConv computed by hand from its own modules."""
    directory, model = saved
    conv = model.model.layers[0].conv
    h = capture(model, {"x_in": (model.model.layers[0].operator_norm, "out")}, IDS)["x_in"]  # what the conv reads
    b, c, x = conv.in_proj(h).transpose(-1, -2).chunk(3, dim=-2)
    convolved = F.conv1d(b * x, conv.conv.weight, None, padding=2, groups=32)[..., :len(IDS)]
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, 0, checkpoint_config(checkpoint, info, {}))
    tensors = trace(block, capture(model, {}, IDS)["hidden_states"][0][0], keep_tensors=True).tensors()
    for name, value in {"b": b, "c": c, "x": x, "gated": b * x, "convolved": convolved}.items():
        delta = (tensors[f"attn.{name}"] - value[0].transpose(0, 1)).abs().max().item()
        assert delta <= 1e-5, f"{name}: max |Δ| {delta}"


def test_padded_tokens_are_zeroed_before_the_convolution_as_hf_does():
    """Left padding, the case where a pad would reach a real token through the kernel: HF multiplies the
    convolution layer's input by the 2D mask; so does the block given key_mask."""
    model = hf_lfm2()
    conv = model.model.layers[0].conv
    h = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = conv(h, attention_mask=mask)
    block = build_block(BlockConfig(d_model=32, n_heads=4, norm="rmsnorm", ffn="swiglu",
                                    token_mixer=ShortConvolution(3)), seed=0)
    block.attn.load_state_dict({"in_proj.weight": conv.in_proj.weight, "conv.weight": conv.conv.weight,
                                "out_proj.weight": conv.out_proj.weight})
    block.attend_with(key_mask=mask.bool())
    with torch.no_grad():
        ours = block.attn(h)
    assert (ours - expected).abs().max().item() <= 1e-6
    block.attend_with(key_mask=None)
    with torch.no_grad():
        unmasked = block.attn(h)
    assert (unmasked[1, 2:] - expected[1, 2:]).abs().max().item() > 1e-3  # the mask mattered: pads reached tokens


def test_the_layer_kinds_and_the_ffn_width_are_read_as_lfm2config_reads_them(tmp_path):
    import transformers

    for given in ({"full_attn_idxs": [1]}, {"full_attn_idxs": None}):
        config = transformers.Lfm2Config(**{**SMALL, **given})
        model = transformers.Lfm2ForCausalLM(config)
        model.save_pretrained(tmp_path)
        data = json.loads((tmp_path / "config.json").read_text())
        data.pop("layer_types")  # an older file: the attention layers listed by index only
        data.update(given)
        (tmp_path / "config.json").write_text(json.dumps(data))
        checkpoint = Checkpoint(tmp_path)
        info = model_info(checkpoint)
        config_ = checkpoint_config(checkpoint, info, {})
        kinds = ["conv" if info.family.layer_fields(info.config, k) else "full_attention" for k in range(3)]
        assert kinds == config.layer_types
        assert config_.d_ff == model.model.layers[0].feed_forward.w1.out_features  # ⅔ · 64 = 42, rounded up to 48


def test_a_short_convolutions_spec_is_checked():
    with pytest.raises(ConfigError, match="kernel must be a positive integer"):
        ShortConvolution(0)
    with pytest.raises(ConfigError, match="is causal and replaces attention"):
        BlockConfig(d_model=8, n_heads=2, causal=False, token_mixer=ShortConvolution(3))
    assert BlockConfig(d_model=8, n_heads=2, token_mixer={"kernel": 4}).token_mixer == ShortConvolution(4)


def test_run_prints_the_mixer_in_the_operation_column(invoke, saved):
    directory, _ = saved
    text = invoke("run", "--weights", str(directory), "--layer", "0", "--token-ids", "1", "2", "3").stdout
    assert "attn_out = ShortConv[3 tokens](x_norm1)" in text and "B ⊙ x" in text, text


def test_compare_rewires_the_layer_it_reads_its_native_wiring_equal_to_run(invoke, saved):
    """compare built its variants from the model's settings, not the layer's: a convolution layer was compared as
    attention with seeded weights. The native (Pre-LN) variant must be the run of that very layer."""
    directory, _ = saved
    args = ("--weights", str(directory), "--layer", "0", "--token-ids", "1", "2", "3", "--json")
    run = json.loads(invoke("run", *args).stdout)
    compared = json.loads(invoke("compare", "--pre-ln", "--post-ln", *args).stdout)
    native = compared["variants"][0]
    assert native["value"] == "pre" and native["unshared_parameters"] == []
    for ours, theirs in zip(native["report"]["steps"], run["steps"]):
        assert ours["operation"] == theirs["operation"]
        assert ours["stats"]["rms"] == pytest.approx(theirs["stats"]["rms"], rel=1e-6), ours["name"]
