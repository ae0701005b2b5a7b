"""`compare`, stacks and gradients: shared parameters, and the published measurements' directions."""

import json
import re

import numpy as np
import pytest
import torch
from helpers import ROOT, SAMPLES

from blocktrace.config import BlockConfig
from blocktrace.diagnose.compare import build_variants, difference
from blocktrace.model.stack import build_stack
from blocktrace.tracing.stack import summarise, trace_stack
from blocktrace.vocab import Axis

XIONG = dict(d_model=128, n_heads=1, d_ff=128, ffn="relu")  # Xiong et al. 2020's setting, with --init xiong


def _json(invoke, *args):
    result = invoke(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("extra", [[], ["--d-model", "4", "--heads", "2", "--tokens", "猫", "吃", "鱼"]])
def test_compare_shows_both_execution_orders_side_by_side(invoke, extra):
    result = invoke("compare", "--pre-ln", "--post-ln", *extra)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()
            if line.split() and line.split()[0] in ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")}
    pre_order = {name: int(cells[1]) for name, cells in rows.items()}
    assert pre_order == {"norm1": 1, "attn": 2, "residual1": 3, "norm2": 4, "ffn": 5, "residual2": 6}
    report = _json(invoke, "compare", "--pre-ln", "--post-ln", *extra)
    post_steps = [s["name"] for s in report["variants"][1]["report"]["steps"]]
    assert post_steps == ["attn", "residual1", "norm1", "ffn", "residual2", "norm2"]
    assert "x1 = LayerNorm(r1)" in result.stdout and "x_norm1 = LayerNorm(x)" in result.stdout


def _parameters(variant):
    return {f"{i}.{name}": p for i, block in enumerate(variant.blocks) for name, p in block.named_parameters()}


@pytest.mark.parametrize("axis, values", [("placement", ["pre", "post"]), ("norm", ["layernorm", "rmsnorm"]),
                                          ("ffn", ["gelu", "swiglu"]), ("ffn", ["relu", "gelu_tanh"])])
def test_variants_share_their_parameters(axis, values):
    a, b = build_variants(BlockConfig(d_model=8, n_heads=2), Axis(axis), values, n_layers=3, seed=4)
    pa, pb = _parameters(a), _parameters(b)
    alias = {"ffn.up.": "ffn.fc.", "ffn.down.": "ffn.proj."}
    shared = 0
    for name, tensor in pb.items():
        original = name
        for new, old in alias.items():
            original = original.replace(new, old)
        if original in pa and pa[original].shape == tensor.shape:
            assert torch.equal(pa[original], tensor), name
            shared += 1
    assert shared >= len(pb) - 2 * 3  # at most SwiGLU's gate weight and bias (per layer) are its own
    if "swiglu" in values:
        assert b.unshared == ["ffn.gate.weight", "ffn.gate.bias"]


def test_compare_on_checkpoint_weights_uses_the_checkpoint_parameters():
    from blocktrace.sources.checkpoint import Checkpoint
    from blocktrace.sources.families import checkpoint_config, model_info
    from blocktrace.sources.loader import load_block

    checkpoint = Checkpoint(SAMPLES / "gpt2-tiny")
    info = model_info(checkpoint)
    native = checkpoint_config(checkpoint, info, {})
    source = [load_block(checkpoint, info, 2, native)]
    pre, post = build_variants(native, Axis.PLACEMENT, ["pre", "post"], n_layers=1, seed=0, source=source)
    for name, parameter in source[0].named_parameters():
        assert torch.equal(dict(post.blocks[0].named_parameters())[name], parameter)
        assert torch.equal(dict(pre.blocks[0].named_parameters())[name], parameter)


@pytest.mark.parametrize("own", ["all_heads", "l2"])
def test_compare_qk_norm_on_keeps_a_blocks_own_qk_norm_and_its_weights(own):
    """OLMo-2's QK-norm spans all heads and Llama-4's has no gain: `--qk-norm` on keeps the block's own, so its
    weights are the checkpoint's (a per-head one would be new, unshared parameters of another shape)."""
    from blocktrace.config import QKNorm
    from blocktrace.model.block import build_block

    norm = QKNorm("all_heads") if own == "all_heads" else QKNorm(after_rope=True, gain=False)
    native = BlockConfig(d_model=8, n_heads=2, norm="rmsnorm", ffn="swiglu", rope_theta=1e4, qk_norm=norm)
    source = [build_block(native, seed=3)]
    off, on = build_variants(native, Axis.QK_NORM, ["off", "on"], n_layers=1, seed=0, source=source)
    assert on.config.qk_norm == norm and on.unshared == [] and off.config.qk_norm is None
    for name, parameter in source[0].named_parameters():
        assert torch.equal(dict(on.blocks[0].named_parameters())[name], parameter)


def test_compare_qk_norm_from_a_block_without_one_adds_qwen3s(invoke):
    """`blocktrace compare --qk-norm` on the default block (no QK-norm of its own): the "on" variant gets Qwen3's
    per-head RMSNorm (it raised a NameError before)."""
    report = _json(invoke, "compare", "--qk-norm")
    assert [v["value"] for v in report["variants"]] == ["off", "on"]
    off, on = build_variants(BlockConfig(d_model=8, n_heads=2), Axis.QK_NORM, ["off", "on"], n_layers=1, seed=0)
    assert off.config.qk_norm is None and on.config.qk_norm is not None
    assert any("q_norm" in name for name, _ in on.blocks[0].named_parameters())


def test_compare_with_weights_runs(invoke):
    report = _json(invoke, "compare", "--pre-ln", "--post-ln", "--weights", str(SAMPLES / "gpt2-tiny"), "--layer", "2",
                   "--token-ids", "1", "2", "3")
    assert report["weights"]["layer"] == 2 and [v["value"] for v in report["variants"]] == ["pre", "post"]
    # The checkpoint's own wiring (pre) gives the same steps as `run` does (to float32 rounding: the
    # variant holds contiguous copies of the weights `run` reads as transposed views).
    run = _json(invoke, "run", "--weights", str(SAMPLES / "gpt2-tiny"), "--layer", "2", "--token-ids", "1", "2", "3")
    for ours, theirs in zip(report["variants"][0]["report"]["steps"], run["steps"]):
        assert ours["name"] == theirs["name"]
        assert list(ours["stats"].values()) == pytest.approx(list(theirs["stats"].values()), abs=1e-5)


def test_difference_matches_numpy():
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    d = difference(a, b)
    an, bn = a.numpy().ravel().astype(float), b.numpy().ravel().astype(float)
    assert d["max_abs_diff"] == pytest.approx(np.abs(an - bn).max())
    assert d["cosine"] == pytest.approx(an @ bn / np.linalg.norm(an) / np.linalg.norm(bn))


def test_compare_output_difference_is_that_of_the_two_variants_run_apart(invoke):
    report = _json(invoke, "compare", "--layernorm", "--rmsnorm", "--seq-len", "4")
    a, b = build_variants(BlockConfig(), Axis.NORM, ["layernorm", "rmsnorm"], n_layers=1, seed=0)
    from blocktrace.sources.inputs import random_input

    x = random_input(4, 16, 0, None)
    with torch.no_grad():
        expected = difference(a.blocks[0](x), b.blocks[0](x))
    assert report["differences"]["output"] == pytest.approx(expected)


@pytest.mark.parametrize("args", [
    [], ["--pre-ln"], ["--pre-ln", "--rmsnorm"], ["--gelu", "--relu", "--swiglu"], ["--pre-ln", "--post-ln", "--deepnorm"],
])
def test_compare_needs_two_values_of_one_axis(invoke, args):
    result = invoke("compare", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: compare needs two values of one axis, got ")
    assert len(result.stderr.strip().splitlines()) == 1


def test_compare_refuses_fixing_the_compared_axis(invoke):
    result = invoke("compare", "--pre-ln", "--post-ln", "--placement", "post")
    assert result.exit_code == 2 and "--placement fixes the axis being compared" in result.stderr


def test_compare_works_with_every_table_format(invoke):
    from tabulate import tabulate_formats

    for fmt in tabulate_formats:
        result = invoke("compare", "--gelu", "--swiglu", "--seq-len", "3", "--format", fmt)
        assert result.exit_code == 0 and "what differs:" in result.stdout, fmt


def _xiong_stack(placement, seed, n_layers=12):
    config = BlockConfig(**XIONG, placement=placement, causal=False)
    blocks = build_stack(config, n_layers, seed=seed, init="xiong")
    x = torch.randn(8, 64, 128, generator=torch.Generator().manual_seed(100 + seed))
    return [summarise(i, t) for i, t in enumerate(trace_stack(blocks, x))]


def test_residual_growth_follows_xiong_lemma_2():
    """E‖x_l‖²/d: Pre-LN within [1 + l/2, 1 + 3l/2]; Post-LN flat. E over init: mean of 4 seeds."""
    pre = np.mean([[s.sq_norm_per_d for s in _xiong_stack("pre", seed)] for seed in range(4)], axis=0)
    for index, value in enumerate(pre):
        l = index + 1
        assert 1 + l / 2 <= value <= 1 + 3 * l / 2, (l, value)
    post = [s.sq_norm_per_d for s in _xiong_stack("post", 0)]
    assert max(post) - min(post) < 0.01


def test_branch_share_follows_liu_et_al():
    """Post-LN's FFN share stays roughly constant; Pre-LN's falls with depth and is below Post-LN's."""
    pre = [s.ffn_share for s in _xiong_stack("pre", 0, n_layers=8)]
    post = [s.ffn_share for s in _xiong_stack("post", 0, n_layers=8)]
    assert max(post) / min(post) < 2.0
    assert pre[-1] < pre[0] / 3 and np.corrcoef(range(8), pre)[0, 1] < -0.8
    assert all(p < q for p, q in zip(pre[1:], post[1:]))


XIONG_SWEEP = ("blocktrace compare --pre-ln --post-ln --layers 6,8,10,12,14 --grad --batches 4 --init xiong --heads 1 "
               "--d-model 128 --d-ff 128 --ffn relu --batch 8 --seq-len 32")


def test_gradient_sweep_follows_xiong_theorem_1():
    """On the sweep docs/compare.md shows: test_readme runs that command and requires exactly that output, so the
    sweep is run once in the suite (it was twice: 6 s each), and its numbers are judged here."""
    page = (ROOT / "docs" / "compare.md").read_text()
    table = page[page.index(f"$ {XIONG_SWEEP}\n"):].split("\n\n")[1]  # the block after the command's heading
    rows = [line.split() for line in table.splitlines() if line.strip()[:1].isdigit()]
    assert [int(row[0]) for row in rows] == [6, 8, 10, 12, 14]
    pre, post = [float(row[1]) for row in rows], [float(row[2]) for row in rows]
    mean_post = sum(post) / len(post)
    assert all(abs(p - mean_post) <= 0.3 * mean_post for p in post), post
    assert all(a > b for a, b in zip(pre, pre[1:])), pre
    assert all(p < q for p, q in zip(pre, post))


def test_deepnorm_scales_the_stream_by_alpha_and_the_init_by_beta():
    post, deep = build_variants(BlockConfig(d_model=8, n_heads=2), Axis.PLACEMENT, ["post", "deepnorm"],
                                n_layers=6, seed=1)
    alpha, beta = (2 * 6) ** 0.25, (8 * 6) ** -0.25
    for name in ("ffn.fc.weight", "ffn.proj.weight", "attn.v_proj.weight", "attn.out_proj.weight"):
        assert torch.allclose(dict(deep.blocks[0].named_parameters())[name],
                              beta * dict(post.blocks[0].named_parameters())[name])
    for name in ("attn.q_proj.weight", "attn.k_proj.weight"):
        assert torch.equal(dict(deep.blocks[0].named_parameters())[name], dict(post.blocks[0].named_parameters())[name])
    from blocktrace.tracing.tracer import trace

    x = torch.randn(5, 8)
    t = trace(deep.blocks[0], x, keep_tensors=True).tensors()
    assert torch.allclose(t["residual1"], alpha * x + t["attn"], atol=1e-5)
    assert torch.allclose(t["residual2"], alpha * t["norm1"] + t["ffn"], atol=1e-5)


def test_run_stack_reports_every_layer_and_steps_on_demand(invoke):
    report = _json(invoke, "run", "--layers", "3")
    assert report["kind"] == "stack" and [l["layer"] for l in report["layers"]] == [0, 1, 2]
    for layer in report["layers"]:
        last = layer["steps"][-1]["stats"]
        assert layer["sq_norm_per_d"] == pytest.approx(last["rms"] ** 2)
        var = {s["name"]: s["stats"]["std"] ** 2 for s in layer["steps"]}
        assert layer["attn_share"] == pytest.approx(var["attn"] / var["residual1"])
    text = invoke("run", "--layers", "3", "--block-steps").stdout
    assert text.count("x_norm1 = LayerNorm(x)") == 3
    assert "x_norm1 = LayerNorm(x)" not in invoke("run", "--layers", "3").stdout


def test_stack_on_checkpoint_layers(invoke):
    report = _json(invoke, "run", "--weights", str(SAMPLES / "gpt2-tiny"), "--layer", "1", "--layers", "3",
                   "--token-ids", "5", "6")
    assert report["n_layers"] == 3
    single = _json(invoke, "run", "--weights", str(SAMPLES / "gpt2-tiny"), "--layer", "2", "--token-ids", "5", "6")
    assert report["layers"][1]["steps"] == single["steps"]  # layer 2, fed by layer 1, as in the model
    result = invoke("run", "--weights", str(SAMPLES / "gpt2-tiny"), "--layer", "2", "--layers", "3", "--token-ids", "5")
    assert result.exit_code == 2 and "needs layers up to 4, but the checkpoint has 4 layers: 0–3" in result.stderr


def test_gradient_norms_are_the_norms_of_the_mean_gradient():
    from torch.nn import functional as F

    from blocktrace.diagnose.grad import gradient_report, readout, xiong_loss, zipf_targets

    blocks = build_stack(BlockConfig(d_model=8, n_heads=2), 2, seed=3)
    inputs = [torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    report = gradient_report(blocks, lambda k: inputs[k], xiong_loss(8, 5, final_norm=True), batches=3)
    w2 = blocks[-1].ffn.proj.weight
    total = torch.zeros_like(w2)
    for k, x in enumerate(inputs):  # by hand: each batch's gradient of the documented loss, then the mean
        h = x
        for block in blocks:
            h = block(h)
        logits = F.layer_norm(h, h.shape[-1:]) @ readout(8, 5).T
        targets = zipf_targets(logits.shape[:-1], torch.Generator().manual_seed(5 + 20_000 + k))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        total += torch.autograd.grad(loss, w2)[0]
    assert report.weight_norms[-1]["ffn_w2"] == pytest.approx((total / 3).norm().item(), rel=1e-5)
    assert all(not p.requires_grad or p.grad is None for b in blocks for p in b.parameters())


def test_zipf_targets_follow_one_over_rank():
    from blocktrace.diagnose.grad import zipf_targets

    counts = torch.bincount(zipf_targets((200_000,), torch.Generator().manual_seed(0), vocab=8), minlength=8)
    expected = [1 / (k + 1) / sum(1 / (j + 1) for j in range(8)) for k in range(8)]
    assert (counts / counts.sum()).tolist() == pytest.approx(expected, abs=0.01)


def test_run_grad_reports_step_and_weight_gradients(invoke):
    report = _json(invoke, "run", "--grad")
    layer = report["gradients"]["layers"][0]
    assert set(layer["step_grad_norms"]) == {"norm1", "attn", "residual1", "norm2", "ffn", "residual2"}
    assert set(layer["weight_grad_norms"]) == {"attn_q", "attn_k", "attn_v", "attn_o", "ffn_w1", "ffn_w2"}
    assert all(value > 0 for value in layer["weight_grad_norms"].values())
    assert "‖∂L/∂W‖_F of each weight matrix" in invoke("run", "--grad").stdout


def test_layer_list_needs_grad(invoke):
    result = invoke("run", "--layers", "2,4")
    assert result.exit_code == 2 and "a list of depths is a gradient sweep: add --grad" in result.stderr


def test_compare_speaks_chinese_with_lang_zh_and_lines_up(invoke):
    """The learner's path: `compare --lang zh` was refused; now its title, headings and notes are Chinese (the
    numbers the same as in English), and every line of its table has one display width."""
    from wcwidth import wcswidth

    english = invoke("compare", "--pre-ln", "--post-ln").stdout
    chinese = invoke("compare", "--pre-ln", "--post-ln", "--lang", "zh")
    assert chinese.exit_code == 0
    text = chinese.stdout
    for word in ("same parameters", "common:", "operation", "what differs", "output rms", "the norm sits"):
        assert word in english and word not in text, word
    assert "不同之处" in text and "相同的参数" in text
    numbers = re.compile(r"-?\d+\.\d{4}")
    assert numbers.findall(text) == numbers.findall(english)  # the same measurements, said in another language
    table = [line for line in text.splitlines() if line.startswith(("名称", "---", "norm", "attn", "residual", "ffn"))]
    assert len({wcswidth(line) for line in table}) == 1


def test_every_compared_value_has_its_chinese_sentence():
    from blocktrace.diagnose.compare import _FFNS, _NORMS, _QK_NORMS, _WHERE
    from blocktrace.render.words import VALUE_SENTENCES_ZH

    assert set(VALUE_SENTENCES_ZH) == {*_WHERE, *_NORMS, *_FFNS, *_QK_NORMS}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_compare_explain_tells_each_variants_steps_in_its_own_order(invoke, lang):
    from blocktrace.render.words import explanation
    from blocktrace.vocab import Lang
    from blocktrace.wiring import POST, PRE

    text = invoke("compare", "--pre-ln", "--post-ln", "--explain", "--lang", lang).stdout
    for wiring in (PRE, POST):
        lines = [f"{k} {step}: {explanation(Lang(lang), wiring, step)}" for k, step in enumerate(wiring.order, 1)]
        assert "\n".join(lines) in text, wiring.name
    assert invoke("compare", "--pre-ln", "--post-ln", "--explain", "--json").exit_code == 2


def test_compares_help_says_what_each_side_is(invoke):
    """Issue 44: `compare --help` said `--pre-ln  Compare with pre.`"""
    text = invoke("compare", "--help").stdout
    assert "Compare with pre." not in text
    assert "Norm before each sublayer" in text and "RMSNorm: x / √(mean(x²) + eps) · g" in " ".join(text.split())


def test_the_layer_tables_columns_are_defined_where_they_are_printed(invoke):
    """Issue 44: the attn share columns of `compare --layers` were never defined in its output."""
    for lang, said in (("en", "Var[update] / Var[residual1]"), ("zh", "Var[更新] / Var[residual1]")):
        text = invoke("compare", "--pre-ln", "--post-ln", "--layers", "2", "--lang", lang).stdout
        assert said in text and "attn share" in text
