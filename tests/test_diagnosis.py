"""Findings judged on both sides: the false alarms of the first checks (dead LayerNorm gains, a
previous-token head, a hand-written RMSNorm) are gone; failures that passed (an exploding
stream, a bad init, a float16 overflow) are errors; the diagnosis names a cause that fits."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import SAMPLES
from safetensors.torch import load_file, save_file

from blocktrace.config import AttentionParts, BlockConfig
from blocktrace.diagnose.diagnosis import Context, diagnose
from blocktrace.diagnose.health import evaluate
from blocktrace.model.block import build_block
from blocktrace.model.stack import build_stack
from blocktrace.tracing.stack import trace_stack
from blocktrace.tracing.stats import uniform_entropy
from blocktrace.tracing.tracer import trace


def names(flags, *levels):
    return {f.name for f in flags if not levels or f.level.value in levels}


def test_dead_gains_in_a_trained_layernorm_are_no_alarm():
    """A trained LayerNorm has gains ≈ 0 in some dimensions; its pre-gain output is still normalised."""
    block = build_block(BlockConfig(d_model=16, n_heads=4, placement="post"))
    with torch.no_grad():
        block.norm2.weight[:8] = 1e-13
    flags = evaluate([trace(block, torch.randn(2, 8, 16), checks=True)])
    assert "norm_not_normalising" not in names(flags)


def test_a_previous_token_head_is_a_learned_feature_not_a_collapse():
    block = build_block(BlockConfig(d_model=16, n_heads=1, placement="post"))
    shift = torch.zeros(16, 16)
    shift[torch.arange(1, 16), torch.arange(15)] = 1.0  # k_j = onehot(j + 1): query t matches key t - 1
    with torch.no_grad():
        block.attn.q_proj.weight.copy_(torch.eye(16))
        block.attn.k_proj.weight.copy_(shift)
        block.attn.q_proj.bias.zero_()
        block.attn.k_proj.bias.zero_()
    x = 10 * torch.eye(16)[:8]
    traced = trace(block, x, checks=True)
    assert traced.attention.previous_weight[0] > 0.9
    flags = evaluate([traced])
    assert not names(flags, "warning", "error"), flags
    sharp = [f for f in flags if f.name == "attention_sharp_head"]
    assert sharp and "previous-token head" in sharp[0].detail


def test_uniform_attention_is_measured_against_the_keys_each_query_sees():
    assert uniform_entropy(3, causal=True) == pytest.approx((0 + math.log(2) + math.log(3)) / 3)  # 0.597
    assert uniform_entropy(3, causal=False) == pytest.approx(math.log(3))
    assert uniform_entropy(6, causal=True, window=2) == pytest.approx(5 * math.log(2) / 6)
    # Llama-4's chunks of 4: queries 0–3 see 1–4 keys, queries 4 and 5 see 1 and 2
    assert uniform_entropy(6, causal=True, chunk=4) == pytest.approx((math.log(24) + math.log(2)) / 6)
    chunked = trace(build_block(BlockConfig(d_model=8, n_heads=2, attention=AttentionParts(chunk=2))), torch.randn(5, 8),
                    keep_tensors=True)
    weights = chunked.attention.tensor
    assert weights[..., 2:4, :2].abs().max() == 0 and weights[..., 4, :4].abs().max() == 0  # earlier chunks unseen
    assert chunked.attention.uniform_entropy == pytest.approx(2 * math.log(2) / 5)
    traced = trace(build_block(BlockConfig(d_model=8, n_heads=2)), torch.randn(3, 8))
    assert traced.attention.uniform_entropy == pytest.approx(0.5973, abs=1e-4)


def test_an_exploding_residual_stream_is_an_error():
    blocks = build_stack(BlockConfig(d_model=16, n_heads=4), 4, seed=0)
    with torch.no_grad():
        for layer, block in enumerate(blocks[1:], start=1):
            block.ffn.proj.weight.mul_(300.0 ** layer)  # each FFN update hundreds of times the last
    traces = trace_stack(blocks, torch.randn(2, 8, 16), checks=True)
    flags = evaluate(traces)
    assert "residual_explosion" in names(flags, "error")
    healthy = evaluate(trace_stack(build_stack(BlockConfig(d_model=16, n_heads=4), 4), torch.randn(2, 8, 16),
                                   checks=True))
    assert "residual_explosion" not in names(healthy)


def _gpt2_with(tmp_path, change, dtype=None, name="ckpt"):
    import shutil

    target = tmp_path / name
    shutil.copytree(SAMPLES / "gpt2-tiny", target)
    tensors = load_file(str(target / "model.safetensors"))
    change(tensors)
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    save_file(tensors, str(target / "model.safetensors"))
    return target


def test_weights_far_past_any_init_point_at_the_initialisation(invoke, tmp_path):
    def std_two(tensors):  # d_model 64: std·√fan_in = 16, a linear map amplifying its input sixteenfold
        for key, value in tensors.items():
            if key.startswith("h.") and value.dim() == 2:
                tensors[key] = 2 * torch.randn(value.shape, generator=torch.Generator().manual_seed(0))

    target = _gpt2_with(tmp_path, std_two)
    report = json.loads(invoke("check", "--weights", str(target), "--token-ids", *map(str, range(1, 20)),
                               "--json").stdout)
    assert "weight_scale" in {f["name"] for f in report["flags"] if f["level"] == "error"}
    assert report["diagnosis"][0]["cause"] == "initialisation"


def test_a_checkpoint_at_step_0_can_only_fail_by_its_initialisation(invoke, tmp_path):
    step0 = _gpt2_with(tmp_path, lambda tensors: None, name="step_0000")
    report = json.loads(invoke("check", "--weights", str(step0), "--token-ids", "1", "2", "3", "--json").stdout)
    assert report["step"] == 0 and report["flags"]  # the sample's random weights are worse than a uniform guess
    assert report["diagnosis"][0]["cause"] == "initialisation"


def test_a_float16_checkpoint_that_overflows_is_a_precision_error(invoke, tmp_path):
    def overflow(tensors):
        tensors["h.1.mlp.c_proj.weight"] = tensors["h.1.mlp.c_proj.weight"] * 1e5

    target = _gpt2_with(tmp_path, overflow, torch.float16)
    result = invoke("check", "--weights", str(target), "--token-ids", *map(str, range(1, 12)), "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == 1 and "precision_overflow" in {f["name"] for f in report["flags"]}
    assert report["diagnosis"][0]["cause"] == "precision" and report["stored_dtype"] == "F16"


def test_advice_fits_the_model():
    from blocktrace.diagnose.checks import flag
    from blocktrace.vocab import Level

    collapse = [flag("attention_entropy_collapse", Level.ERROR, "attn", 3, 1.0, "4 of 4 heads")]
    pre = diagnose(collapse, Context(post_norm=False))[0]
    assert pre["cause"] == "learning_rate" and "Pre-LN" not in pre["advice"]
    post = diagnose(collapse, Context(post_norm=True))[0]
    assert post["cause"] == "warmup" and "warm-up" in post["advice"]
    gelu = diagnose([flag("ffn_dead_units", Level.ERROR, "ffn", 0, 0.99, "99%")], Context(activation="gelu"))[0]
    assert "ReLU" not in gelu["advice"]


def test_activation_statistics_at_step_0_are_the_initialisations_not_the_architectures():
    """Seen in the fourteenth blind group (F06, calibration now): every RMSNorm's gain 0 at step 0 silences every
    FFN (100% of its GeGLU units 'never active': their input is 0). Before any update the activations are what the
    initialised weights make of the input, so a traced statistic of them (dead or saturated FFN units, a massive
    activation) is the initialisation's — not a tie between the architecture and the initialisation broken by the
    causes' names. A structural fault that is no statistic (a block the forward skips) keeps its cause, and later
    steps keep the architecture's."""
    from blocktrace.diagnose.checks import flag
    from blocktrace.vocab import Level

    dead = [flag("ffn_dead_units", Level.ERROR, "ffn", layer, 1.0, "100%") for layer in range(3)]
    gains = [flag("norm_gains_not_one", Level.ERROR, None, None, 0.0, "every norm's gain rms is 0")]
    assert diagnose(dead + gains, Context(step=0))[0]["cause"] == "initialisation"
    assert [d["cause"] for d in diagnose(dead, Context(step=0))] == ["initialisation"]
    assert diagnose(dead, Context(step=500))[0]["cause"] == "architecture"
    skipped = [flag("blocks_skipped", Level.ERROR, None, None, 2.0, "2 blocks")]
    assert diagnose(skipped, Context(step=0))[0]["cause"] == "architecture"


def test_one_row_per_kind_of_finding(invoke):
    result = invoke("check", "--layers", "6", "--init", "xiong", "--seq-len", "8")
    text = result.stdout
    assert text.count("attention_uniform") == 1  # info kinds are listed once, not 6 × 4 heads
    with_errors = invoke("check", "--module", "examples.tutorial_block:forgot_residual")
    table = [line for line in with_errors.stdout.splitlines() if line.startswith(("ERROR", "WARNING"))]
    assert len(table) == len({line.split()[1] for line in table})


def test_json_has_stable_top_level_keys(invoke):
    report = json.loads(invoke("check", "--module", "examples.tutorial_block:forgot_residual", "--json").stdout)
    assert {"loss", "loss_note", "flags", "diagnosis"} <= set(report)
    assert report["loss"] is None and "no model loss" in report["loss_note"]
    assert {"name", "level", "cause", "layer", "step"} <= set(report["flags"][0])
    assert report["diagnosis"][0]["cause"] == "residual" and report["diagnosis"][0]["evidence"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_statistics_equal_float64_sums_in_any_dtype(dtype):
    """Each linear map's std (unbiased), norm and fan-in, as float64 arithmetic on the same values gives them; a
    half-precision weight larger than one widened piece (WIDEN_CHUNK) is summed piece by piece."""
    from blocktrace.diagnose.weights import WIDEN_CHUNK, weight_statistics

    block = build_block(BlockConfig(d_model=512, n_heads=8), seed=2).to(dtype)
    assert block.ffn.fc.weight.numel() > WIDEN_CHUNK
    found = weight_statistics(block)
    for name in ("attn.q_proj.weight", "ffn.fc.weight", "ffn.proj.weight"):
        values = block.get_parameter(name).detach().double()
        assert found[name]["std"] == pytest.approx(values.std().item(), rel=1e-5), name  # float32 sums
        assert found[name]["norm"] == pytest.approx(values.norm().item(), rel=1e-5), name
        assert found[name]["fan_in"] == values.shape[1]


def test_bare_matrices_are_weights_where_they_meet_the_stream():
    """A bare 2-D parameter with a side as wide as the stream is a weight matrix (its std as float64 gives it; a
    fan-in only where it is square, since `x @ W` and F.linear(x, W) read a non-square one by opposite sides); one
    that does not meet the stream — a Mamba layer's A_log [2d, 16], positive by design — is no weight matrix."""
    from blocktrace.diagnose.weights import weight_statistics

    d = 32
    block = torch.nn.Module()
    block.W_query = torch.nn.Parameter(torch.rand(d, d))
    block.W_up = torch.nn.Parameter(torch.randn(d, 4 * d))
    block.A_log = torch.nn.Parameter(torch.log(torch.arange(1, 17.0)).repeat(2 * d, 1))
    block.gain = torch.nn.Parameter(torch.ones(d))
    found = weight_statistics(block, width=d)
    assert set(found) == {"W_query", "W_up"}
    assert found["W_query"]["std"] == pytest.approx(block.W_query.detach().double().std().item(), rel=1e-5)
    assert found["W_query"]["mean"] == pytest.approx(block.W_query.detach().double().mean().item(), rel=1e-5)
    assert found["W_query"]["fan_in"] == d and found["W_up"]["fan_in"] is None and found["W_up"]["fan_out"] is None
    assert weight_statistics(block) == {}  # no stream width known: no bare matrix is taken for a weight


@pytest.mark.parametrize("family", ["Olmo2", "Exaone4"])
def test_a_stream_of_normalised_updates_is_not_taken_for_an_explosion(tmp_path, family):
    """OLMo-2's and EXAONE-4's reordered wiring adds norm(f(x)) to the stream: by the triangle inequality each add
    moves ‖x‖/√d by at most the norm's largest |gain|, so the stream cannot explode whatever the weights do. At init
    a tiny embedding (N(0, 0.02)) and branch outputs below the norm's eps make layer 0's output small and the later
    ones larger: a growth of hundreds × that Xiong et al.'s Pre-LN bound does not describe (a false alarm at step 0
    before)."""
    import transformers

    from blocktrace import Watch
    from blocktrace.training.timeline import read_timeline

    config = getattr(transformers, f"{family}Config")(vocab_size=256, hidden_size=128, num_hidden_layers=3,
                                                       num_attention_heads=4, num_key_value_heads=2,
                                                       intermediate_size=256)
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config)
    ids = torch.randint(0, 256, (4, 64), generator=torch.Generator().manual_seed(0))
    with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        watch.step(loss)
    record = read_timeline(tmp_path / "run.jsonl")[0]
    sizes = [layer["median_token_sq_norm_per_d"] for layer in record["layers"]]
    assert sizes[-1] > 100 * sizes[0]  # the growth the Pre-LN bound would call an explosion
    assert "residual_explosion" not in {f["name"] for f in record["flags"]}


def test_a_stream_that_starts_below_unit_scale_grows_to_it_without_exploding():
    """Xiong et al.'s Lemma 2 bounds a Pre-LN stream by 1 + 3l/2 in units where the sublayers add ~1 each: a first
    layer whose output is far below that scale (an embedding of std 0.02 and a first block that adds little — frozen,
    or still at init, as in a healthy HF Llama with its layer 0 frozen, called exploding at 241×) is measured against
    1, not against itself. An explosion (each layer's update hundreds of times the last) is still one."""
    blocks = build_stack(BlockConfig(d_model=16, n_heads=4), 3, seed=0)
    with torch.no_grad():
        for matrix in (blocks[0].attn.out_proj, blocks[0].ffn.proj):
            matrix.weight.mul_(0.01)
            matrix.bias.zero_()
        for block in blocks[1:]:
            block.ffn.proj.weight.mul_(8.0)  # later layers adding O(1), as trained ones do
    traces = trace_stack(blocks, 0.02 * torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0)), checks=True)
    sizes = [t.steps[-1].probe.token_sq_median for t in traces]
    assert sizes[0] < 0.01 and sizes[-1] / sizes[0] > 100 * (1 + 1.5 * 3) / (1 + 1.5) and sizes[-1] < 100
    assert "residual_explosion" not in names(evaluate(traces))
