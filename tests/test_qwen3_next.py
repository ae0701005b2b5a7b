"""Qwen3-Next, the hybrid of gated delta-rule layers and gated attention layers: every traced step equal to what HF's
Qwen3Next computes at the same place (both weight scales, both layer kinds, a dense layer among sparse ones, HF's own
layer traced bare), the delta net's sub-steps against HF's own functions, the chunked rule against a token-by-token
loop written from the paper's recurrence, padding zeroed as HF zeroes it, and the config's rules read as
Qwen3NextConfig reads them."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import capture, randomise_hf

from blocktrace.config import BlockConfig, GatedDeltaNet
from blocktrace.errors import ConfigError
from blocktrace.model.block import build_block
from blocktrace.model.gated_delta import chunk_gated_delta_rule
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7]
KINDS = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=64,
             num_hidden_layers=4, vocab_size=101, max_position_embeddings=64, linear_num_key_heads=2,
             linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8, num_experts=4,
             num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=24, mlp_only_layers=[1],
             attn_implementation="eager")
STEPS = ("norm1", "attn", "residual1", "norm2", "ffn", "residual2")
DELTA_SUBSTEPS = ["attn.q", "attn.k", "attn.v", "attn.z", "attn.beta", "attn.decay", "attn.delta", "attn.gated"]
SPEC = GatedDeltaNet(key_heads=2, value_heads=4, key_dims=8, value_dims=8, kernel=4)


def hf_qwen3_next(randomised: bool = True, **changes):
    import transformers

    torch.manual_seed(7)
    model = transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(**{**SMALL, **changes})).eval()
    if randomised:
        randomise_hf(model, seed=7)
    return model


def places(model, layer: int) -> dict:
    block = model.model.layers[layer]
    mixer = block.linear_attn if KINDS[layer] == "linear_attention" else block.self_attn
    found = {"norm1": (block.input_layernorm, "out"), "attn": (mixer, "out"),
             "residual1": (block.post_attention_layernorm, "in"), "norm2": (block.post_attention_layernorm, "out"),
             "ffn": (block.mlp, "out"), "residual2": (block, "out")}
    if KINDS[layer] != "linear_attention":
        found["attn_weights"] = (mixer, "weights")
    return found


@pytest.fixture(scope="module", params=[True, False], ids=["randomised", "hf-initialised"])
def saved(request, tmp_path_factory):
    model = hf_qwen3_next(randomised=request.param)
    directory = tmp_path_factory.mktemp("qwen3_next")
    model.save_pretrained(directory)
    return directory, model


def loaded(directory, layer: int):
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    assert info.family_name == "qwen3_next"
    return load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {}))


@pytest.mark.parametrize("layer", [0, 1, 3])  # a sparse delta-rule layer, a dense one, gated attention
def test_every_step_of_every_layer_kind_matches_huggingface(saved, layer):
    directory, model = saved
    expected = capture(model, places(model, layer), IDS)
    traced = trace(loaded(directory, layer), expected["hidden_states"][layer][0], keep_tensors=True, checks=True)
    tensors = traced.tensors()
    for step in places(model, layer):
        delta = (tensors[step] - expected[step][0]).abs().max().item()
        assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"
    if KINDS[layer] == "linear_attention":  # no weights to read the mask from: causality measured by the probe
        assert traced.attention is None and traced.step("attn").probe.causal.causal is True
        assert [s.name for s in traced.substeps if s.name.startswith("attn.")] == DELTA_SUBSTEPS
    else:
        assert traced.attention.future_weight_sum == 0.0
        assert "attn.output_gate" in [s.name for s in traced.substeps]


def test_the_embedding_and_each_layers_input_are_huggingfaces(saved):
    directory, model = saved
    hidden = capture(model, {}, IDS)["hidden_states"]
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    embedded = embed_token_ids(checkpoint, info, IDS)
    for layer in range(4):
        x = hidden_state_before(checkpoint, info, config, embedded, layer)
        assert (x - hidden[layer][0]).abs().max().item() <= 1e-5, layer


@pytest.mark.parametrize("layer", [0, 3])
def test_the_hf_layer_of_either_kind_traced_bare_equals_itself_inside_its_model(saved, layer):
    _, model = saved
    expected = capture(model, places(model, layer), IDS)
    for x in (expected["hidden_states"][layer][0], expected["hidden_states"][layer]):  # unbatched, batched
        traced = trace(model.model.layers[layer], x, keep_tensors=True, checks=True)
        tensors = traced.tensors()
        for step in STEPS:
            delta = (tensors[step].reshape(expected[step].shape) - expected[step]).abs().max().item()
            assert delta <= 1e-5, f"layer {layer} {step}: max |Δ| {delta}"
        assert traced.step("attn").probe.causal.causal is True


def test_the_delta_nets_sub_steps_are_hfs_own_intermediates(saved):
    """q, k, v, z, β, g, the rule's output and the gated norm, against HF's Qwen3NextGatedDeltaNet computed step by
    step with its own methods and functions."""
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    directory, model = saved
    net = model.model.layers[0].linear_attn
    h = capture(model, {"x_in": (model.model.layers[0].input_layernorm, "out")}, IDS)["x_in"]
    with torch.no_grad():
        q, k, v, z, b, a = net.fix_query_key_value_ordering(net.in_proj_qkvz(h), net.in_proj_ba(h))
        mixed = torch.cat([x.reshape(1, len(IDS), -1) for x in (q, k, v)], dim=-1).transpose(1, 2)
        mixed = hf.causal_conv1d_fn(mixed, net.conv1d.weight.squeeze(1), None, activation="silu").transpose(1, 2)
        q, k, v = torch.split(mixed, [16, 16, 32], dim=-1)
        beta, g = b.sigmoid(), -net.A_log.float().exp() * F.softplus(a.float() + net.dt_bias)
        out, _ = hf.torch_chunk_gated_delta_rule(q.reshape(1, -1, 2, 8), k.reshape(1, -1, 2, 8),
                                                 v.reshape(1, -1, 4, 8), g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        gated = net.norm(out.reshape(-1, 8), z.reshape(-1, 8)).reshape(1, len(IDS), -1)
    expected = {"q": q, "k": k, "v": v, "z": z.reshape(1, len(IDS), -1), "beta": beta, "decay": g,
                "delta": out.reshape(1, len(IDS), -1), "gated": gated}
    tensors = trace(loaded(directory, 0), capture(model, {}, IDS)["hidden_states"][0][0], keep_tensors=True).tensors()
    for name, value in expected.items():
        delta = (tensors[f"attn.{name}"] - value[0]).abs().max().item()
        assert delta <= 1e-6, f"{name}: max |Δ| {delta}"
    assert (tensors["attn.decay"] < 0).all() and ((tensors["attn.beta"] > 0) & (tensors["attn.beta"] < 1)).all()


def naive_gated_delta_rule(q, k, v, g, beta):
    """The recurrence of Yang et al. (2025), eq. 10, token by token: S_t = exp(g_t)·S_{t-1}(I − β_t k_t k_tᵀ) +
    β_t v_t k_tᵀ and o_t = S_t q_t, with q, k L2-normalised and q scaled by dk^-½; S is [dv × dk] per value head."""
    batch, tokens, key_heads, dk = k.shape
    value_heads, dv = v.shape[-2:]
    q = q.double().repeat_interleave(value_heads // key_heads, dim=2)
    k = k.double().repeat_interleave(value_heads // key_heads, dim=2)
    q = q / q.norm(dim=-1, keepdim=True) / dk ** 0.5
    k = k / k.norm(dim=-1, keepdim=True)
    out = torch.zeros(batch, tokens, value_heads, dv, dtype=torch.float64)
    for b in range(batch):
        for head in range(value_heads):
            state = torch.zeros(dv, dk, dtype=torch.float64)
            for t in range(tokens):
                kt, qt, vt = k[b, t, head], q[b, t, head], v[b, t, head].double()
                rate = beta[b, t, head].double()
                state = g[b, t, head].double().exp() * (state - rate * torch.outer(state @ kt, kt)) + \
                    rate * torch.outer(vt, kt)
                out[b, t, head] = state @ qt
    return out


@pytest.mark.parametrize("tokens", [5, 64, 150])  # within a chunk, exactly one, three chunks the last one padded
def test_the_chunked_rule_is_the_token_by_token_recurrence(tokens):
    generator = torch.Generator().manual_seed(tokens)
    q, k = (torch.randn(2, tokens, 2, 8, generator=generator) for _ in range(2))
    v = torch.randn(2, tokens, 4, 8, generator=generator)
    g = -torch.rand(2, tokens, 4, generator=generator)  # log decays in (−1, 0]
    beta = torch.rand(2, tokens, 4, generator=generator)
    ours = chunk_gated_delta_rule(q, k, v, g, beta)
    reference = naive_gated_delta_rule(q, k, v, g, beta)
    assert (ours.double() - reference).abs().max().item() <= 1e-4 * max(1.0, reference.abs().max().item())


def test_padded_tokens_are_zeroed_before_the_delta_net_as_hf_does():
    """Left padding: HF multiplies the linear layer's input by the 2D mask; so does the block given key_mask."""
    model = hf_qwen3_next()
    net = model.model.layers[0].linear_attn
    h = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        expected = net(h, attention_mask=mask)
    block = build_block(BlockConfig(d_model=32, n_heads=4, norm="rmsnorm", ffn="swiglu", eps=1e-6,
                                    token_mixer=SPEC), seed=0)
    block.attn.load_state_dict({"in_proj_qkvz.weight": net.in_proj_qkvz.weight, "in_proj_ba.weight":
                                net.in_proj_ba.weight, "conv.weight": net.conv1d.weight, "dt_bias": net.dt_bias,
                                "A_log": net.A_log, "norm.weight": net.norm.weight,
                                "out_proj.weight": net.out_proj.weight})
    block.attend_with(key_mask=mask.bool())
    with torch.no_grad():
        ours = block.attn(h)
    assert (ours - expected).abs().max().item() <= 1e-6
    block.attend_with(key_mask=None)
    with torch.no_grad():
        unmasked = block.attn(h)
    assert (unmasked[1, 2:] - expected[1, 2:]).abs().max().item() > 1e-3  # the mask mattered: pads reached tokens


def test_the_layer_kinds_and_the_dense_layers_are_read_as_qwen3nextconfig_reads_them(tmp_path):
    """Without layer_types every 4th layer attends (the interval HF's config pops), and said so; with no experts
    every layer is dense; mlp_only_layers leaves its layers dense."""
    import transformers

    config = transformers.Qwen3NextConfig(**{**SMALL, "num_hidden_layers": 8})
    transformers.Qwen3NextForCausalLM(config).save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data.pop("layer_types")  # an older file
    (tmp_path / "config.json").write_text(json.dumps(data))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    kinds = ["linear_attention" if info.family.layer_fields(info.config, k).get("token_mixer") else "full_attention"
             for k in range(8)]
    assert kinds == config.layer_types
    assert any("every 4th layer attends" in note for note in info.family.notes(info.config))
    config_ = checkpoint_config(checkpoint, info, {})
    dense = [config_.replace_settings(info.family.layer_fields(info.config, k)).experts is None for k in range(8)]
    assert dense == [k == 1 for k in range(8)]
    data["num_experts"] = 0
    (tmp_path / "config.json").write_text(json.dumps(data))
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    assert checkpoint_config(checkpoint, info, {}).experts is None


def test_a_gated_delta_nets_spec_is_checked_and_survives_json():
    with pytest.raises(ConfigError, match="must divide evenly among"):
        GatedDeltaNet(key_heads=3, value_heads=4, key_dims=8, value_dims=8)
    with pytest.raises(ConfigError, match="must be a positive integer"):
        GatedDeltaNet(key_heads=2, value_heads=4, key_dims=0, value_dims=8)
    with pytest.raises(ConfigError, match="token mixer is causal"):
        BlockConfig(d_model=32, n_heads=4, causal=False, token_mixer=SPEC)
    with pytest.raises(ConfigError, match="attn_output_gate gates attention"):
        BlockConfig(d_model=32, n_heads=4, attn_output_gate=True, token_mixer=SPEC)
    config = BlockConfig(d_model=32, n_heads=4, token_mixer=SPEC)
    assert BlockConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    with pytest.raises(ConfigError, match="no mixer blocktrace knows"):
        BlockConfig(d_model=32, n_heads=4, token_mixer={"mixer": "mamba2", "kernel": 4})


def test_gated_attention_multiplies_each_heads_output_by_its_gate():
    """By hand: out_proj(attention(x) ⊙ sigmoid(gate_proj(x))), against the block with attn_output_gate."""
    config = BlockConfig(d_model=16, n_heads=2, norm="rmsnorm", ffn="swiglu", bias=False, attn_output_gate=True)
    block = build_block(config, seed=3)
    ungated = build_block(config.replace(attn_output_gate=False), seed=3)
    ungated.attn.load_state_dict({k: v for k, v in block.attn.state_dict().items() if "gate_proj" not in k})
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        captured = {}
        hook = ungated.attn.out_proj.register_forward_hook(lambda m, i, o: captured.setdefault("mixed", i[0]))
        ungated.attn(x)
        hook.remove()
        expected = block.attn.out_proj(captured["mixed"] * torch.sigmoid(block.attn.gate_proj(x)))
        assert (block.attn(x) - expected).abs().max().item() <= 1e-6


def test_run_prints_the_mixers_in_the_operation_column(invoke, saved):
    directory, _ = saved
    text = invoke("run", "--weights", str(directory), "--layer", "0", "--token-ids", "1", "2", "3").stdout
    assert "attn_out = GatedDeltaNet[4 heads, conv 4](x_norm1)" in text and "S ← exp(g)·S" in text, text
    text = invoke("run", "--weights", str(directory), "--layer", "3", "--token-ids", "1", "2", "3").stdout
    assert "MultiHeadAttention[output gate](x_norm1)" in text and "sigmoid(gate_proj(x_in))" in text, text


def test_the_delta_net_is_named_as_itself_in_both_languages(invoke, saved):
    """It was titled and noted as a short convolution (the first mixer's words, keyed on a sub-step both have)."""
    directory, _ = saved
    args = ("run", "--weights", str(directory), "--layer", "0", "--token-ids", "1", "2", "3")
    english, chinese = invoke(*args).stdout, invoke(*args, "--lang", "zh").stdout
    assert "inside attn, a gated delta net" in english and "short convolution" not in english
    assert "note: attn is GatedDeltaNet, a token mixer without attention weights" in english
    assert "attn 内部（门控 delta 层）" in chinese and "短卷积" not in chinese
    assert "注: attn 是 GatedDeltaNet" in chinese and "注: 门控 delta 层：0, 1, 2" in chinese
