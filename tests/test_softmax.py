"""tracing/softmax.py: attention written by hand, seen through the softmax it computes — for each way the tutorials
and nanoGPT write it, the Watch's max logit, entropies and causal sum equal those it measures from the sdpa call of
the same weights and mask (to 1e-6); a softmax outside the attention module is never taken for it; `check
--module`'s trace sees it too."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import NanoAttention, NanoGPT, nano_batch
from torch.nn import functional as F

from blocktrace import Watch
from blocktrace.tracing.tracer import trace
from blocktrace.training.timeline import read_timeline

T = 12  # nano_batch's tokens


def _alibi(heads: int, t: int) -> torch.Tensor:
    """ALiBi's bias (Press et al. 2022): slope_h × (j − i), slopes 2^(−8h/H)."""
    slopes = torch.tensor([2 ** (-8 * (h + 1) / heads) for h in range(heads)])
    distance = torch.arange(t)[None, :] - torch.arange(t)[:, None]
    return slopes[:, None, None] * distance[None].float()


def _causal(t: int) -> torch.Tensor:
    return torch.ones(t, t, dtype=torch.bool).tril()


class Manual(NanoAttention):
    """The same projections; the scores, mask and softmax written by hand in one of the ways people write them."""

    def __init__(self, d: int, heads: int, way: str):
        super().__init__(d, heads)
        self.way = way

    def heads_of(self, x):
        b, t, c = x.shape
        return [z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.c_attn(x).split(c, 2)]

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.heads_of(x)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        if self.way in ("nanogpt", "fused"):
            weights = self.masked(scores, t) if self.way == "nanogpt" else None
        else:
            weights = self.masked(scores, t)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.sdpa_mask(t)) if weights is None else weights @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    def masked(self, scores, t):
        if self.way == "nanogpt":  # nanoGPT's manual path
            return F.softmax(scores.masked_fill(~_causal(t)[None, None], float("-inf")), dim=-1)
        if self.way == "bool-1e9":
            return torch.softmax(scores.masked_fill(_causal(t) == 0, -1e9), -1)
        if self.way == "additive":
            return (scores + torch.zeros(t, t).masked_fill(~_causal(t), float("-inf"))).softmax(dim=-1)
        if self.way == "alibi":
            return F.softmax(scores + self.sdpa_mask(t), dim=-1)
        raise AssertionError(self.way)

    def sdpa_mask(self, t):
        bias = _alibi(self.heads, t) if self.way == "alibi" else torch.zeros(self.heads, t, t)
        return bias.masked_fill(~_causal(t), float("-inf"))


class Sdpa(Manual):
    """The reference: the same scores' mask given to sdpa (measured by the Watch from that call)."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.heads_of(x)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.sdpa_mask(t))
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class GatedMlp(torch.nn.Module):
    """A feed-forward with a softmax of its own (over 12 = T gates: the shape of an attention's last dimension)."""

    def __init__(self, d: int):
        super().__init__()
        self.up, self.gate, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(d, T), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return self.down(F.gelu(self.up(x))) * F.softmax(self.gate(x), dim=-1).amax(-1, keepdim=True)


def _model(attention_kind, way: str, mlp: bool = False) -> NanoGPT:
    torch.manual_seed(0)
    model = NanoGPT()
    for block in model.h:
        state = block.attn.state_dict()
        block.attn = attention_kind(16, 2, way)
        block.attn.load_state_dict(state)
        if mlp:
            block.mlp = GatedMlp(16)
    return model


def _layers(model, path) -> list[dict]:
    """The first record's layers, from one training step under the README's Watch lines."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, path, every=1, optimizer=optimizer, overwrite=True) as watch:
        ids, targets = nano_batch(0)
        _, loss = model(ids, targets)
        loss.backward()
        watch.step(loss)
        optimizer.step()
    return read_timeline(path)[0]["layers"]


MEASURES = ("max_logit", "min_entropy", "future_weight_sum")


@pytest.mark.parametrize("way", ["nanogpt", "bool-1e9", "additive", "alibi"])
def test_hand_written_attention_measures_as_the_sdpa_call_of_the_same_weights(tmp_path, way):
    seen, reference = _layers(_model(Manual, way), tmp_path / "m.jsonl"), _layers(_model(Sdpa, way), tmp_path / "s.jsonl")
    for mine, theirs in zip(seen, reference):
        assert mine["max_logit"] is not None
        for name in MEASURES:
            assert mine[name] == pytest.approx(theirs[name], abs=1e-6), name
        assert mine["entropy_per_head"] == pytest.approx(theirs["entropy_per_head"], abs=1e-6)
        assert not any("not visible" in note for note in mine["notes"])
    assert seen[0]["future_weight_sum"] == pytest.approx(0.0, abs=1e-12)  # causal, and seen to be


def test_a_softmax_outside_the_attention_module_is_not_taken_for_it(tmp_path):
    mine = _layers(_model(Manual, "nanogpt", mlp=True), tmp_path / "m.jsonl")
    theirs = _layers(_model(Sdpa, "nanogpt", mlp=True), tmp_path / "s.jsonl")
    for a, b in zip(mine, theirs):
        assert a["max_logit"] == pytest.approx(b["max_logit"], abs=1e-6)
        assert a["entropy_per_head"] == pytest.approx(b["entropy_per_head"], abs=1e-6)


def test_the_same_attention_through_sdpa_is_measured_once(tmp_path):
    """sdpa inside a module whose code also has the hand-written lines unused: the sdpa call's measure only."""
    layers = _layers(_model(Manual, "fused"), tmp_path / "f.jsonl")
    reference = _layers(_model(Sdpa, "nanogpt"), tmp_path / "s.jsonl")
    assert [layer["max_logit"] for layer in layers] == pytest.approx([layer["max_logit"] for layer in reference])


def test_a_traced_user_block_sees_its_hand_written_attention(tmp_path):
    """`check --module` / `run --module` trace a user's block with trace(): its weights are those of the softmax."""
    model = _model(Manual, "nanogpt")
    x = torch.randn(2, T, 16)
    traced = trace(model.h[0], x, steps={"norm1": "ln_1", "attn": "attn", "norm2": "ln_2", "ffn": "mlp"}, checks=True)
    attention = traced.attention
    assert attention is not None and attention.future_weight_sum == pytest.approx(0.0, abs=1e-12)
    with torch.no_grad():
        q, k, _ = model.h[0].attn.heads_of(model.h[0].ln_1(x))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(8)
        expected = scores.masked_fill(~_causal(T), float("-inf")).amax().item()
    assert attention.max_logit == pytest.approx(expected, abs=1e-6)


class WrongScale(Manual):
    """The tutorial's line with the scale inverted: q·kᵀ × √d_head instead of ÷ √d_head."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.heads_of(x)
        scores = (q @ k.transpose(-2, -1)) * math.sqrt(k.size(-1))
        weights = F.softmax(scores.masked_fill(~_causal(t)[None, None], float("-inf")), dim=-1)
        return self.c_proj((weights @ v).transpose(1, 2).contiguous().view(b, t, c))


def _first_record(model, path) -> dict:
    _layers(model, path)
    return read_timeline(path)[0]


def test_scores_multiplied_by_the_square_root_of_the_head_width_are_caught_with_their_cause(tmp_path):
    record = _first_record(_model(WrongScale, "nanogpt"), tmp_path / "w.jsonl")
    found = [f for f in record["flags"] if f["name"] == "attention_scale_wrong"]
    assert found and found[0]["level"] == "error" and "× √8" in found[0]["detail"]
    assert record["diagnosis"][0]["cause"] == "architecture"


@pytest.mark.parametrize("way", ["nanogpt", "bool-1e9"])
def test_scores_divided_by_the_square_root_or_scaled_by_one_over_it_pass(tmp_path, way):
    record = _first_record(_model(Manual, way), tmp_path / "m.jsonl")  # × (1/√d) and its variants
    assert "attention_scale_wrong" not in {f["name"] for f in record["flags"]}
    from blocktrace.tracing.softmax import SoftmaxSeen

    with SoftmaxSeen() as seen:  # ÷ √d written as a division: the same scale, seen
        q = torch.randn(1, 2, 4, 8)
        torch.softmax((q @ q.transpose(-2, -1)) / math.sqrt(8), dim=-1)
    assert seen.scale == pytest.approx((1 / math.sqrt(8), 8))


MEMORY = 4  # learned memory keys and values before the text (x-transformers' num_mem_kv; Sukhbaatar et al. 2019)


class MemoryKV(Manual):
    """sdpa over [memory; text] keys: S = MEMORY + T keys for T queries. 'bottom-right': each query sees the memory
    and the text up to itself (the query is the last T of S positions); 'unmasked': every key; 'is_causal': torch's
    own flag, whose mask for S ≠ T is aligned top-left."""

    def __init__(self, d: int, heads: int, way: str):
        super().__init__(d, heads, way)
        self.memory_k = torch.nn.Parameter(torch.randn(heads, MEMORY, d // heads))
        self.memory_v = torch.nn.Parameter(torch.randn(heads, MEMORY, d // heads))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.heads_of(x)
        k = torch.cat([self.memory_k.expand(b, -1, -1, -1), k], dim=2)
        v = torch.cat([self.memory_v.expand(b, -1, -1, -1), v], dim=2)
        if self.way == "is_causal":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(t, MEMORY + t, dtype=torch.bool).tril(MEMORY) if self.way == "bottom-right" else None
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


def _load_partial(model_kind, way):
    torch.manual_seed(0)
    model = NanoGPT()
    for block in model.h:
        state = block.attn.state_dict()
        block.attn = model_kind(16, 2, way)
        block.attn.load_state_dict(state, strict=False)
    return model


def test_keys_before_the_text_are_no_future(tmp_path):
    """Seen in the fifteenth blind group (H4, a false alarm; calibration now): memory keys before the text, under
    a mask that lets query i see the memory and the text up to i, were read as weight on 'later' keys — the keys
    after index i of the S = M + T keys, not after the query's own position, M + i. Keys before the first query are
    the past (memory, a prefix, a cache); with them a mask that hides nothing is still found."""
    masked = _layers(_load_partial(MemoryKV, "bottom-right"), tmp_path / "m.jsonl")
    assert all(layer["future_weight_sum"] == pytest.approx(0.0, abs=1e-12) for layer in masked)
    assert "causal_leak" not in {f["name"] for f in read_timeline(tmp_path / "m.jsonl")[0]["flags"]}
    leaking = _layers(_load_partial(MemoryKV, "unmasked"), tmp_path / "u.jsonl")
    assert all(layer["future_weight_sum"] > 0 for layer in leaking)
    assert "causal_leak" in {f["name"] for f in read_timeline(tmp_path / "u.jsonl")[0]["flags"]}


def test_sdpa_is_causal_with_more_keys_than_queries_is_measured_as_the_kernel_computes_it():
    """torch's scaled_dot_product_attention aligns is_causal's mask top-left when S ≠ T (its docs; CausalBias): the
    weights the Watch measures must be the kernel's, whatever a user meant — their product with v is its output."""
    from blocktrace.tracing.tap import _masked_scores

    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    weights = torch.softmax(_masked_scores(q @ k.transpose(-1, -2) / math.sqrt(8), None, True), dim=-1)
    assert torch.allclose(weights @ v, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-6)
