import re

import pytest

from blocktrace.config import (AttentionParts, BlockConfig, Experts, FFNKind, GLUClamp, Norm, Placement, QKNorm,
                               QKSpan, QueryTemperature, RouterKind)
from blocktrace.render.text import config_settings
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


MOE = dict(d_model=8, n_heads=2, ffn="swiglu", norm="rmsnorm")


def test_a_mixture_of_experts_is_one_piece_that_round_trips_through_dicts():
    experts = Experts(n_experts=8, experts_per_token=2, router="sigmoid_grouped", expert_groups=4, groups_per_token=2,
                      choice_bias=True, routed_scaling=2.5, shared_expert_d_ff=16, shared_expert_gated=False)
    config = BlockConfig(**MOE, experts=experts)
    assert config.experts.router is RouterKind.SIGMOID_GROUPED
    assert BlockConfig.from_dict(config.to_dict()) == config
    assert str(experts) == ("top-2 of 8, renormalised, shared 16 ungated router=sigmoid_grouped expert_groups=4 "
                            "groups_per_token=2 routed_scaling=2.5 choice_bias=True")


def test_a_trace_written_with_the_expert_settings_one_by_one_is_read_back_with_its_experts():
    """Before the experts were one piece, to_dict wrote n_experts, router, … at the top level: dropped as unknown
    keys, such a trace would come back as a dense block."""
    old = {**BlockConfig(**MOE).to_dict(), "n_experts": 4, "experts_per_token": 1, "renormalise_top_k": False,
           "router": "softmax", "shared_expert_d_ff": None}
    del old["experts"]
    assert BlockConfig.from_dict(old).experts == Experts(n_experts=4, experts_per_token=1, renormalise_top_k=False)
    dense = {key: value for key, value in old.items() if key not in ("experts_per_token", "renormalise_top_k")}
    assert BlockConfig.from_dict({**dense, "n_experts": None}).experts is None


def test_a_family_writes_its_expert_settings_one_by_one_and_a_layer_may_make_them_dense():
    sparse = BlockConfig(**MOE).replace_settings({"n_experts": 4, "experts_per_token": 2, "router": "softmax"})
    assert sparse.experts == Experts(n_experts=4)
    assert sparse.replace_settings({"experts_per_token": 1}).experts == Experts(n_experts=4, experts_per_token=1)
    assert sparse.replace_settings({"n_experts": None, "router": "softmax", "d_ff": 12}).experts is None
    with pytest.raises(ConfigError, match="shared expert belongs to a mixture of experts"):
        sparse.replace_settings({"n_experts": None, "shared_expert_d_ff": 8})
    with pytest.raises(ConfigError, match="choice_bias belong to a mixture of experts: set n_experts"):
        BlockConfig(**MOE).replace_settings({"choice_bias": True})


@pytest.mark.parametrize("settings, message", [
    (dict(n_experts=2, experts_per_token=3), "each token cannot go to 3 of 2 experts"),
    (dict(n_experts=0), "n_experts must be a positive integer"),
    (dict(n_experts=4, router="softmax_biased"), "it needs choice_bias"),
    (dict(n_experts=4, expert_groups=2), "set router"),
    (dict(n_experts=6, router="sigmoid_grouped", expert_groups=4, groups_per_token=1), "dividing the 6 experts"),
])
def test_an_impossible_mixture_of_experts_is_refused_by_name(settings, message):
    with pytest.raises(ConfigError, match=message):
        Experts(**settings)


def test_experts_are_gated_ffns():
    with pytest.raises(ConfigError, match="has no gate"):
        BlockConfig(d_model=8, n_heads=2, ffn="gelu", experts=Experts(n_experts=2))


LLAMA4_NOPE = dict(d_model=8, n_heads=2, norm="rmsnorm", ffn="swiglu")


def test_the_query_temperature_and_the_glu_clamp_are_pieces_that_round_trip_and_are_said():
    tempered = BlockConfig(**LLAMA4_NOPE, attention=AttentionParts(temperature=QueryTemperature(8192, 0.1)))
    clamped = BlockConfig(**{**LLAMA4_NOPE, "ffn": "swiglu_clamped"}, glu_clamp=GLUClamp(7.0, 1.702))
    for config in (tempered, clamped):
        assert BlockConfig.from_dict(config.to_dict()) == config
    assert "attention='query temperature 1 + 0.1·ln(1 + ⌊(i + 1)/8192⌋)'" in config_settings(tempered.to_dict())
    assert "glu_clamp='limit 7, alpha 1.702'" in config_settings(clamped.to_dict())


def test_a_clamped_glu_without_its_clamp_gets_gpt_oss_values_and_says_them():
    """Every default assumed is said: the clamp differs from BlockConfig's default (none), so the header shows it."""
    config = BlockConfig(**{**LLAMA4_NOPE, "ffn": "swiglu_clamped"})
    assert config.glu_clamp == GLUClamp(limit=7.0, alpha=1.702)
    assert "glu_clamp='limit 7, alpha 1.702'" in config_settings(config.to_dict())


@pytest.mark.parametrize("make, message", [
    (lambda: QueryTemperature(0), "floor must be a positive integer, not 0"),
    (lambda: QueryTemperature(True), "floor must be a positive integer, not True"),
    (lambda: QueryTemperature(8, scale=float("nan")), "scale must be a finite number, not nan"),
    (lambda: GLUClamp(limit=float("inf")), "limit must be a positive number, not inf"),
    (lambda: GLUClamp(alpha=0), "alpha must be a positive number, not 0"),
    (lambda: BlockConfig(**LLAMA4_NOPE, glu_clamp=GLUClamp()), "clamps nothing"),
])
def test_an_impossible_piece_is_refused_by_name(make, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


def test_any_finite_query_temperature_scale_is_computed_as_hf_computes_it():
    assert QueryTemperature(8, scale=-0.1).scale == -0.1 and QueryTemperature(8, scale=0).scale == 0


def test_a_trace_written_with_the_settings_one_by_one_is_read_back_with_its_pieces():
    """Before they were pieces, to_dict wrote temperature_floor/temperature_scale and glu_limit/glu_alpha at the top
    level: read back into the pieces, not dropped (dropped, the layer would come back untempered, or clamped at
    gpt-oss's values whatever the file said)."""
    old = {**BlockConfig(**LLAMA4_NOPE).to_dict(), "temperature_floor": 16, "temperature_scale": 0.25,
           "glu_limit": 7.0, "glu_alpha": 1.702}
    del old["attention"], old["glu_clamp"]
    assert BlockConfig.from_dict(old).attention.temperature == QueryTemperature(16, 0.25)
    assert BlockConfig.from_dict(old).glu_clamp is None  # a SwiGLU that does not clamp: its clamp fields unread
    assert BlockConfig.from_dict({**old, "temperature_floor": None}).attention is None
    clamped = {**old, "ffn": "swiglu_clamped", "glu_limit": 5.0, "glu_alpha": 2.0}
    assert BlockConfig.from_dict(clamped).glu_clamp == GLUClamp(5.0, 2.0)


def test_a_qk_norm_is_one_piece_true_naming_qwen3s_and_its_dict_read_back():
    """`qk_norm=True` (the CLI's --qk-norm, most families) is the common QK-norm: per head, before RoPE, a gain."""
    assert BlockConfig(qk_norm=True).qk_norm == QKNorm(QKSpan.HEAD, after_rope=False, gain=True)
    assert BlockConfig(qk_norm=False).qk_norm is None
    for norm in (QKNorm(), QKNorm("all_heads"), QKNorm(after_rope=True), QKNorm(after_rope=True, gain=False)):
        config = BlockConfig(d_model=8, n_heads=2, rope_theta=1e4, qk_norm=norm)
        assert BlockConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("make, message", [
    (lambda: QKNorm("all_heads", after_rope=True), "after_rope needs span head"),
    (lambda: QKNorm("rows"), "qk_norm must be one of head, all_heads, not 'rows'"),
    (lambda: QKNorm(gain=1), "the QK-norm's gain must be true or false, not 1"),
    (lambda: BlockConfig(qk_norm="yes"), "qk_norm must be true, false or a QKNorm (span, after_rope, gain), not 'yes'"),
    (lambda: BlockConfig(qk_norm={"whole": True}), "not {'whole': True}"),
])
def test_an_impossible_qk_norm_is_refused_by_name(make, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make()


@pytest.mark.parametrize("flags, piece", [
    ({"qk_norm": True}, QKNorm()),
    ({"qk_norm": True, "qk_norm_whole": True}, QKNorm(QKSpan.ALL_HEADS)),  # OLMo-2's
    ({"qk_norm": True, "qk_norm_after_rope": True}, QKNorm(after_rope=True)),  # Hunyuan's
    ({"qk_norm": False, "qk_l2_norm": True}, QKNorm(after_rope=True, gain=False)),  # Llama-4's
    ({"qk_norm": False, "qk_norm_whole": False, "qk_norm_after_rope": False, "qk_l2_norm": False}, None),
])
def test_a_trace_written_with_four_qk_norm_flags_is_read_back_as_the_piece(flags, piece):
    """Before the QK-norm was a piece, to_dict wrote qk_norm, qk_norm_whole, qk_norm_after_rope and qk_l2_norm: read
    back into the one piece (dropped, OLMo-2's norm would come back per head, and its weights would not fit)."""
    old = {**BlockConfig(d_model=8, n_heads=2, rope_theta=1e4).to_dict(), **flags}
    assert BlockConfig.from_dict(old).qk_norm == piece


def test_the_header_says_the_qk_norm_as_one_setting():
    llama4 = BlockConfig(d_model=8, n_heads=2, rope_theta=1e4, qk_norm=QKNorm(after_rope=True, gain=False))
    assert "qk_norm='RMSNorm per head, after RoPE, no gain'" in config_settings(llama4.to_dict())
    assert "qk_norm='RMSNorm over all heads, before RoPE'" in config_settings(
        BlockConfig(qk_norm=QKNorm("all_heads")).to_dict())
    assert "qk_norm" not in config_settings(BlockConfig().to_dict())


def test_the_attention_parts_one_family_adds_are_one_piece_gathered_from_a_familys_settings_and_older_traces():
    """Issue 43: Gemma-2's cap, Llama-4's chunks and temperature and gpt-oss's sinks were four BlockConfig fields,
    each read by one family; a family still writes them one by one, and a trace written before holds them so."""
    from blocktrace.config import gathered_attention

    assert gathered_attention({"attn_softcap": 50.0, "d_model": 8}) == {"d_model": 8,
                                                                       "attention": AttentionParts(softcap=50.0)}
    assert gathered_attention({"attn_softcap": None}, AttentionParts(softcap=50.0, sinks=True)) == \
        {"attention": AttentionParts(sinks=True)}  # a layer's setting over the model's
    assert gathered_attention({"attention_chunk": None}) == {"attention": None}  # nothing added: no piece
    older = {key: value for key, value in BlockConfig(**LLAMA4_NOPE).to_dict().items() if key != "attention"}
    read = BlockConfig.from_dict({**older, "attn_softcap": 30.0, "attention_chunk": 4, "attn_sinks": True})
    assert read.attention == AttentionParts(softcap=30.0, chunk=4, sinks=True)
    assert "attention='softcap 30, chunks of 4, sinks'" in config_settings(read.to_dict())
    assert BlockConfig.from_dict(read.to_dict()) == read
    with pytest.raises(ConfigError, match="attention_chunk 0 needs a positive width"):
        AttentionParts(chunk=0)
    with pytest.raises(ConfigError, match="attn_softcap must be a positive number"):
        AttentionParts(softcap=-1.0)
