"""The block's wiring, checked from the outside: saved step tensors must recombine exactly."""

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from blocktrace.config import BlockConfig
from blocktrace.model.block import build_block, execution_order
from blocktrace.tracing.tracer import trace

COMBINATIONS = list(itertools.product(["layernorm", "rmsnorm"], ["gelu", "gelu_tanh", "relu", "swiglu"], ["pre", "post"]))


def hand_norm(x, kind, eps=1e-5):
    """The norm at initialisation (gain 1, shift 0), written out."""
    if kind == "rmsnorm":
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("norm, ffn, placement", COMBINATIONS)
def test_steps_recombine(norm, ffn, placement):
    config = BlockConfig(d_model=16, n_heads=4, norm=norm, ffn=ffn, placement=placement)
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1)) * 3 + 1
    traced = trace(build_block(config, seed=3), x, keep_tensors=True)
    t = traced.tensors()
    assert [s.name for s in traced.steps] == list(execution_order(config))
    close = dict(atol=1e-5, rtol=1e-5)
    if placement == "pre":
        assert torch.allclose(t["norm1"], hand_norm(x, norm), **close)
        assert torch.allclose(t["residual1"], x + t["attn"], **close)
        assert torch.allclose(t["norm2"], hand_norm(t["residual1"], norm), **close)
        assert torch.allclose(t["residual2"], t["residual1"] + t["ffn"], **close)
        assert torch.equal(traced.output, t["residual2"])
    else:
        assert torch.allclose(t["residual1"], x + t["attn"], **close)
        assert torch.allclose(t["norm1"], hand_norm(t["residual1"], norm), **close)
        assert torch.allclose(t["residual2"], t["norm1"] + t["ffn"], **close)
        assert torch.allclose(t["norm2"], hand_norm(t["residual2"], norm), **close)
        assert torch.equal(traced.output, t["norm2"])
    assert torch.allclose(t["attn_weights"].sum(-1), torch.ones(2, 4, 6), atol=1e-6)


def _hooks_left(module: torch.nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in module.modules())


@settings(max_examples=25, deadline=None)
@given(
    heads=st.integers(1, 4), head_dim=st.integers(1, 6), tokens=st.integers(1, 7),
    batch=st.one_of(st.none(), st.integers(1, 3)), combination=st.sampled_from(COMBINATIONS),
)
def test_output_shape_equals_input_shape_and_no_hook_is_left(heads, head_dim, tokens, batch, combination):
    norm, ffn, placement = combination
    config = BlockConfig(d_model=heads * head_dim, n_heads=heads, norm=norm, ffn=ffn, placement=placement)
    block = build_block(config)
    shape = (tokens, config.d_model) if batch is None else (batch, tokens, config.d_model)
    traced = trace(block, torch.randn(*shape))
    assert traced.output.shape == shape and traced.shape_preserved
    assert all(step.shape == shape for step in traced.steps)
    assert traced.attention.shape == ((heads, tokens, tokens) if batch is None else (batch, heads, tokens, tokens))
    assert _hooks_left(block) == 0


def test_hooks_are_removed_when_the_forward_raises():
    block = build_block(BlockConfig(d_model=8, n_heads=2))
    with pytest.raises(RuntimeError):
        trace(block, torch.randn(3, 7))  # wrong width: the first linear layer raises
    assert _hooks_left(block) == 0


@pytest.mark.parametrize("placement", ["pre", "post"])
def test_causal_block_output_ignores_later_tokens(placement):
    block = build_block(BlockConfig(d_model=8, n_heads=2, placement=placement))
    x = torch.randn(6, 8)
    changed = x.clone()
    changed[4:] += 3.0 * torch.randn(2, 8)  # random: LayerNorm would cancel a constant shift
    with torch.no_grad():
        before, after = block(x), block(changed)
    assert torch.allclose(before[:4], after[:4], atol=1e-6)
    assert not torch.allclose(before[4:], after[4:])


def test_without_the_mask_earlier_tokens_do_change():
    block = build_block(BlockConfig(d_model=8, n_heads=2, causal=False))
    x = torch.randn(6, 8)
    changed = x.clone()
    changed[4:] += 3.0 * torch.randn(2, 8)  # random: LayerNorm would cancel a constant shift
    with torch.no_grad():
        assert not torch.allclose(block(x)[:4], block(changed)[:4])


def test_same_seed_same_parameters_and_caller_rng_untouched():
    config = BlockConfig(d_model=8, n_heads=2)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_block(config, seed=7), build_block(config, seed=7)
    assert torch.equal(torch.rand(1), expected_next)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(build_block(config, seed=8).attn.q_proj.weight, a.attn.q_proj.weight)


def test_building_a_block_leaves_every_accelerators_generator_alone(monkeypatch):
    """The block is built on the CPU from the CPU's generator: reseeding CUDA's (or another device's) generators, as
    torch.manual_seed does, would change the caller's random state there, which fork_rng(devices=[]) does not
    restore."""
    def reseeded(*args, **kwargs):
        raise AssertionError("an accelerator's generator was reseeded")

    for device in ("cuda", "mps", "xpu", "mtia"):
        module = getattr(torch, device, None)
        if module is not None and hasattr(module, "manual_seed_all"):
            monkeypatch.setattr(module, "manual_seed_all", reseeded)
        if module is not None and hasattr(module, "manual_seed"):
            monkeypatch.setattr(module, "manual_seed", reseeded)
    config = BlockConfig(d_model=8, n_heads=2)
    a, b = build_block(config, seed=7), build_block(config, seed=7)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def _copy_into_hf_gpt2_block(ours, hf_block):
    """Our nn.Linear [out, in] parameters into HF's Conv1D [in, out] layout."""
    with torch.no_grad():
        hf_block.ln_1.weight.copy_(ours.norm1.weight)
        hf_block.ln_1.bias.copy_(ours.norm1.bias)
        hf_block.ln_2.weight.copy_(ours.norm2.weight)
        hf_block.ln_2.bias.copy_(ours.norm2.bias)
        attn = ours.attn
        hf_block.attn.c_attn.weight.copy_(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).T)
        hf_block.attn.c_attn.bias.copy_(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        hf_block.attn.c_proj.weight.copy_(attn.out_proj.weight.T)
        hf_block.attn.c_proj.bias.copy_(attn.out_proj.bias)
        hf_block.mlp.c_fc.weight.copy_(ours.ffn.fc.weight.T)
        hf_block.mlp.c_fc.bias.copy_(ours.ffn.fc.bias)
        hf_block.mlp.c_proj.weight.copy_(ours.ffn.proj.weight.T)
        hf_block.mlp.c_proj.bias.copy_(ours.ffn.proj.bias)


def test_default_block_equals_huggingface_gpt2_block():
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    ours = build_block(BlockConfig(d_model=32, n_heads=4), seed=5)
    with torch.no_grad():  # make the LayerNorm gains and shifts non-trivial too
        for norm in (ours.norm1, ours.norm2):
            norm.weight.normal_(1.0, 0.3)
            norm.bias.normal_(0.0, 0.2)
    hf_block = GPT2Block(GPT2Config(n_embd=32, n_head=4, attn_implementation="eager"), layer_idx=0).eval()
    _copy_into_hf_gpt2_block(ours, hf_block)
    x = torch.randn(2, 9, 32)
    causal = torch.full((9, 9), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        expected = hf_block(x, attention_mask=causal)
        expected = expected[0] if isinstance(expected, tuple) else expected
        assert (ours(x) - expected).abs().max().item() <= 1e-5
