"""Granite-4 (granitemoehybrid), the hybrid of Mamba-2 layers and attention layers: every traced step equal to what
HF's GraniteMoeHybrid computes at the same place (both weight scales; with experts and RoPE, and dense without
positions; HF's own dense layer traced bare, its MoE layer refused by name), the Mamba-2 sub-steps against HF's own
functions, the chunked scan against a token-by-token loop of the recurrence, padding zeroed as HF zeroes it, and the
config read as GraniteMoeHybridConfig reads it."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import capture, randomise_hf

from blocktrace.config import BlockConfig, Mamba2
from blocktrace.errors import ConfigError, UsageError
from blocktrace.model.block import build_block
from blocktrace.model.mamba2 import chunk_scan
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]
KINDS = ["mamba", "attention", "mamba"]
# chunks of 4 tokens: the 9 tokens span three, the last one padded
SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=16,
             shared_intermediate_size=24, num_hidden_layers=3, vocab_size=101, max_position_embeddings=64,
             num_experts_per_tok=2, mamba_n_heads=4, mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=4,
             layer_types=KINDS, embedding_multiplier=6.0, attention_multiplier=0.2, residual_multiplier=0.3,
             logits_scaling=4.0, attn_implementation="eager")
VARIANTS = {"experts, rope, randomised": (True, dict(num_local_experts=4, position_embedding_type="rope")),
            "dense, no positions, hf-initialised": (False, dict(num_local_experts=0, position_embedding_type=None))}
STEPS = ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")
MAMBA_SUBSTEPS = ["attn.z", "attn.x", "attn.b", "attn.c", "attn.dt", "attn.decay", "attn.scan", "attn.gated"]
SPEC = Mamba2(heads=4, head_dims=16, state_dims=8, groups=2, kernel=4, chunk=4)


def hf_granite_hybrid(randomised: bool = True, **changes):
    import transformers

    torch.manual_seed(7)
    config = transformers.GraniteMoeHybridConfig(**{**SMALL, **changes})
    model = transformers.GraniteMoeHybridForCausalLM(config).eval()
    if randomised:
        randomise_hf(model, seed=7)
    return model


def places(model, layer: int) -> dict:
    """Where HF holds each step; the ffn step is residual2's input less residual1, over the multiplier (the layer
    sums its experts and shared_mlp in its own forward), read here as the sum of the two modules' outputs."""
    block = model.model.layers[layer]
    mixer = block.mamba if KINDS[layer] == "mamba" else block.self_attn
    found = {"norm1": (block.input_layernorm, "out"), "attn": (mixer, "out"),
             "residual1": (block.post_attention_layernorm, "in"), "norm2": (block.post_attention_layernorm, "out"),
             "shared": (block.shared_mlp, "out"), "residual2": (block, "out")}
    if block.block_sparse_moe is not None:
        found["experts"] = (block.block_sparse_moe, "out")
    if KINDS[layer] != "mamba":
        found["attn_weights"] = (mixer, "weights")
    return found


def expected_steps(model, layer: int) -> dict:
    expected = capture(model, places(model, layer), IDS)
    expected["ffn"] = expected["shared"] + expected.get("experts", 0)
    return expected


@pytest.fixture(scope="module", params=list(VARIANTS))
def saved(request, tmp_path_factory):
    randomised, changes = VARIANTS[request.param]
    model = hf_granite_hybrid(randomised, **changes)
    directory = tmp_path_factory.mktemp("granitemoehybrid")
    model.save_pretrained(directory)
    return directory, model


def loaded(directory, layer: int):
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name == "granitemoehybrid"
    return load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))


@pytest.mark.parametrize("layer", [0, 1])
def test_every_step_of_every_layer_kind_matches_huggingface(saved, layer):
    directory, model = saved
    expected = expected_steps(model, layer)
    traced = trace(loaded(directory, layer), expected["hidden_states"][layer][0], keep_tensors=True, checks=True)
    tensors = traced.tensors()
    for step in (*STEPS, *(("attn_weights",) if KINDS[layer] != "mamba" else ())):
        delta = (tensors[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"
    if KINDS[layer] == "mamba":  # no weights to read the mask from: causality measured by the probe
        assert traced.attention is None and traced.step("attn").probe.causal.causal is True
        assert [s.name for s in traced.substeps if s.name.startswith("attn.")] == MAMBA_SUBSTEPS
    else:
        assert traced.attention.future_weight_sum == 0.0


def test_the_embedding_and_each_layers_input_are_huggingfaces(saved):
    directory, model = saved
    hidden = capture(model, {}, IDS)["hidden_states"]
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    embedded = embed_token_ids(checkpoint, info, IDS)  # times embedding_multiplier
    for layer in range(3):
        x = hidden_state_before(checkpoint, info, config, embedded, layer)
        assert (x - hidden[layer][0]).abs().max().item() <= 1e-5, layer


@pytest.mark.parametrize("layer", [0, 1])
def test_hfs_dense_layer_traced_bare_equals_itself_and_its_moe_layer_is_refused_by_name(layer):
    model = hf_granite_hybrid(**VARIANTS["dense, no positions, hf-initialised"][1])
    expected = expected_steps(model, layer)
    for x in (expected["hidden_states"][layer][0], expected["hidden_states"][layer]):  # unbatched, batched
        traced = trace(model.model.layers[layer], x, keep_tensors=True, checks=True)
        tensors = traced.tensors()
        for step in STEPS:
            delta = (tensors[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
            assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"
        assert traced.step("attn").probe.causal.causal is True
    sparse = hf_granite_hybrid(num_local_experts=4)
    with pytest.raises(UsageError, match="block_sparse_moe \\+ shared_mlp, summed in the layer's forward"):
        trace(sparse.model.layers[layer], expected["hidden_states"][layer][0])


def test_the_mamba_sub_steps_are_hfs_own_intermediates(saved):
    """z, x, B, C, Δ, Δ·A, the scan and the gated norm, against HF's GraniteMoeHybridMambaLayer computed step by
    step with its own functions."""
    from transformers.models.granitemoehybrid import modeling_granitemoehybrid as hf

    directory, model = saved
    layer = model.model.layers[0].mamba
    h = capture(model, {"x_in": (model.model.layers[0].input_layernorm, "out")}, IDS)["x_in"]
    with torch.no_grad():
        z, xbc, dt = layer.in_proj(h).split([64, 96, 4], dim=-1)
        xbc = hf.causal_conv1d_fn(xbc.transpose(1, 2), layer.conv1d.weight.squeeze(1), layer.conv1d.bias,
                                  activation="silu").transpose(1, 2)
        x, b, c = torch.split(xbc, [64, 16, 16], dim=-1)
        step = torch.clamp(F.softplus(dt + layer.dt_bias), 0.0, float("inf"))
        decay = -torch.exp(layer.A_log.float()) * step
        scan = hf.mamba2_chunk_scan(x.view(1, -1, 4, 16), dt, -torch.exp(layer.A_log.float()), b.view(1, -1, 2, 8),
                                    c.view(1, -1, 2, 8), chunk_size=4, D=layer.D, dt_bias=layer.dt_bias,
                                    dt_softplus=True).reshape(1, len(IDS), -1)
        gated = layer.norm(scan, z)
    expected = {"z": z, "x": x, "b": b, "c": c, "dt": step, "decay": decay, "scan": scan, "gated": gated}
    tensors = trace(loaded(directory, 0), capture(model, {}, IDS)["hidden_states"][0][0], keep_tensors=True).tensors()
    for name, value in expected.items():
        delta = (tensors[f"attn.{name}"] - value[0]).abs().max().item()
        assert delta <= 1e-6, f"{name}: max |Δ| {delta}"
    assert (tensors["attn.decay"] < 0).all() and (tensors["attn.dt"] > 0).all()


def naive_scan(x, step, decay, b, c, skip):
    """Mamba-2's recurrence (Dao & Gu 2024, eq. 1 with scalar A per head), token by token in float64:
    h_t = exp(Δ_t·A)·h_{t−1} + Δ_t·x_t B_tᵀ and y_t = h_t C_t + D·x_t; h is [head_dims × state_dims] per head."""
    batch, tokens, heads, head_dims = x.shape
    per_group = heads // b.shape[2]
    out = torch.zeros(batch, tokens, heads, head_dims, dtype=torch.float64)
    for n in range(batch):
        for head in range(heads):
            state = torch.zeros(head_dims, b.shape[-1], dtype=torch.float64)
            for t in range(tokens):
                bt, ct = b[n, t, head // per_group].double(), c[n, t, head // per_group].double()
                xt = x[n, t, head].double()
                state = decay[n, t, head].double().exp() * state + step[n, t, head].double() * torch.outer(xt, bt)
                out[n, t, head] = state @ ct + skip[head].double() * xt
    return out


@pytest.mark.parametrize("tokens, chunk", [(5, 4), (8, 4), (150, 64)])  # a padded chunk, two whole ones, three
def test_the_chunked_scan_is_the_token_by_token_recurrence(tokens, chunk):
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(2, tokens, 4, 8, generator=generator)
    b, c = (torch.randn(2, tokens, 2, 6, generator=generator) for _ in range(2))
    step = torch.rand(2, tokens, 4, generator=generator)
    decay = -torch.rand(4, generator=generator) * 2 * step  # Δ·A with A in (−2, 0)
    skip = torch.randn(4, generator=generator)
    ours = chunk_scan(x, step, decay, b, c, skip, chunk)
    reference = naive_scan(x, step, decay, b, c, skip)
    assert (ours.double() - reference).abs().max().item() <= 1e-4 * max(1.0, reference.abs().max().item())


def test_padded_tokens_are_zeroed_around_the_convolution_as_hf_does():
    """Left padding: HF multiplies the Mamba layer's input, and the convolution's output, by the 2D mask; so does
    the block given key_mask."""
    model = hf_granite_hybrid()
    layer = model.model.layers[0].mamba
    h = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = layer(h, attention_mask=mask)
    block = build_block(BlockConfig(d_model=32, n_heads=4, norm="rmsnorm", ffn="swiglu", eps=1e-6,
                                    token_mixer=SPEC), seed=0)
    block.attn.load_state_dict({"in_proj.weight": layer.in_proj.weight, "conv.weight": layer.conv1d.weight,
                                "conv.bias": layer.conv1d.bias, "dt_bias": layer.dt_bias, "A_log": layer.A_log,
                                "D": layer.D, "norm.weight": layer.norm.weight, "out_proj.weight": layer.out_proj.weight})
    block.attend_with(key_mask=mask.bool())
    with torch.no_grad():
        ours = block.attn(h)
    assert (ours - expected).abs().max().item() <= 1e-6
    block.attend_with(key_mask=None)
    with torch.no_grad():
        unmasked = block.attn(h)
    assert (unmasked[1, 2:] - expected[1, 2:]).abs().max().item() > 1e-3  # the mask mattered: pads reached tokens


@pytest.mark.parametrize("key, kinds, limit", [
    ("layers_block_type", ["mamba", "attention", "mamba"], [0.0, {"__float__": "Infinity"}]),
    ("layer_types", ["linear_attention", "full_attention", "linear_attention"], [0.001, 100.0]),
    (None, None, None)])  # no layer kinds: Mamba-2 everywhere; no limit: (0, inf)
def test_the_layer_kinds_and_the_step_limit_are_read_as_hf_reads_them(tmp_path, key, kinds, limit):
    import transformers

    model = hf_granite_hybrid(num_local_experts=0)
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("layer_types")
    data.pop("time_step_limit")
    data.pop("mamba_d_head")  # "auto": the inner width shared among the heads
    if key is not None:
        data[key], data["time_step_limit"] = kinds, limit
    (tmp_path / "config.json").write_text(json.dumps(data))
    hf = transformers.GraniteMoeHybridConfig.from_pretrained(tmp_path)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    mixers = [info.family.layer_fields(info.config, k).get("token_mixer") for k in range(3)]
    assert ["linear_attention" if m is not None else "full_attention" for m in mixers] == hf.layer_types
    spec = next(m for m in mixers if m is not None)
    assert spec.step_limit == tuple(hf.time_step_limit) and spec.head_dims == hf.mamba_d_head
    if key is None:
        assert spec.step_limit == (0.0, math.inf)


def test_a_mamba2_spec_is_checked_and_survives_json():
    with pytest.raises(ConfigError, match="must divide evenly among"):
        Mamba2(heads=4, head_dims=8, state_dims=8, groups=3)
    with pytest.raises(ConfigError, match="step_limit must be"):
        Mamba2(heads=4, head_dims=8, state_dims=8, step_limit=(1.0, 0.5))
    config = BlockConfig(d_model=32, n_heads=4, token_mixer=SPEC)
    assert BlockConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    from blocktrace.render.documents.json_document import dumps  # strict JSON: the infinite bound written null

    document = json.loads(dumps({"config": config.to_dict()}))
    assert document["non_finite"] == [{"path": "$.config.token_mixer.step_limit[1]", "value": "inf"}]
    assert BlockConfig.from_dict(document["config"]) == config


def test_run_names_the_mixer_in_both_languages(invoke, saved):
    directory, _ = saved
    args = ("run", "--weights", str(directory), "--layer", "0", "--token-ids", "1", "2", "3")
    english, chinese = invoke(*args).stdout, invoke(*args, "--lang", "zh").stdout
    assert "attn_out = Mamba2[4 heads, state 8, conv 4](x_norm1)" in english
    assert "h ← exp(Δ·A)·h + Δ·x Bᵀ" in english and "inside attn, Mamba-2" in english
    assert "note: attn is Mamba2, a token mixer without attention weights" in english
    assert "attn 内部（Mamba-2）" in chinese and "注: Mamba-2 层：0, 2" in chinese
