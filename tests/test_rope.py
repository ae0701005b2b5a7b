"""RoPE's scaling variants (llama3, yarn, dynamic, longrope, linear), read from a config.json as
blocktrace reads it, against HF's own rotary embedding at positions within and past the
original context, where the variants differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from blocktrace.config import BlockConfig
from blocktrace.errors import ConfigError, WeightsError
from blocktrace.model.rope import RotaryEmbedding
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import rope_fields

HEAD = 16  # 8 frequencies: wavelengths from 2π to ~2π·θ^(7/8), across every band below
BASE = dict(hidden_size=64, num_attention_heads=4, head_dim=HEAD, max_position_embeddings=32)
LONG = [1.0 + 0.5 * i for i in range(HEAD // 2)]
SHORT = [1.0 + 0.05 * i for i in range(HEAD // 2)]

VARIANTS = {
    "linear": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}},
    "llama3": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 16,
                                   "rope_theta": 500.0}},
    "yarn": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                 "rope_theta": 10000.0}},
    "yarn deepseek mscale": {"rope_parameters": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                                                 "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2,
                                                 "original_max_position_embeddings": 8, "rope_theta": 10000.0}},
    "yarn untruncated": {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                                             "truncate": False, "rope_theta": 10000.0}},
    "dynamic": {"rope_parameters": {"rope_type": "dynamic", "factor": 3.0, "rope_theta": 10000.0}},
    "longrope": {"rope_parameters": {"rope_type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                     "original_max_position_embeddings": 8, "rope_theta": 10000.0}},
    # Llama-4-Scout's own: equal low and high factors, so no wavelength is smoothed (HF computes it; it was refused)
    "llama3 equal factors": {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                 "high_freq_factor": 1.0, "original_max_position_embeddings": 16,
                                                 "rope_theta": 500.0}},
    # An older config.json: rope_scaling beside a top-level rope_theta (transformers 5 folds it in).
    "llama3 old keys": {"rope_theta": 500.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}},
    "partial dynamic": {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.5}},
}


def hf_rotary(settings: dict):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    return LlamaRotaryEmbedding(LlamaConfig(**BASE, **json.loads(json.dumps(settings))))


def ours(settings: dict) -> RotaryEmbedding:
    fields = rope_fields(ConfigFile(Path("config.json"), {**BASE, **settings}))
    config = BlockConfig(d_model=64, n_heads=4, head_size=HEAD, norm="rmsnorm", ffn="swiglu", **fields)
    return RotaryEmbedding(config.rotary_dims, config.rope_theta, config.rope_scaling)


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("t", [6, 31, 32, 33, 100])  # within, at and past both contexts (8 or 16, and 32)
def test_cos_and_sin_equal_huggingface_within_and_past_the_original_context(name, t):
    hf = hf_rotary(VARIANTS[name])  # a fresh one: HF's dynamic and longrope keep state between calls
    rope = ours(VARIANTS[name])
    dims = rope.dims
    expected_cos, expected_sin = hf(torch.zeros(1, t, HEAD), torch.arange(t)[None])
    cos, sin = rope.cos_sin(t, "cpu", torch.float32)
    assert torch.allclose(cos, expected_cos[0, :, :dims], rtol=1e-6, atol=1e-6), name
    assert torch.allclose(sin, expected_sin[0, :, :dims], rtol=1e-6, atol=1e-6), name


def test_the_variants_really_differ_from_plain_rope_where_they_should():
    """So the comparisons above are not of plain RoPE with itself."""
    plain = ours({"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}).cos_sin(100, "cpu",
                                                                                            torch.float32)[0]
    for name in ("yarn", "longrope", "dynamic"):
        assert (ours(VARIANTS[name]).cos_sin(100, "cpu", torch.float32)[0] - plain).abs().max() > 0.1, name
    dynamic = ours(VARIANTS["dynamic"])
    assert torch.equal(dynamic.cos_sin(32, "cpu", torch.float32)[0], plain[:32])  # within max positions: plain
    longrope = ours(VARIANTS["longrope"])
    short, long = longrope.cos_sin(8, "cpu", torch.float32)[0], longrope.cos_sin(9, "cpu", torch.float32)[0][:8]
    assert (short - long).abs().max() > 0.1  # the long factors take over past the original 8 positions


def test_what_the_reader_assumes_matches_huggingface_defaults():
    """yarn's cos/sin scale 0.1·ln 4 + 1 and betas 32/1; longrope without a factor: max/original (32/8), its cos/sin
    scale √(1 + ln f / ln orig)."""
    import math

    yarn = ours(VARIANTS["yarn untruncated"]).scaling
    assert yarn.factor == 4.0 and yarn.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert not yarn.truncate and yarn.beta_fast == 32 and yarn.beta_slow == 1
    longrope = ours(VARIANTS["longrope"]).scaling
    assert longrope.factor == 4.0 and longrope.attention_factor == pytest.approx(math.sqrt(1 + math.log(4) / math.log(8)))
    assert ours(VARIANTS["dynamic"]).scaling.original_positions == 32


@pytest.mark.parametrize("settings, message", [
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}}, "low_freq_factor must be"),
    ({"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                          "original_max_position_embeddings": 16}}, "high_freq_factor >= low_freq_factor > 0"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [1.0],
                          "original_max_position_embeddings": 8}}, "longrope needs 8 short and long factors"),
    ({"rope_parameters": {"rope_type": "longrope", "short_factor": "x", "long_factor": LONG}},
     "rope_parameters.short_factor must be a list of positive numbers"),
    ({"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e4}}, "rope_parameters.factor must be"),
    ({"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 8}}, "rope_scaling.factor must be"),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1e4}}, "rope type 'proportional' is not"),
])
def test_incomplete_or_unknown_rope_settings_are_refused_by_name(settings, message):
    with pytest.raises((WeightsError, ConfigError), match=message):
        ours(settings)


def test_rope_scaling_survives_a_round_trip_through_a_saved_trace_config():
    config = BlockConfig(d_model=64, n_heads=4, head_size=HEAD, norm="rmsnorm", ffn="swiglu",
                         **rope_fields(ConfigFile(Path("c.json"), {**BASE, **VARIANTS["longrope"]})))
    again = BlockConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert BlockConfig(rope_theta=1e4, rope_scaling=2.0).rope_scaling.factor == 2.0  # older traces: a linear factor


def test_interleaved_rope_in_bfloat16_rotates_in_float32_as_hf_does():
    """Cohere's HF rotation turns q and k in float32 (by cos and sin in the block's dtype) and casts back; blocktrace
    turned them in the block's dtype, a last-bit difference per element in bfloat16."""
    from transformers.models.cohere.modeling_cohere import apply_rotary_pos_emb

    rope = RotaryEmbedding(HEAD, 10000.0, interleaved=True)
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 4, 40, HEAD, generator=generator).to(torch.bfloat16) for _ in range(2))
    cos, sin = rope.cos_sin(40, "cpu", torch.bfloat16)  # CohereRotaryEmbedding's, cast to the input's dtype
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos[None], sin[None])
    assert torch.equal(rope.rotate(q, cos, sin), expected_q) and torch.equal(rope.rotate(k, cos, sin), expected_k)
