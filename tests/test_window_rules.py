"""Which layers slide: for every windowed family, blocktrace's layer pattern equals the one the family's own HF config
class computes — from layer_types when the file has them, else by the class's rule (Qwen2/Qwen3: from
max_window_layers on; Qwen2-MoE: the even layers below it; Qwen3-MoE: every layer; Gemma-2: every other; Gemma-3:
five of six) — and the traced steps equal HF's on the hub-shaped files the rules were silently wrong on."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import capture, randomise_hf

from blocktrace.errors import WeightsError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families import FAMILIES, checkpoint_config, model_info
from blocktrace.sources.loader import load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]  # longer than the window of 4
SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=101,
             max_position_embeddings=64, attn_implementation="eager", sliding_window=4)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24)
PLACES = {"norm1": ("input_layernorm", "out"), "attn": ("self_attn", "out"), "attn_weights": ("self_attn", "weights"),
          "norm2": ("post_attention_layernorm", "out"), "ffn": ("mlp", "out"), "residual2": ("", "out")}

# (family, HF config class, settings): windows on, several layer counts and max_window_layers
CASES = [(family, config_class, {**settings, "num_hidden_layers": layers, "max_window_layers": limit})
         for family, config_class, settings in [
             ("qwen2", "Qwen2Config", {"use_sliding_window": True}),
             ("qwen3", "Qwen3Config", {"use_sliding_window": True}),
             ("qwen2_moe", "Qwen2MoeConfig", {"use_sliding_window": True, **MOE, "shared_expert_intermediate_size": 40}),
             ("qwen3_moe", "Qwen3MoeConfig", {"use_sliding_window": True, **MOE}),
             ("qwen2", "Qwen2Config", {"use_sliding_window": False})]
         for layers, limit in [(4, 0), (4, 2), (5, 3), (3, 28)]]


def _hf_pattern(config) -> list[bool]:
    """Which layers HF slides: its config's layer_types, or every layer where the class has none (Qwen3-MoE)."""
    types = getattr(config, "layer_types", None)
    if types is None:
        return [config.sliding_window is not None] * config.num_hidden_layers
    return [kind == "sliding_attention" for kind in types]


def _hub_file(tmp_path, config) -> ConfigFile:
    """The config as the hub's files read: written by HF, layer_types removed (older files have none)."""
    data = config.to_dict()
    data.pop("layer_types", None)
    return ConfigFile(tmp_path / "config.json", data)


@pytest.mark.parametrize("family, config_class, settings", CASES)
def test_the_layer_pattern_is_the_hf_config_classs_own(tmp_path, family, config_class, settings):
    import transformers

    config = getattr(transformers, config_class)(**{**SMALL, **settings})
    expected = _hf_pattern(config)
    for data_of in (lambda: _hub_file(tmp_path, config), lambda: ConfigFile(tmp_path / "c.json", config.to_dict())):
        file = data_of()
        ours = [FAMILIES[family].layer_fields(file, layer)["sliding_window"] is not None
                for layer in range(config.num_hidden_layers)]
        assert ours == expected, (family, settings, ours, expected)


@pytest.mark.parametrize("family, config_class", [("gemma2", "Gemma2Config"), ("gemma3", "Gemma3TextConfig")])
@pytest.mark.parametrize("layers", [2, 6, 7])
def test_gemmas_pattern_is_the_hf_config_classs_own(tmp_path, family, config_class, layers):
    import transformers

    config = getattr(transformers, config_class)(**{**SMALL, "num_hidden_layers": layers, "head_dim": 8})
    file = _hub_file(tmp_path, config)
    ours = [FAMILIES[family].layer_fields(file, layer)["sliding_window"] is not None for layer in range(layers)]
    assert ours == _hf_pattern(config)


@pytest.mark.parametrize("layer_types, wrong", [
    (["sliding_attention"], "a list of 3 attention types"),  # shorter than the layers
    ("sliding_attention", "a list of 3 attention types"),  # a string
    (["sliding_attention", "full_attention", "bogus"], "made of full_attention and sliding_attention"),
    ([], "a list of 3 attention types"),
    ([0, 1, 0], "a list of 3 attention types"),
    (["sliding_attention", "chunked_attention", "full_attention"], "made of full_attention and sliding_attention"),
])
@pytest.mark.parametrize("family", ["gemma2", "qwen2"])
def test_layer_types_hf_refuses_are_refused_by_name(tmp_path, family, layer_types, wrong):
    file = ConfigFile(tmp_path / "config.json", {"num_hidden_layers": 3, "use_sliding_window": True,
                                                 "sliding_window": 4, "layer_types": layer_types})
    with pytest.raises(WeightsError, match=f"layer_types must be {wrong}"):
        FAMILIES[family].layer_fields(file, 0)


def _model(name, config_class, settings, seed):
    import transformers

    config = getattr(transformers, config_class)(**{**SMALL, **settings})
    torch.manual_seed(seed)
    model = getattr(transformers, name)(config).eval()
    randomise_hf(model, seed=seed)
    return model


@pytest.mark.parametrize("name, config_class, settings", [
    # HF windows every layer of Qwen3-MoE; Qwen2's rule gave a small model no window at all
    ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(num_hidden_layers=3, use_sliding_window=True, head_dim=16, **MOE)),
    # a hub config.json without layer_types: HF slides the even layers below max_window_layers
    ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(num_hidden_layers=3, use_sliding_window=True, max_window_layers=3,
                                                   shared_expert_intermediate_size=40, **MOE)),
])
def test_every_step_of_every_layer_equals_huggingface_on_a_hub_shaped_file(tmp_path, name, config_class, settings):
    model = _model(name, config_class, settings, seed=7)
    model.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    written.pop("layer_types", None)
    (tmp_path / "config.json").write_text(json.dumps(written))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    for layer in range(3):
        block = model.model.layers[layer]
        expected = capture(model, {step: (block.get_submodule(path) if path else block, where)
                                   for step, (path, where) in PLACES.items()}, IDS)
        ours = load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))
        traced = trace(ours, expected["hidden_states"][layer][0], keep_tensors=True).tensors()
        for step in PLACES:
            delta = (traced[step] - expected[step][0]).abs().max().item()
            assert delta <= 1e-5, f"{name} layer {layer} {step}: max |Δ| {delta}"


def test_a_full_attention_layer_of_a_windowed_qwen2_moe_is_traced_bare_without_a_window():
    """--module on HF's own layer: Qwen2-MoE keeps sliding_window on its sliding layers only; its full layers must
    not fall back to the config's window."""
    model = _model("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(num_hidden_layers=3, use_sliding_window=True,
                                                                 max_window_layers=3,
                                                                 shared_expert_intermediate_size=40, **MOE), seed=3)
    assert model.config.layer_types[1] == "full_attention"
    block = model.model.layers[1]
    expected = capture(model, {step: (block.get_submodule(path) if path else block, where)
                               for step, (path, where) in PLACES.items()}, IDS)
    traced = trace(block, expected["hidden_states"][1][0], keep_tensors=True).tensors()
    for step in PLACES:
        delta = (traced[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"layer 1 {step}: max |Δ| {delta}"


def _hf_rotates(family: str, config) -> list[bool]:
    """Which layers HF's attention rotates: SmolLM3's no_rope_layers; EXAONE-4's sliding layers, or every layer of a
    model without a window; OLMo-3 and Granite every layer."""
    layers = range(config.num_hidden_layers)
    if family == "smollm3":
        return [bool(config.no_rope_layers[k]) for k in layers]
    if family == "cohere2":  # Cohere2Attention rotates where it has a window
        return [config.sliding_window is not None and config.layer_types[k] == "sliding_attention" for k in layers]
    if family == "exaone4":
        return [config.sliding_window is None or config.layer_types[k] == "sliding_attention" for k in layers]
    return [True for _ in layers]


NEW_CASES = [*((family, config_class, settings, layers) for family, config_class, settings in [
    ("smollm3", "SmolLM3Config", {"use_sliding_window": True, "no_rope_layer_interval": 2}),
    ("smollm3", "SmolLM3Config", {"use_sliding_window": True}),
    ("smollm3", "SmolLM3Config", {"use_sliding_window": False}),
    ("olmo3", "Olmo3Config", {}),
    ("exaone4", "Exaone4Config", {}),
    ("exaone4", "Exaone4Config", {"sliding_window_pattern": 2}),
    ("exaone4", "Exaone4Config", {"sliding_window_pattern": 3}),
    ("cohere2", "Cohere2Config", {}),
    ("cohere2", "Cohere2Config", {"sliding_window_pattern": 3}),
    ("gpt_oss", "GptOssConfig", {})] for layers in (5, 8)),
    ("smollm3", "SmolLM3Config", {"use_sliding_window": True, "no_rope_layers": [0, 1, 1, 0, 1]}, 5)]


@pytest.mark.parametrize("family, config_class, settings, layers", NEW_CASES)
def test_windows_and_nope_layers_of_the_newer_families_are_their_config_classs(tmp_path, family, config_class,
                                                                                settings, layers):
    """From layer_types (and no_rope_layers) as the class writes them, and from a file without them."""
    import transformers

    config = getattr(transformers, config_class)(**{**SMALL, **settings, "num_hidden_layers": layers, "pad_token_id": 0})
    data = {**settings, **config.to_dict()}  # a key the class reads and drops (Cohere2's sliding_window_pattern) stays
    without = {key: value for key, value in data.items()
               if key != "layer_types" and not (key == "no_rope_layers" and "no_rope_layers" not in settings)}
    for file in (ConfigFile(tmp_path / "c.json", data), ConfigFile(tmp_path / "hub.json", without)):
        fields = [FAMILIES[family].layer_fields(file, layer) for layer in range(layers)]
        assert [f["sliding_window"] is not None for f in fields] == _hf_pattern(config), (family, settings)
        assert [not f.get("nope", False) for f in fields] == _hf_rotates(family, config), (family, settings)


@pytest.mark.parametrize("change, message", [
    ({"no_rope_layers": [1, 0]}, "a list of 3 values"),
    ({"no_rope_layers": [1, 0, 2]}, "a list of 3 values"),
    ({"use_sliding_window": False, "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
     "HF's attention implementations disagree"),
])
def test_smollm3_files_hf_would_read_two_ways_are_refused(tmp_path, change, message):
    data = {"num_hidden_layers": 3, "sliding_window": 4, "no_rope_layers": [1, 1, 0], **change}
    with pytest.raises(WeightsError, match=message):
        FAMILIES["smollm3"].layer_fields(ConfigFile(tmp_path / "config.json", data), 0)


@pytest.mark.parametrize("data, message", [
    ({"rope_theta": 10000.0}, "reaches only the global layers"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1234.0}}, "keyed by layer type"),
])
def test_olmo3_rope_settings_hf_reads_surprisingly_are_refused(tmp_path, data, message):
    """HF's Olmo3Config gives a top-level rope_theta to the global layers only (500000 to the sliding ones) and
    ignores a flat rope_parameters: blocktrace refuses both rather than guess."""
    file = ConfigFile(tmp_path / "config.json", {"num_hidden_layers": 4, "max_position_embeddings": 64, **data})
    with pytest.raises(WeightsError, match=message):
        FAMILIES["olmo3"].layer_fields(file, 0)


@pytest.mark.parametrize("settings", [{}, {"no_rope_layer_interval": 2}, {"attention_chunk_size": None},
                                      {"interleave_moe_layer_step": 2}, {"no_rope_layers": [0, 1, 1, 0, 1]},
                                      {"moe_layers": [0, 3]}])
@pytest.mark.parametrize("layers", [5, 8])
def test_llama4s_chunked_nope_and_sparse_layers_are_its_config_classs(tmp_path, settings, layers):
    """Which layers attend in chunks, which rotate and which are sparse: from the file as Llama4TextConfig writes it,
    and from one without its computed layer_types, no_rope_layers and moe_layers."""
    import transformers

    if layers == 8 and "no_rope_layers" in settings:
        settings = {**settings, "no_rope_layers": [0, 1, 1, 0, 1, 1, 1, 0]}
    config = transformers.Llama4TextConfig(**{**SMALL, "head_dim": 8, **settings, "num_hidden_layers": layers})
    data = config.to_dict()
    without = {key: value for key, value in data.items()
               if key not in ("layer_types", "moe_layers", "no_rope_layers") or key in settings}
    family = FAMILIES["llama4_text"]
    for file in (ConfigFile(tmp_path / "c.json", data), ConfigFile(tmp_path / "hub.json", without)):
        fields = [family.layer_fields(file, layer) for layer in range(layers)]
        assert [f["attention_chunk"] is not None for f in fields] == \
            [kind == "chunked_attention" for kind in config.layer_types]
        assert [not f.get("nope", False) for f in fields] == [bool(v) for v in config.no_rope_layers]
        assert [f.get("experts", True) is not None for f in fields] == \
            [layer in config.moe_layers for layer in range(layers)]
