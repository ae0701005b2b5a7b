"""A mixture of experts' ffn opened: the router's logits and probabilities, the routed sum and
the shared expert, each against HF's own; the routing statistics against HF's load-balance loss
and a naive count; the routing findings on both sides."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import make_deepseek, randomise_hf

from blocktrace.config import BlockConfig, Experts
from blocktrace.diagnose.health import evaluate
from blocktrace.model.block import build_block
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.loader import embed_token_ids, hidden_state_before, load_block
from blocktrace.tracing.tracer import trace

IDS = [3, 14, 15, 92, 65, 35, 8, 42, 7, 11, 13, 17, 19, 23, 29, 31]
SMALL = dict(hidden_size=32, num_attention_heads=4, intermediate_size=48, num_hidden_layers=2, vocab_size=101,
             max_position_embeddings=64, num_key_value_heads=2, attn_implementation="eager")


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    import transformers

    config = transformers.Qwen2MoeConfig(**SMALL, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                                         shared_expert_intermediate_size=40)
    model = transformers.Qwen2MoeForCausalLM(config).eval()
    randomise_hf(model, seed=11)
    directory = tmp_path_factory.mktemp("qwen2_moe")
    model.save_pretrained(directory)
    return model, directory


def traced_layer(directory, layer: int):
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    config = checkpoint_config(checkpoint, info, {})
    x = hidden_state_before(checkpoint, info, config, embed_token_ids(checkpoint, info, IDS), layer)
    return trace(load_block(checkpoint, info, layer, config), x, keep_tensors=True, checks=True)


def test_router_substeps_and_routing_equal_huggingfaces(qwen2_moe):
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    model, directory = qwen2_moe
    with torch.no_grad():
        output = model(torch.tensor([IDS]), output_router_logits=True)
    for layer in range(2):
        traced = traced_layer(directory, layer)
        tensors = traced.tensors()
        hf_logits = output.router_logits[layer]
        assert (tensors["ffn.router_logits"].reshape(hf_logits.shape) - hf_logits).abs().max() <= 1e-5
        probs = torch.softmax(hf_logits.float(), dim=-1)
        assert (tensors["ffn.router_probs"].reshape(probs.shape) - probs).abs().max() <= 1e-6
        routing = traced.routing
        hf_balance = load_balancing_loss_func((hf_logits,), 4, 2).item()
        assert routing.balance_loss == pytest.approx(hf_balance, rel=1e-5)
        counts = [0] * 4  # a naive count of the experts each token went to
        for row in probs.tolist():
            for expert in sorted(range(4), key=lambda e: -row[e])[:2]:
                counts[expert] += 1
        assert routing.load == pytest.approx([c / (2 * len(IDS)) for c in counts])
        assert routing.tokens == len(IDS) and routing.dead == [e for e in range(4) if counts[e] == 0]
        assert routing.chosen == torch.topk(probs, 2, dim=-1).indices.tolist()  # each token's experts, as HF's
        lse = torch.logsumexp(hf_logits.float(), -1)
        assert routing.z_loss == pytest.approx(lse.pow(2).mean().item(), rel=1e-5)


def test_the_shared_expert_and_the_routed_sum_add_up_to_the_ffn_step(qwen2_moe):
    _, directory = qwen2_moe
    tensors = traced_layer(directory, 0).tensors()
    assert torch.allclose(tensors["ffn.routed"] + tensors["ffn.shared"], tensors["ffn"], atol=1e-6)


def moe_block(**changes):
    config = BlockConfig(d_model=16, n_heads=2, d_ff=24, ffn="swiglu", norm="rmsnorm", bias=False,
                         experts=Experts(n_experts=8, experts_per_token=2), **changes)
    return build_block(config, seed=4)


def routing_flags(block, tokens: int = 64, shift: float = 0.0) -> list[tuple[str, str]]:
    x = torch.randn(1, tokens, 16, generator=torch.Generator().manual_seed(9))
    x[..., 0] += shift
    return [(f.name, f.level.value) for f in evaluate([trace(block, x, checks=True)]) if f.cause.value == "routing"
            and f.level.value != "info"]


def test_a_healthy_router_raises_nothing_and_a_collapsed_one_is_caught():
    assert routing_flags(moe_block()) == []
    collapsed = moe_block()
    with torch.no_grad():  # every token's first feature is large, and only experts 0 and 1 read it
        collapsed.ffn.router.weight.zero_()
        collapsed.ffn.router.weight[:2, 0] = 5.0
    assert routing_flags(collapsed, shift=20.0) == [("router_collapse", "error")]
    x = torch.randn(1, 64, 16, generator=torch.Generator().manual_seed(9))
    x[..., 0] += 20.0
    context = [f.name for f in evaluate([trace(collapsed, x, checks=True)]) if f.level.value == "info"]
    assert "dead_experts" in context  # six experts without a token: said, as context


def test_too_few_tokens_never_call_an_expert_dead():
    """4 tokens × 2 slots over 8 experts: an expert without a token is chance, not a finding."""
    assert routing_flags(moe_block(), tokens=4) == []


def test_router_logits_past_bf16s_half_step_are_caught():
    block = moe_block()
    with torch.no_grad():
        block.ffn.router.weight.mul_(500.0)
    assert ("router_logit_growth", "warning") in routing_flags(block)


def test_the_table_and_the_json_show_the_router_and_the_routing(invoke, qwen2_moe):
    _, directory = qwen2_moe
    ids = list(map(str, IDS))
    text = invoke("run", "--weights", str(directory), "--token-ids", *ids).stdout
    assert "inside ffn: the router, then the experts it chose" in text
    assert "ffn.router_probs" in text and "ffn.shared" in text and "MoE[top-2 of 4 SwiGLU + shared]" in text
    assert "routing: 16 tokens, each to 2 of 4 experts" in text and "load-balance loss" in text
    assert "experts chosen, largest weight first: " in text
    report = json.loads(invoke("run", "--weights", str(directory), "--token-ids", *ids, "--json").stdout)
    assert [s["name"] for s in report["ffn_substeps"]] == ["ffn.router_logits", "ffn.router_probs", "ffn.routed",
                                                           "ffn.shared"]
    assert report["routing"]["experts"] == 4 and sum(report["routing"]["load"]) == pytest.approx(1.0)
    assert report["config"]["experts"]["n_experts"] == 4 and report["config"]["experts"]["shared_expert_d_ff"] == 40


def test_save_keeps_the_router_and_expert_substeps(invoke, qwen2_moe, tmp_path):
    from safetensors.torch import load_file

    _, directory = qwen2_moe
    path = tmp_path / "moe.safetensors"
    assert invoke("run", "--weights", str(directory), "--token-ids", *map(str, IDS), "--save", str(path)).exit_code == 0
    saved = load_file(str(path))
    assert torch.allclose(saved["ffn.routed"] + saved["ffn.shared"], saved["ffn"], atol=1e-6)
    assert saved["ffn.router_probs"].shape == (len(IDS), 4)


def test_a_dense_layer_of_a_sparse_model_has_one_ffn(tmp_path):
    import transformers

    config = transformers.Qwen3MoeConfig(**{**SMALL, "num_hidden_layers": 3}, num_experts=4, num_experts_per_tok=2,
                                         moe_intermediate_size=24, mlp_only_layers=[1])
    transformers.Qwen3MoeForCausalLM(config).save_pretrained(tmp_path)
    checkpoint = Checkpoint(tmp_path)
    info = model_info(checkpoint)
    blocks = [load_block(checkpoint, info, layer, checkpoint_config(checkpoint, info, {})) for layer in range(3)]
    assert [block.config.experts and block.config.experts.n_experts for block in blocks] == [4, None, 4]
    assert blocks[1].config.d_ff == 48


def test_an_hf_moe_layer_traced_bare_reports_hfs_routing(qwen2_moe):
    """HF's own layer, its router hooked: the same load-balance loss as HF computes for that layer."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    model, _ = qwen2_moe
    with torch.no_grad():
        output = model(torch.tensor([IDS]), output_router_logits=True, output_hidden_states=True)
    traced = trace(model.model.layers[1], output.hidden_states[1], checks=True)
    expected = load_balancing_loss_func((output.router_logits[1],), 4, 2).item()
    assert traced.routing.balance_loss == pytest.approx(expected, rel=1e-5) and traced.routing.tokens == len(IDS)


def test_a_watch_records_each_layers_routing_and_track_shows_it_over_training(invoke, tmp_path):
    """A tiny Mixtral trained a few steps with a Watch in its loop: expert load and router entropy per layer and
    record, read back through the timeline schema and shown by track."""
    import transformers

    from blocktrace.training.timeline import read_timeline
    from blocktrace.training.watch import Watch

    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
        **SMALL, num_local_experts=4, num_experts_per_tok=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(1))
    with Watch(model, tmp_path / "run.jsonl", every=2) as watch:
        for _ in range(5):
            optimizer.zero_grad()
            loss = model(ids, labels=ids).loss
            loss.backward()
            watch.step(loss)
            optimizer.step()
    records = list(read_timeline(tmp_path / "run.jsonl"))
    assert [r["step"] for r in records] == [0, 2, 4]
    for record in records:
        for layer in record["layers"]:
            routing = layer["routing"]
            assert routing["experts"] == 4 and routing["tokens"] == 48 and sum(routing["load"]) == pytest.approx(1)
    text = invoke("track", str(tmp_path / "run.jsonl")).stdout
    assert "router load-balance loss, per layer" in text and "busiest expert's share of the token slots" in text


@pytest.mark.parametrize("name, kind", [
    ("mlp.gate.weight", "router"), ("block_sparse_moe.gate.weight", "router"), ("ffn.router.weight", "router"),
    ("mlp.shared_expert_gate.weight", "router"), ("ffn.gate.weight", "ffn_w1"), ("mlp.gate_proj.weight", "ffn_w1"),
    ("mlp.experts.3.gate_proj.weight", "ffn_w1"), ("block_sparse_moe.experts.0.w2.weight", "ffn_w2"),
])
def test_a_router_is_a_kind_of_its_own_not_an_ffn_gate(name, kind):
    from blocktrace.diagnose.weights import tensor_kind

    assert tensor_kind(name) == kind


def _layer_two_routed(model, router, directory):
    """HF's router output at layer 2 of `model` on IDS, and the routing blocktrace reports there from its own block
    (read from the model saved to `directory`) and from HF's layer traced bare."""
    model.save_pretrained(directory)
    seen = {}
    hook = router.register_forward_hook(lambda m, a, out: seen.update(output=out))
    with torch.no_grad():
        hidden = model(torch.tensor([IDS]), output_hidden_states=True).hidden_states[2]
    hook.remove()
    checkpoint = Checkpoint(directory)
    info = model_info(checkpoint)
    ours = trace(load_block(checkpoint, info, 2, checkpoint_config(checkpoint, info, {})), hidden[0], checks=True)
    return seen["output"], ours.routing, trace(model.model.layers[2], hidden, checks=True).routing


@pytest.mark.parametrize("family", ["deepseek_v3", "deepseek_v2"])
def test_deepseeks_grouped_routers_report_the_experts_hf_chose(family, tmp_path):
    """DeepSeek chooses within groups (V3: by sigmoid scores plus a bias the weights never see), so a token's experts
    are not the top-k of its probabilities: the routing reported is HF's own router's choice, token by token, from
    blocktrace's block and from HF's layer traced bare; V3's importance is its normalised sigmoid scores."""
    model = make_deepseek(family, {**SMALL, "num_hidden_layers": 3, "num_key_value_heads": 4}, seed=5)
    output, ours, bare = _layer_two_routed(model, model.model.layers[2].mlp.gate, tmp_path)
    expected = [sorted(row) for row in output[2].tolist()]
    for routing in (ours, bare):
        assert [sorted(row) for row in routing.chosen] == expected
    if family == "deepseek_v3":
        scores = torch.sigmoid(output[0].double())
        naive = (scores / scores.sum(-1, keepdim=True)).mean(0)
        assert ours.importance == pytest.approx(naive.tolist(), rel=1e-5)
        assert any(sorted(row) != sorted(torch.topk(scores[i], 3).indices.tolist())
                   for i, row in enumerate(output[2].tolist())), "the groups and the bias changed no choice"


def test_llama4s_router_reports_the_experts_hf_chose_and_their_softmax(tmp_path):
    """Llama-4's router returns its scores first and its logits second (HFLayer.router_logits_at): the routing
    blocktrace reports, from its own block and from HF's layer traced bare, is HF's choice (the top-k logits) and
    softmax(logits) as the importance."""
    import transformers
    from helpers import LLAMA4

    config = transformers.Llama4TextConfig(**{**SMALL, **LLAMA4, "num_hidden_layers": 3}, num_experts_per_tok=2)
    model = transformers.Llama4ForCausalLM(config).eval()
    randomise_hf(model, seed=9)
    output, ours, bare = _layer_two_routed(model, model.model.layers[2].feed_forward.router, tmp_path)
    expected = [sorted(row) for row in torch.topk(output[1], 2, dim=-1).indices.tolist()]
    importance = torch.softmax(output[1].double(), dim=-1).mean(0).tolist()
    for routing in (ours, bare):
        assert [sorted(row) for row in routing.chosen] == expected
        assert routing.importance == pytest.approx(importance, rel=1e-5)


def test_the_share_of_tokens_routed_twice_to_one_expert_is_counted_as_a_naive_loop_counts_it():
    from blocktrace.tracing.routing import RoutingSummary, routing_moments

    logits = torch.randn(2, 5, 4)
    chosen = torch.tensor([[[0, 1], [2, 2], [3, 0], [1, 1], [0, 2]], [[1, 1], [0, 3], [2, 1], [3, 3], [0, 0]]])
    summary = RoutingSummary.of(routing_moments(logits, torch.softmax(logits, -1), chosen).tolist(), 2)
    naive = sum(len(set(row)) < len(row) for row in chosen.reshape(-1, 2).tolist()) / 10
    assert summary.repeated_choice == pytest.approx(naive)


def _olmoe_routing_flags(swapped: bool) -> list[tuple[str, str]]:
    """One traced layer of a small HF OLMoE, its router as HF's (top-k of its softmax), or with torch.topk's
    (values, indices) bound the other way round and the indices cast back to integers (blind15's F01)."""
    import types

    import transformers
    from torch.nn import functional as F

    torch.manual_seed(0)
    model = transformers.OlmoeForCausalLM(transformers.OlmoeConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=4, num_experts=8, num_experts_per_tok=2))
    layer = model.model.layers[0]
    with torch.no_grad():
        layer.mlp.gate.weight.normal_(0, 0.02)

    def swapped_forward(self, hidden_states):
        hidden_states = hidden_states.reshape(-1, self.hidden_dim)
        logits = F.linear(hidden_states, self.weight)
        indices, values = torch.topk(torch.softmax(logits, dtype=torch.float, dim=-1), self.top_k, dim=-1)
        return logits, values.to(logits.dtype), indices.long()

    if swapped:
        layer.mlp.gate.forward = types.MethodType(swapped_forward, layer.mlp.gate)
    x = torch.randn(1, 64, 32, generator=torch.Generator().manual_seed(3))
    traced = trace(layer, x, checks=True)
    return [(f.name, f.level.value) for f in evaluate([traced]) if f.cause.value == "routing"
            and f.level.value != "info"]


def test_a_router_that_sends_a_token_to_one_expert_twice_is_no_top_k():
    """Seen in the fifteenth blind group (F01, calibration now): torch.topk's (values, indices) unpacked the other way
    round, the float 'indices' cast to integers — every token's two slots go to expert 0, while the router's
    probabilities, and so the load-balance loss's P, stay near uniform (router_collapse saw 4% of the way to
    collapsed). A top-k picks k different experts by definition."""
    assert _olmoe_routing_flags(swapped=False) == []
    assert _olmoe_routing_flags(swapped=True) == [("router_choice_repeats", "error")]
