"""GPT-2 checkpoints: every traced step equals what HuggingFace computes at the same place."""

from __future__ import annotations

import pytest
from helpers import TOKEN_IDS, hf_block_values

from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace


@pytest.mark.parametrize("layer", [0, 2])
def test_every_step_matches_huggingface(gpt2_checkpoint, layer):
    directory, hf_model = gpt2_checkpoint
    reference = hf_block_values(hf_model, layer, TOKEN_IDS)
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    block = load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))
    traced = trace(block, reference["x"], keep_tensors=True)
    ours = traced.tensors()
    for name in ("norm1", "attn", "residual1", "norm2", "ffn", "residual2", "attn_weights"):
        delta = (ours[name] - reference[name]).abs().max().item()
        assert delta <= 1e-5, f"{name}: max |Δ| {delta}"


@pytest.mark.parametrize("layer", [0, 1, 2])
def test_token_ids_give_the_input_huggingface_feeds_the_block(gpt2_checkpoint, layer):
    directory, hf_model = gpt2_checkpoint
    reference = hf_block_values(hf_model, layer, TOKEN_IDS)
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    x = hidden_state_before(checkpoint, info, config, embed_token_ids(checkpoint, info, TOKEN_IDS), layer)
    assert (x - reference["hidden_state"][0]).abs().max().item() <= 1e-5


def test_config_comes_from_config_json(gpt2_checkpoint):
    directory, hf_model = gpt2_checkpoint
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    assert (config.d_model, config.n_heads, config.d_ff, config.eps) == (32, 4, 128, hf_model.config.layer_norm_epsilon)
    assert config.ffn.value == "gelu_tanh"  # HF's default activation_function is gelu_new
    assert info.n_layers == 3 and info.vocab_size == 101 and info.n_positions == 64
