import pytest

from blocktrace.config import BlockConfig, FFNKind, Norm, Placement
from blocktrace.errors import ConfigError


def test_defaults_are_gpt2_wiring():
    config = BlockConfig()
    assert config.d_ff == 4 * config.d_model
    assert (config.norm, config.ffn, config.placement, config.causal) == (
        Norm.LAYERNORM, FFNKind.GELU_TANH, Placement.PRE, True)


def test_strings_become_enums_and_round_trip_through_dicts():
    config = BlockConfig(d_model=8, n_heads=2, norm="rmsnorm", ffn="swiglu", placement="post")
    assert config.norm is Norm.RMSNORM and config.ffn is FFNKind.SWIGLU
    assert BlockConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(d_model=6, n_heads=4), "not divisible by heads 4: pick heads among 1, 2, 3, 6"),
        (dict(d_model=0), "d_model must be a positive integer"),
        (dict(d_model=8, n_heads=-2), "n_heads must be a positive integer"),
        (dict(d_ff=0), "d_ff must be a positive integer"),
        (dict(norm="batchnorm"), "norm must be one of layernorm, rmsnorm"),
        (dict(ffn="tanh"), "ffn must be one of gelu, gelu_tanh, relu, relu2, swiglu"),
        (dict(eps=0.0), "eps must be positive"),
    ],
)
def test_invalid_values_raise_a_clear_error(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        BlockConfig(**fields)
