"""Each layer against its formula written out by hand on small tensors."""

import math

import torch
from torch.nn import functional as F

from blocktrace.config import BlockConfig
from blocktrace.model.layers import MLP, GatedFFN, MultiHeadAttention, RMSNorm

torch.manual_seed(0)


def test_rmsnorm_is_x_over_root_mean_square_times_gain():
    norm = RMSNorm(5, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0, 3.0]))
    x = torch.randn(3, 5)
    expected = torch.stack([row / math.sqrt(sum(v * v for v in row.tolist()) / 5 + 1e-6) for row in x]) * norm.weight
    assert torch.allclose(norm(x), expected, atol=1e-6)


def test_swiglu_is_down_of_silu_gate_times_up():
    ffn = GatedFFN(BlockConfig(d_model=4, n_heads=1, d_ff=6, ffn="swiglu"))
    x = torch.randn(2, 3, 4)
    gate = x @ ffn.gate.weight.T + ffn.gate.bias
    up = x @ ffn.up.weight.T + ffn.up.bias
    swish = gate * (1 / (1 + torch.exp(-gate)))
    expected = (swish * up) @ ffn.down.weight.T + ffn.down.bias
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_gelu_tanh_is_gpt2_gelu_new():
    ffn = MLP(BlockConfig(d_model=4, n_heads=1, d_ff=8, ffn="gelu_tanh"))
    h = torch.linspace(-6, 6, 101)
    gelu_new = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    assert torch.allclose(ffn.act(h), gelu_new, atol=1e-6)
    exact = MLP(BlockConfig(d_model=4, n_heads=1, ffn="gelu")).act(h)
    assert torch.allclose(exact, 0.5 * h * (1 + torch.erf(h / math.sqrt(2))), atol=1e-6)


def _attention_by_hand(attn: MultiHeadAttention, x: torch.Tensor, causal: bool):
    """Per head, per query, with Python loops: softmax(q·k/√hd) over the allowed keys."""
    t, d = x.shape
    hd = d // attn.n_heads
    q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
    heads, weights = [], torch.zeros(attn.n_heads, t, t)
    for h in range(attn.n_heads):
        cols = slice(h * hd, (h + 1) * hd)
        out = torch.zeros(t, hd)
        for i in range(t):
            keys = range(i + 1) if causal else range(t)
            scores = torch.tensor([float(q[i, cols] @ k[j, cols]) / math.sqrt(hd) for j in keys])
            p = torch.exp(scores - scores.max())
            p = p / p.sum()
            for j, pj in zip(keys, p):
                weights[h, i, j] = pj
                out[i] += pj * v[j, cols]
        heads.append(out)
    return attn.out_proj(torch.cat(heads, dim=-1)), weights


def test_attention_matches_the_formula_and_exposes_its_weights():
    for causal in (True, False):
        attn = MultiHeadAttention(BlockConfig(d_model=6, n_heads=3, causal=causal))
        x = torch.randn(4, 6)
        seen = {}
        attn.weights.register_forward_hook(lambda m, i, o: seen.__setitem__("w", o))
        with torch.no_grad():
            out = attn(x)
            expected, expected_weights = _attention_by_hand(attn, x, causal)
        assert seen["w"].shape == (3, 4, 4)
        assert torch.allclose(out, expected, atol=1e-5)
        assert torch.allclose(seen["w"], expected_weights, atol=1e-6)


def test_batched_input_gives_the_same_rows_as_unbatched():
    attn = MultiHeadAttention(BlockConfig(d_model=8, n_heads=2))
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        batched = attn(x)
        assert torch.allclose(batched[1], attn(x[1]), atol=1e-6)
        assert torch.allclose(batched, F.scaled_dot_product_attention(
            *(attn._split_heads(p(x)) for p in (attn.q_proj, attn.k_proj, attn.v_proj)), is_causal=True
        ).transpose(-3, -2).reshape(3, 5, 8) @ attn.out_proj.weight.T + attn.out_proj.bias, atol=1e-5)


def test_rope_frequencies_stay_float32_when_the_block_is_cast_as_huggingface_keeps_them():
    """Once: `--dtype bfloat16` cast inv_freq too; at T 1024 attention then differed from HF's by 0.71 on 7.5."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from blocktrace.model.block import build_block
    from blocktrace.vocab import FFNKind, Norm

    config = BlockConfig(d_model=64, n_heads=4, norm=Norm.RMSNORM, ffn=FFNKind.SWIGLU, rope_theta=10000.0, bias=False)
    rope = build_block(config).to(torch.bfloat16).attn.rope
    assert rope.inv_freq.dtype == torch.float32
    hf = LlamaRotaryEmbedding(LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=10000.0))
    positions = torch.arange(2048)[None]
    expected_cos, expected_sin = hf(torch.zeros(1, 2048, 16, dtype=torch.bfloat16), positions)
    cos, sin = rope.cos_sin(2048, "cpu", torch.bfloat16)
    assert torch.equal(cos, expected_cos[0]) and torch.equal(sin, expected_sin[0])


def test_rmsnorm_multiplies_its_gain_where_each_family_does_in_bfloat16():
    """Llama casts the normalised value before the gain, OLMo-2 multiplies in float32 and casts after: in bf16 the
    two differ, and each of blocktrace's norms equals its family's bit for bit."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.olmo2.modeling_olmo2 import Olmo2RMSNorm

    from blocktrace.model.layers import RMSNorm

    x = (torch.randn(64, 256, generator=torch.Generator().manual_seed(3)) * 30).to(torch.bfloat16)
    gain = (torch.rand(256, generator=torch.Generator().manual_seed(4)) * 3).to(torch.bfloat16)
    results = {}
    for name, ours, theirs in (("llama", RMSNorm(256, 1e-6), LlamaRMSNorm(256, 1e-6)),
                               ("olmo2", RMSNorm(256, 1e-6, gain_float32=True), Olmo2RMSNorm(256, 1e-6))):
        for norm in (ours, theirs):
            norm.to(torch.bfloat16).weight.data.copy_(gain)
        results[name] = ours(x)
        assert torch.equal(results[name], theirs(x)), name
    assert not torch.equal(results["llama"], results["olmo2"])


def test_latent_attention_builds_the_unrotated_key_only_when_a_hook_would_see_it():
    """The attn.k sub-step (each head's key before RoPE, as HF's layer holds it) is one [H, T, nope + rope] copy:
    an untraced forward does not make it, a hooked one does, and neither changes the output."""
    from blocktrace.config import LatentWidths
    from blocktrace.model.block import build_block
    from blocktrace.vocab import Norm

    config = BlockConfig(d_model=16, n_heads=2, norm=Norm.RMSNORM, rope_theta=10000.0,
                         latent=LatentWidths(kv_rank=8, nope_dims=4, rope_dims=4, value_dims=6))
    block = build_block(config, seed=3)
    x = torch.randn(5, 16, generator=torch.Generator().manual_seed(3))
    seen = []
    block.attn.k.forward = lambda value: seen.append(value.shape) or value
    with torch.no_grad():
        plain = block(x)
        assert seen == []
        handle = block.attn.k.register_forward_hook(lambda module, args, output: None)
        hooked = block(x)
        handle.remove()
    assert seen == [(2, 5, 8)] and torch.equal(plain, hooked)
