"""The wiring table (blocktrace.wiring) against the block written out by hand, wiring by wiring."""

import pytest
import torch

from blocktrace.config import BlockConfig, Parallel
from blocktrace.errors import ConfigError
from blocktrace.model.block import build_block, step_operations
from blocktrace.wiring import PARALLEL, WIRINGS


def by_hand(block, x):
    """Each wiring's forward, written out as its paper writes it."""
    b, placement = block, block.config.placement.value
    if placement in ("post", "deepnorm"):
        a = block.config.residual_scale
        x1 = b.norm1(a * x + b.attn(x))
        return b.norm2(a * x1 + b.ffn(x1))
    if placement == "reordered":
        x1 = x + b.norm1(b.attn(x))
        return x1 + b.norm2(b.ffn(x1))
    if placement == "sandwich":
        x1 = x + b.post_attn_norm(b.attn(b.norm1(x)))
        return x1 + b.post_ffn_norm(b.ffn(b.norm2(x1)))
    if block.config.parallel_residual is Parallel.ONE_NORM:  # Cohere: both sublayers read norm1(x)
        return x + b.attn(b.norm1(x)) + b.ffn(b.norm1(x))
    x1 = x + b.attn(b.norm1(x))
    return x1 + b.ffn(b.norm2(x if block.config.parallel_residual is Parallel.TWO_NORMS else x1))


CASES = [dict(placement=p.value) for p in WIRINGS] + [dict(parallel_residual=True), dict(parallel_residual="one_norm")]


@pytest.mark.parametrize("fields", CASES, ids=lambda f: "-".join(str(v) for v in f.values()))
def test_the_block_runs_its_wiring(fields):
    block = build_block(BlockConfig(d_model=16, n_heads=4, n_layers=3, **fields), seed=5)
    x = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(2)) * 2
    with torch.no_grad():
        assert torch.allclose(block(x), by_hand(block, x), atol=1e-6, rtol=1e-6)


def test_every_wiring_reads_only_what_was_computed_before_and_ends_in_a_sum_or_a_norm():
    for wiring in (*WIRINGS.values(), PARALLEL):
        seen = {"x"}
        for step in wiring.steps:
            assert set(step.reads) <= seen, (wiring.name, step.name)
            seen.add(step.name)
        assert wiring.stream_normalised == (wiring.placement.value in ("post", "deepnorm"))


def test_the_parallel_residual_is_one_setting_true_naming_neoxs_two_norms_and_older_traces_read_back():
    assert BlockConfig(parallel_residual=True).parallel_residual is Parallel.TWO_NORMS
    assert BlockConfig(parallel_residual=False).parallel_residual is Parallel.OFF
    config = BlockConfig(d_model=8, n_heads=2, parallel_residual="one_norm")
    assert BlockConfig.from_dict(config.to_dict()) == config
    # before it was one setting, a trace held parallel_residual and Cohere's one_norm as two booleans
    old = {**config.to_dict(), "parallel_residual": True, "one_norm": True}
    assert BlockConfig.from_dict(old).parallel_residual is Parallel.ONE_NORM
    assert BlockConfig.from_dict({**old, "one_norm": False}).parallel_residual is Parallel.TWO_NORMS
    with pytest.raises(ConfigError, match="parallel_residual must be one of off, two_norms, one_norm, not 'three'"):
        BlockConfig(parallel_residual="three")
    with pytest.raises(ConfigError, match="needs Pre-LN wiring"):
        BlockConfig(parallel_residual="one_norm", placement="post")


def test_the_parallel_formulas_say_what_the_ffn_reads():
    operations = step_operations(BlockConfig(d_model=8, n_heads=2, parallel_residual=True))
    assert operations["norm2"] == "x_norm2 = LayerNorm(x)  (parallel: reads x, not x1)"
    assert operations["residual2"] == "x2 = x1 + ffn_out  (= x + attn_out + ffn_out)"
    deep = step_operations(BlockConfig(d_model=8, n_heads=2, placement="deepnorm", n_layers=2))
    assert deep["residual1"] == "r1 = 1.414·x + attn_out" and deep["norm1"] == "x1 = LayerNorm(r1)"


def test_every_step_of_every_wiring_is_explained_in_both_languages_and_parallel_says_what_norm2_reads():
    from blocktrace.render.words import explanation
    from blocktrace.vocab import Lang

    for wiring in (*WIRINGS.values(), PARALLEL):
        for lang in Lang:
            assert all(explanation(lang, wiring, name) for name in wiring.order)
    # Once the parallel block borrowed Pre-LN's sentence, "Normalises x1 again", for a norm that reads x.
    assert "x1" not in explanation(Lang.EN, PARALLEL, "norm2").split(",")[0]
    assert explanation(Lang.EN, PARALLEL, "norm2") != explanation(Lang.EN, WIRINGS[PARALLEL.placement], "norm2")


@pytest.mark.parametrize("placement", ["pre", "sandwich", "reordered"])
def test_a_layers_update_share_is_that_of_the_update_its_sum_adds(placement):
    """Once attn_share was Var[attn_out] / Var[x1] under every wiring; sandwich and reordered add a normed update."""
    from blocktrace.tracing.stack import summarise
    from blocktrace.tracing.tracer import trace

    block = build_block(BlockConfig(d_model=16, n_heads=4, placement=placement), seed=1)
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(4)) * 3
    traced = trace(block, x, keep_tensors=True)
    t = traced.tensors()
    added = {"pre": ("attn", "ffn"), "sandwich": ("post_attn_norm", "post_ffn_norm"), "reordered": ("norm1", "norm2")}
    attn_update, ffn_update = added[placement]
    summary = summarise(0, traced)

    def share(update, total):
        return float(t[update].double().std() / t[total].double().std()) ** 2

    assert summary.attn_share == pytest.approx(share(attn_update, "residual1"), rel=1e-4)
    assert summary.ffn_share == pytest.approx(share(ffn_update, "residual2"), rel=1e-4)
