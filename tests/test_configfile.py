"""sources/configfile.py: config numbers and lists validated before use (issue 33): each value that used to raise a
traceback deep inside (a division by zero, a log of a negative number, an index list that is not one) is one error
line naming the key."""

from __future__ import annotations

import json
import shutil

import pytest

LLAMA = "sample_weights/llama-tiny"
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
LONGROPE = {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}


def _one_error(result, *words):
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], (word, lines[0])


def _llama_with(tmp_path, **changes):
    target = tmp_path / "llama"
    shutil.copytree(LLAMA, target)
    config = json.loads((target / "config.json").read_text())
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return target


@pytest.mark.parametrize("changes, key", [
    ({"rope_scaling": {**YARN, "mscale": 1.0, "mscale_all_dim": -10 / 1.3862943611198906}}, "mscale_all_dim"),
    ({"rope_scaling": YARN, "rope_theta": 1.0}, "rope_theta"),
    ({"rope_scaling": {**YARN, "beta_fast": -32.0}}, "beta_fast"),
    ({"rope_scaling": {**YARN, "beta_slow": -1.0}}, "beta_slow"),
    ({"rope_scaling": LONGROPE, "original_max_position_embeddings": 1}, "original_max_position_embeddings"),
])
def test_rope_values_that_break_its_formulas_are_refused_by_key(invoke, tmp_path, changes, key):
    weights = _llama_with(tmp_path, **changes)
    _one_error(invoke("check", "--weights", str(weights), "--token-ids", "1", "2", "3"), key)


@pytest.mark.parametrize("value", [5, "x", [0, "1"], [-1]])
def test_mlp_only_layers_must_be_a_list_of_layer_indices(tmp_path, value):
    from blocktrace.errors import WeightsError
    from blocktrace.sources.configfile import ConfigFile
    from blocktrace.sources.families import FAMILIES

    config = ConfigFile(tmp_path / "config.json", {"num_hidden_layers": 2, "mlp_only_layers": value,
                                                   "intermediate_size": 8})
    with pytest.raises(WeightsError, match="mlp_only_layers must be a list of layer indices"):
        FAMILIES["qwen2_moe"].layer_fields(config, 0)


def test_an_odd_head_dim_is_blamed_on_head_dim_not_rope_theta(invoke, tmp_path):
    result = invoke("check", "--weights", str(_llama_with(tmp_path, head_dim=15)), "--token-ids", "1", "2")
    _one_error(result, "head_dim = 15", "even")
    assert "rope_theta" not in result.output


def test_a_null_cohere_logit_scale_is_refused_by_key_not_traced_back(invoke, tmp_path):
    """Issue 45.3: Cohere's "logit_scale": null raised a TypeError in the head; HF multiplies its logits by it and
    cannot run such a config either, so no default stands in for it."""
    import transformers

    config = transformers.CohereConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                       num_key_value_heads=2, num_hidden_layers=1, vocab_size=50, pad_token_id=0,
                                       bos_token_id=1, eos_token_id=1)
    transformers.CohereForCausalLM(config).save_pretrained(tmp_path / "cohere")
    path = tmp_path / "cohere" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "logit_scale": None}))
    _one_error(invoke("check", "--weights", str(tmp_path / "cohere"), "--token-ids", "1", "2", "3"),
               "logit_scale is null", "config.json")


@pytest.mark.parametrize("key, value, said", [
    ("topk_group", 8, "topk_group ≤ n_group, not 4 and 8"),
    ("qk_rope_head_dim", 7, "qk_rope_head_dim must be even, not 7"),
])
def test_deepseeks_config_errors_are_said_in_its_own_keys(invoke, tmp_path, key, value, said):
    """Issue 45.3: a DeepSeek config.json's bad group or latent size was refused in blocktrace's internal field
    names (groups_per_token, rope_dims), without the file."""
    from helpers import make_deepseek

    small = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, vocab_size=101,
                 max_position_embeddings=64)
    make_deepseek("deepseek_v3", small, 7).save_pretrained(tmp_path / "ds")
    path = tmp_path / "ds" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    result = invoke("check", "--weights", str(tmp_path / "ds"), "--token-ids", "1", "2", "3")
    _one_error(result, said, "config.json")
    assert "groups_per_token" not in result.stderr and "rope_dims" not in result.stderr


@pytest.mark.parametrize("family, key", [("gpt_oss", "sliding_window"), ("llama4_text", "attention_chunk_size")])
def test_a_null_window_or_chunk_of_a_layer_that_needs_one_is_refused_by_key(invoke, tmp_path, family, key):
    """Issue 45.3: gpt-oss's sliding_window null and Llama-4's attention_chunk_size null, where layer_types mark a
    sliding or chunked layer (HF raises a TypeError there), were traced as full attention without a word. (Without
    layer_types, Llama4TextConfig makes no layer chunked when the size is null: tests/test_window_rules.py.)"""
    import transformers
    from helpers import LLAMA4

    small = dict(hidden_size=32, num_attention_heads=4, intermediate_size=64, num_hidden_layers=3, vocab_size=101,
                 max_position_embeddings=64)
    if family == "gpt_oss":
        model = transformers.GptOssForCausalLM(transformers.GptOssConfig(
            **small, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"], pad_token_id=0, eos_token_id=1))
    else:
        model = transformers.Llama4ForCausalLM(transformers.Llama4TextConfig(**{**small, **LLAMA4},
                                                                             num_experts_per_tok=1))
    model.save_pretrained(tmp_path / family)  # its layer_types mark sliding or chunked layers
    path = tmp_path / family / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: None}))
    _one_error(invoke("check", "--weights", str(tmp_path / family), "--token-ids", "1", "2", "3"),
               f"{key} is null", "config.json", "HF's default")
