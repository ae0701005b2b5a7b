"""Watch: the blocks recorded inside a training loop, checked against hand computations on the
very batch and weights of the recorded step."""

from __future__ import annotations

import json
import math
import os
import signal
import warnings

import pytest
import torch
from helpers import NanoGPT, nano_batch
from torch.nn import functional as F

from blocktrace.errors import BlocktraceError, UsageError
from blocktrace.training.timeline import read_timeline
from blocktrace.training.watch import Watch, find_blocks


def _train(model, watch, steps: int, lr: float = 1e-2, before_forward=None):
    """A plain training loop with the watch's one line; returns the records it wrote."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    written = []
    for step in range(steps):
        ids, targets = nano_batch(step)
        if before_forward is not None:
            before_forward(step, model, ids)
        _, loss = model(ids, targets)
        optimizer.zero_grad()
        loss.backward()
        entry = watch.step(loss)
        if entry is not None:
            written.append(entry)
        optimizer.step()
    watch.close()
    return written


def _clone(model):
    """The model's weights at this moment (a deepcopy would copy the watch's hooks too)."""
    clone = NanoGPT()
    clone.load_state_dict(model.state_dict())
    return clone


def _layer_norm(x, norm):
    mean = x.mean(-1, keepdim=True)
    variance = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(variance + norm.eps) * norm.weight + norm.bias


def _hand_block(block, x):
    """nanoGPT's block written out: the six steps, and the attention's causal scores."""
    heads = block.attn.heads
    b, t, d = x.shape
    norm1 = _layer_norm(x, block.ln_1)
    q, k, v = (norm1 @ block.attn.c_attn.weight.T + block.attn.c_attn.bias).split(d, -1)
    q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // heads)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    weights = torch.softmax(scores.masked_fill(future, float("-inf")), -1)
    mixed = (weights @ v).transpose(1, 2).reshape(b, t, d)
    attn = mixed @ block.attn.c_proj.weight.T + block.attn.c_proj.bias
    residual1 = x + attn
    norm2 = _layer_norm(residual1, block.ln_2)
    fc, proj = block.mlp[0], block.mlp[2]
    hidden = norm2 @ fc.weight.T + fc.bias
    ffn = (0.5 * hidden * (1 + torch.erf(hidden / math.sqrt(2)))) @ proj.weight.T + proj.bias
    steps = {"norm1": norm1, "attn": attn, "residual1": residual1, "norm2": norm2, "ffn": ffn,
             "residual2": residual1 + ffn}
    entropy = -(weights * torch.log(weights.clamp_min(1e-30))).sum(-1)  # [B, H, T]
    return steps, {"max_logit": scores.masked_fill(future, float("-inf")).max().item(),
                   "entropy_per_head": entropy.mean(dim=(0, 2)).tolist()}


def test_a_recorded_step_holds_the_statistics_of_the_batch_training_ran(tmp_path):
    torch.manual_seed(0)
    model = NanoGPT()
    seen = {}

    def keep(step, model, ids):
        if step == 2:
            seen["model"], seen["ids"] = _clone(model), ids

    entries = _train(model, Watch(model, tmp_path / "run.jsonl", every=2), steps=5, before_forward=keep)
    assert [e["step"] for e in entries] == [0, 2, 4]
    entry = read_timeline(tmp_path / "run.jsonl")[1]
    reference = seen["model"]
    ids = seen["ids"]
    with torch.no_grad():
        x = reference.wte(ids) + reference.wpe(torch.arange(ids.shape[1]))
        for index, block in enumerate(reference.h):
            steps, attention = _hand_block(block, x)
            layer = entry["layers"][index]
            for name, value in steps.items():
                got = layer["steps"][name]
                assert got["mean"] == pytest.approx(value.mean().item(), abs=1e-5), name
                assert got["std"] == pytest.approx(value.std(unbiased=False).item(), rel=1e-4), name
                assert got["max"] == pytest.approx(value.max().item(), rel=1e-5), name
                assert got["min"] == pytest.approx(value.min().item(), rel=1e-5), name
            assert layer["max_logit"] == pytest.approx(attention["max_logit"], rel=1e-5)
            assert layer["entropy_per_head"] == pytest.approx(attention["entropy_per_head"], rel=1e-4)
            assert layer["future_weight_sum"] == 0.0
            x = steps["residual2"]
        _, loss = reference(ids, nano_batch(2)[1])
    assert entry["loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert entry["lr"] is None and entry["source"] == "watch"


def test_a_tensor_zeroed_between_records_is_the_largest_change_not_a_blank(tmp_path):
    """Once: ‖ΔW‖ was divided by the new norm, so a zeroed tensor showed "—" and another kind looked largest."""
    torch.manual_seed(1)
    model = NanoGPT()

    def zero_at_the_recorded_step(step, m, ids):
        if step == 6:
            with torch.no_grad():
                for parameter in m.h[1].mlp[2].parameters():
                    parameter.zero_()

    _train(model, Watch(model, tmp_path / "run.jsonl", every=3), steps=7, before_forward=zero_at_the_recorded_step)
    weights = read_timeline(tmp_path / "run.jsonl")[2]["layers"][1]["weights"]
    assert weights["ffn_w2"]["update_ratio"] == pytest.approx(1.0) and weights["ffn_w2"]["norm"] == 0.0
    assert max(weights, key=lambda kind: weights[kind]["update_ratio"]) == "ffn_w2"


def test_update_ratio_is_the_parameters_own_relative_change(tmp_path):
    torch.manual_seed(1)
    model = NanoGPT()
    copies = {}
    _train(model, Watch(model, tmp_path / "run.jsonl", every=3), steps=7,
           before_forward=lambda step, m, ids: copies.__setitem__(step, _clone(m)))
    records = read_timeline(tmp_path / "run.jsonl")
    assert [r["step"] for r in records] == [0, 3, 6]
    assert all(w["update_ratio"] is None for w in records[0]["layers"][0]["weights"].values())
    for layer in (0, 1):
        now, before = copies[6].h[layer], copies[3].h[layer]
        for kind, names in {"attn_qkv": ["attn.c_attn"], "attn_o": ["attn.c_proj"], "ffn_w1": ["mlp.0"],
                            "ffn_w2": ["mlp.2"], "norm": ["ln_1", "ln_2"]}.items():
            new = torch.cat([p.flatten() for n in names for p in now.get_submodule(n).parameters()]).double()
            old = torch.cat([p.flatten() for n in names for p in before.get_submodule(n).parameters()]).double()
            got = records[2]["layers"][layer]["weights"][kind]
            assert got["update_ratio"] == pytest.approx(((new - old).norm() / old.norm()).item(), rel=1e-6), kind
            assert got["norm"] == pytest.approx(new.norm().item(), rel=1e-6)


def test_gradient_norms_are_each_blocks_own(tmp_path):
    torch.manual_seed(2)
    model = NanoGPT()
    watch = Watch(model, tmp_path / "run.jsonl", every=1)
    ids, targets = nano_batch(0)
    _, loss = model(ids, targets)
    loss.backward()
    entry = watch.step(loss)
    watch.close()
    for index, block in enumerate(model.h):
        expected = torch.cat([p.grad.flatten() for p in block.parameters()]).norm().item()
        assert entry["layers"][index]["grad_norm"] == pytest.approx(expected, rel=1e-6)


def test_between_records_nothing_is_attached_but_the_batch_key(tmp_path):
    """Between records no block is hooked and attention is not wrapped; the model itself keeps one pre-hook, which
    keys each step's batch (two sums of its ids, training/order.py: an order repeated every epoch), and one forward
    hook, which says its forward has ended (training/entry.py: a part of the model called outside it is the loop's
    entry); close() takes those off too."""
    torch.manual_seed(3)
    model = NanoGPT()
    original_sdpa = F.scaled_dot_product_attention
    watch = Watch(model, tmp_path / "run.jsonl", every=4)
    states = []

    def look(step, model, ids):
        inside = [m for m in model.modules() if m is not model]
        hooked = any(m._forward_hooks or m._forward_pre_hooks for m in inside)
        states.append((step, hooked, F.scaled_dot_product_attention is not original_sdpa,
                       len(model._forward_pre_hooks), len(model._forward_hooks)))

    _train(model, watch, steps=9, before_forward=look)
    assert states == [(s, s % 4 == 0, s % 4 == 0, 2 if s % 4 == 0 else 1, 2 if s % 4 == 0 else 1) for s in range(9)]
    assert F.scaled_dot_product_attention is original_sdpa
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())  # _train closed the watch


def test_a_missing_causal_mask_is_caught_inside_training(tmp_path):
    torch.manual_seed(4)
    model = NanoGPT(causal=False)
    entries = _train(model, Watch(model, tmp_path / "run.jsonl", every=2), steps=3)
    assert entries[0]["layers"][0]["future_weight_sum"] > 1.0
    leaks = [f for f in entries[0]["flags"] if f["name"] == "causal_leak"]
    assert leaks and leaks[0]["level"] == "error"
    assert entries[0]["diagnosis"][0]["cause"] == "mask"


def test_a_healthy_run_raises_no_errors(tmp_path):
    torch.manual_seed(5)
    model = NanoGPT()
    with torch.no_grad():  # nanoGPT's init: PyTorch's N(0, 1) embedding, tied as the head, predicts worse than uniform
        model.wte.weight.normal_(0.0, 0.02)
    entries = _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=11, lr=3e-3)
    assert [f for e in entries for f in e["flags"] if f["level"] == "error"] == []


def test_a_crashed_run_keeps_every_record_written_before(tmp_path):
    """A training process killed outright (SIGKILL: no handler, no flush) after its records: a forked child, which
    shares this process's imported torch, trains and kills itself."""
    path = tmp_path / "run.jsonl"
    child = os.fork()
    if child == 0:
        try:
            torch.set_num_threads(1)  # as DataLoader workers do: a forked child does not reuse the parent's pool
            torch.manual_seed(0)
            model = NanoGPT()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            watch = Watch(model, path, every=2)
            for step in range(5):
                ids, targets = nano_batch(step)
                _, loss = model(ids, targets)
                loss.backward()
                watch.step(loss)
                optimizer.step()
                optimizer.zero_grad()
            os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(1)  # never back into pytest from the child
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, status
    assert [r["step"] for r in read_timeline(path)] == [0, 2, 4]
    with open(path, "a") as handle:  # killed in the middle of a line: the lines before still stand
        handle.write(json.dumps({"format": "blocktrace.timeline"})[:12])
    assert [r["step"] for r in read_timeline(path)] == [0, 2, 4]


def test_blocks_are_found_or_refused_by_name():
    model = NanoGPT(layers=3)
    assert find_blocks(model) == list(model.h)
    assert find_blocks(torch.nn.parallel.DataParallel(model)) == list(model.h)
    assert find_blocks(model, "h") == list(model.h)
    with pytest.raises(UsageError, match="no submodule 'layers'"):
        find_blocks(model, "layers")
    with pytest.raises(UsageError, match="cannot find the Transformer blocks of Sequential"):
        find_blocks(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(UsageError, match="every must be a positive integer"):
        Watch(model, "unused.jsonl", every=0)


def test_tensorboard_receives_the_recorded_scalars(tmp_path):
    class Board:
        def __init__(self):
            self.scalars = []

        def add_scalar(self, tag, value, step):
            self.scalars.append((tag, value, step))

    board = Board()
    torch.manual_seed(6)
    model = NanoGPT()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    entries = _train(model, Watch(model, tmp_path / "run.jsonl", every=2, optimizer=optimizer, tensorboard=board),
                     steps=3)
    tags = {(tag, step): value for tag, value, step in board.scalars}
    assert tags[("blocktrace/loss", 2)] == entries[1]["loss"]
    assert tags[("blocktrace/layer1/max_logit", 0)] == entries[0]["layers"][1]["max_logit"]
    assert tags[("blocktrace/lr", 0)] == pytest.approx(0.1)


def _entropy(weights):
    return (-(weights * torch.log(weights.clamp_min(1e-30))).sum(-1)).mean(dim=(0, 2)).tolist()


def _gpt2():
    from helpers import hf_block_values, make_gpt2

    model = make_gpt2(head=True)
    return model, lambda k, ids: hf_block_values(model.transformer, k, ids)


def _llama():
    from helpers import llama_reference, make_llama

    model, base = make_llama(head=True)
    return model, lambda k, ids: llama_reference(base, k, ids)


def _bert():
    from helpers import bert_reference, make_bert

    model, base = make_bert(head=True)
    return model, lambda k, ids: bert_reference(base, k, ids)


@pytest.mark.parametrize("family", [_gpt2, _llama, _bert], ids=["gpt2", "llama", "bert"])
def test_huggingface_models_are_watched_through_their_sdpa_attention(tmp_path, family):
    model, reference = family()
    ids = [5, 17, 99, 0, 42, 7, 63, 12, 3]
    expected = [reference(k, ids) for k in range(3)]  # eager: HF's own weights to compare with
    model.set_attn_implementation("sdpa")
    watch = Watch(model, tmp_path / "run.jsonl", every=10)
    output = model(torch.tensor([ids]), labels=torch.tensor([ids]))
    output.loss.backward()
    entry = watch.step()  # the loss is read off the model's output
    watch.close()
    assert entry["loss"] == pytest.approx(output.loss.item(), rel=1e-6)
    assert len(entry["layers"]) == 3
    for layer, values in zip(entry["layers"], expected):
        for name in ("norm1", "attn", "residual1", "norm2", "ffn", "residual2"):
            assert layer["steps"][name]["mean"] == pytest.approx(values[name].mean().item(), abs=1e-5), name
            assert layer["steps"][name]["std"] == pytest.approx(values[name].std(unbiased=False).item(), rel=1e-4)
        assert layer["entropy_per_head"] == pytest.approx(_entropy(values["attn_weights"]), rel=1e-4, abs=1e-6)
        assert layer["future_weight_sum"] == pytest.approx(
            values["attn_weights"][..., torch.ones(9, 9, dtype=torch.bool).triu(1)].sum().item(), abs=1e-4)
        assert layer["grad_norm"] > 0 and layer["max_logit"] is not None  # measured inside sdpa


def test_the_trainer_callback_records_trainers_own_steps(tmp_path):
    from helpers import make_gpt2
    from transformers import Trainer, TrainingArguments

    from blocktrace.integrations import WatchCallback

    model = make_gpt2(head=True).train()
    model.set_attn_implementation("sdpa")
    generator = torch.Generator().manual_seed(0)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 101, (12, 10), generator=generator)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=5, per_device_train_batch_size=2,
                             learning_rate=1e-3, logging_steps=1, report_to=[], use_cpu=True, save_strategy="no",
                             max_grad_norm=0.0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[WatchCallback(tmp_path / "run.jsonl",
                                                                                             every=2)])
    trainer.train()
    records = read_timeline(tmp_path / "run.jsonl")
    assert [r["step"] for r in records] == [0, 2, 4]
    logged = {entry["step"]: entry for entry in trainer.state.log_history if "loss" in entry}
    for entry in records:  # Trainer logs step k's loss once global_step has become k + 1
        assert entry["loss"] == pytest.approx(logged[entry["step"] + 1]["loss"], abs=1e-4)
        assert entry["lr"] == pytest.approx(logged[entry["step"] + 1]["learning_rate"], rel=1e-6)
        assert len(entry["layers"]) == 3 and all(layer["max_logit"] is not None for layer in entry["layers"])


def test_an_existing_timeline_is_continued_or_replaced_only_when_asked(tmp_path):
    path = tmp_path / "run.jsonl"
    model = NanoGPT()
    _train(model, Watch(model, path, every=2), steps=3)
    before = path.read_text()
    with pytest.raises(UsageError, match="already holds a timeline: pass append=True .* or overwrite=True"):
        Watch(model, path, every=2)
    assert path.read_text() == before  # refused: nothing written, nothing cut
    _train(model, Watch(model, path, every=2, start=4, append=True), steps=1)
    assert [r["step"] for r in read_timeline(path)] == [0, 2, 4]
    _train(model, Watch(model, path, every=2, overwrite=True), steps=1)
    assert [r["step"] for r in read_timeline(path)] == [0]
    with pytest.raises(UsageError, match="pass one"):
        Watch(model, path, append=True, overwrite=True)


def test_without_checks_a_record_holds_the_statistics_and_no_findings(tmp_path):
    torch.manual_seed(7)
    model = NanoGPT(causal=False)  # a leak the checks would flag
    entries = _train(model, Watch(model, tmp_path / "run.jsonl", every=2, checks=False, track_updates=False), steps=3)
    assert [e["flags"] for e in entries] == [[], []] and [e["diagnosis"] for e in entries] == [[], []]
    assert entries[0]["layers"][0]["future_weight_sum"] > 1.0  # still measured: statistics are not checks
    assert entries[1]["layers"][0]["weights"] is None


def test_an_adam_eps_that_is_zero_in_float16_is_an_error_before_the_first_update(tmp_path):
    """Pure float16 training with Adam's eps 1e-8 (0 in float16): the first update divides 0 by 0."""
    torch.manual_seed(8)
    model = NanoGPT().half()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert torch.tensor(1e-8, dtype=torch.float16).item() == 0.0  # the premise, independently
    watch = Watch(model, tmp_path / "run.jsonl", every=5, optimizer=optimizer)
    ids, targets = nano_batch(0)
    _, loss = model(ids, targets)
    loss.backward()
    entry = watch.step(loss)
    optimizer.step()
    watch.close()
    found = [f for f in entry["flags"] if f["name"] == "optimizer_eps_underflow"]
    assert found and found[0]["level"] == "error" and found[0]["detail"] == "eps 1e-08 is 0 in float16"
    assert entry["diagnosis"][0]["cause"] == "precision"
    assert any(not torch.isfinite(p).all() for p in model.parameters())  # and it does break: NaN after one step
    healthy = NanoGPT()  # float32: 1e-8 is representable, no finding
    optimizer = torch.optim.AdamW(healthy.parameters(), lr=1e-3)
    watch = Watch(healthy, tmp_path / "ok.jsonl", every=5, optimizer=optimizer)
    _, loss = healthy(ids, targets)
    loss.backward()
    assert "optimizer_eps_underflow" not in {f["name"] for f in watch.step(loss)["flags"]}
    watch.close()


def test_a_watch_used_as_a_context_leaves_nothing_attached(tmp_path):
    model = NanoGPT()
    original_sdpa = F.scaled_dot_product_attention
    with Watch(model, tmp_path / "run.jsonl", every=3) as watch:
        assert any(m._forward_hooks for m in model.modules())  # armed for step 0
    assert watch.writer.closed and F.scaled_dot_product_attention is original_sdpa
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())


def test_eager_attention_is_measured_from_its_weights_and_says_the_logit_is_not_visible(tmp_path):
    from helpers import hf_block_values, make_gpt2

    model = make_gpt2(head=True)  # eager attention: weights returned, scores never materialised outside
    ids = [5, 17, 99, 0, 42, 7]
    expected = hf_block_values(model.transformer, 1, ids)["attn_weights"]
    watch = Watch(model, tmp_path / "run.jsonl", every=5)
    model(torch.tensor([ids]), labels=torch.tensor([ids])).loss.backward()
    layer = watch.step()["layers"][1]
    watch.close()
    assert layer["entropy_per_head"] == pytest.approx(_entropy(expected), rel=1e-4)
    assert layer["max_logit"] is None
    assert any("largest attention logit not visible" in note for note in layer["notes"])


def test_tensorboard_given_a_directory_writes_events_or_names_the_missing_package(tmp_path):
    import importlib.util

    model = NanoGPT()
    if importlib.util.find_spec("tensorboard") is None:
        with pytest.raises(UsageError, match="tensorboard= needs the tensorboard package: pip install tensorboard"):
            Watch(model, tmp_path / "run.jsonl", tensorboard=tmp_path / "board")
        assert not (tmp_path / "run.jsonl").exists()  # refused before anything was written
    else:
        _train(model, Watch(model, tmp_path / "run.jsonl", every=1, tensorboard=tmp_path / "board"), steps=1)
        assert any(path.name.startswith("events.out.tfevents") for path in (tmp_path / "board").iterdir())


@pytest.mark.parametrize("family, expected", [
    ("gpt2", {"attn.c_attn.weight": "attn_qkv", "attn.c_proj.weight": "attn_o", "mlp.c_fc.weight": "ffn_w1",
              "mlp.c_proj.weight": "ffn_w2", "ln_1.weight": "norm", "ln_2.bias": "norm"}),
    ("llama", {"self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
               "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_o",
               "mlp.gate_proj.weight": "ffn_w1", "mlp.up_proj.weight": "ffn_w1", "mlp.down_proj.weight": "ffn_w2",
               "input_layernorm.weight": "norm", "post_attention_layernorm.weight": "norm"}),
    ("bert", {"attention.self.query.weight": "attn_q", "attention.self.key.weight": "attn_k",
              "attention.self.value.weight": "attn_v", "attention.output.dense.weight": "attn_o",
              "attention.output.LayerNorm.weight": "norm", "intermediate.dense.weight": "ffn_w1",
              "output.dense.weight": "ffn_w2", "output.LayerNorm.bias": "norm"}),
    ("gpt_neox", {"attention.query_key_value.weight": "attn_qkv", "attention.dense.weight": "attn_o",
                  "mlp.dense_h_to_4h.weight": "ffn_w1", "mlp.dense_4h_to_h.weight": "ffn_w2",
                  "input_layernorm.weight": "norm", "post_attention_layernorm.bias": "norm"}),
    ("phi3", {"self_attn.qkv_proj.weight": "attn_qkv", "self_attn.o_proj.weight": "attn_o",
              "mlp.gate_up_proj.weight": "ffn_w1", "mlp.down_proj.weight": "ffn_w2"}),
])
def test_tensor_kinds_name_the_same_roles_in_every_family(family, expected):
    """The kinds ‖ΔW‖/‖W‖ is reported by, on the parameter names of HF's own layers."""
    import transformers

    from blocktrace.diagnose.weights import tensor_kind

    config = transformers.AutoConfig.for_model(family, hidden_size=32, n_embd=32, num_attention_heads=4, n_head=4,
                                               intermediate_size=64, num_hidden_layers=1, n_layer=1, vocab_size=50,
                                               pad_token_id=0, eos_token_id=1, bos_token_id=1)
    model = transformers.AutoModel.from_config(config)
    layer = next(m for m in model.modules() if isinstance(m, torch.nn.ModuleList))[0]
    names = dict(layer.named_parameters())
    assert set(expected) <= set(names)  # the names are HF's own
    assert {name: tensor_kind(name) for name in expected} == expected
    assert all(tensor_kind(name) in {"attn_qkv", "attn_q", "attn_k", "attn_v", "attn_o", "ffn_w1", "ffn_w2", "norm"}
               for name in names)


def test_step_called_before_backward_warns_once(tmp_path):
    torch.manual_seed(2)
    model = NanoGPT().train()
    watch = Watch(model, tmp_path / "run.jsonl", every=1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with pytest.warns(RuntimeWarning, match="no gradients on parameters that require them") as caught:
        for step in range(3):
            ids, targets = nano_batch(step)
            _, loss = model(ids, targets)
            optimizer.zero_grad()
            watch.step(loss)  # too early: backward has not run
            loss.backward()
            optimizer.step()
    watch.close()
    assert sum("no gradients" in str(w.message) for w in caught) == 1
    records = read_timeline(tmp_path / "run.jsonl")
    assert all(layer["grad_norm"] is None for r in records for layer in r["layers"])


def test_step_called_after_backward_does_not_warn(tmp_path, recwarn):
    torch.manual_seed(2)
    model = NanoGPT().train()
    _train(model, Watch(model, tmp_path / "run.jsonl", every=1), steps=2)
    assert not [w for w in recwarn if "no gradients" in str(w.message)]


def test_a_second_watch_on_one_timeline_is_refused_and_the_first_keeps_writing(tmp_path):
    path = tmp_path / "run.jsonl"
    model = NanoGPT()
    first = Watch(model, path, every=1)
    with pytest.raises(UsageError, match="being written by another Watch"):
        Watch(model, path, every=1, overwrite=True)
    _train(model, first, steps=3)
    assert [r["step"] for r in read_timeline(path)] == [0, 1, 2]  # all of the first's records, none lost
    _train(model, Watch(model, path, every=1, start=3, append=True), steps=1)  # closed: the lock is gone
    assert [r["step"] for r in read_timeline(path)] == [0, 1, 2, 3]


def test_a_watch_never_follows_a_symlink_nor_blocks_on_a_fifo(tmp_path):
    import os
    import threading

    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    (tmp_path / "link.jsonl").symlink_to(target)
    model = NanoGPT()
    with pytest.raises(BlocktraceError, match="symbolic link"):
        Watch(model, tmp_path / "link.jsonl", every=1, overwrite=True)
    assert target.read_text() == "keep me\n"
    os.mkfifo(tmp_path / "pipe.jsonl")
    outcome = []

    def attempt():
        try:
            Watch(model, tmp_path / "pipe.jsonl", every=1)
        except BlocktraceError as error:
            outcome.append(str(error))

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout=20)
    assert outcome and "FIFO" in outcome[0]


@pytest.mark.parametrize("close_first_opened_first", [True, False])
def test_two_watches_restore_attention_whatever_order_they_close_in(tmp_path, close_first_opened_first):
    original = F.scaled_dot_product_attention
    model = NanoGPT()
    first, second = Watch(model, tmp_path / "a.jsonl", every=1), Watch(model, tmp_path / "b.jsonl", every=1)
    assert F.scaled_dot_product_attention is not original  # measured while they are armed
    for watch in ([first, second] if close_first_opened_first else [second, first]):
        watch.close()
    assert F.scaled_dot_product_attention is original


@pytest.mark.parametrize("arguments, named", [
    (lambda m, p: Watch("model", p), "torch.nn.Module"),
    (lambda m, p: Watch(m, 5), "path must be"),
    (lambda m, p: Watch(m, p, every=True), "every must be"),
    (lambda m, p: Watch(m, p, blocks=3), "blocks must be"),
    (lambda m, p: Watch(m, p, blocks=["transformer.h"]), "blocks must be"),
    (lambda m, p: Watch(m, p, blocks=[]), "blocks must be"),
    (lambda m, p: Watch(m, p, optimizer="adam"), "optimizer must be"),
    (lambda m, p: Watch(m, p, tensorboard=3), "tensorboard must be"),
    (lambda m, p: Watch(m, p, checks="no"), "checks must be True or False"),
    (lambda m, p: Watch(m, p, start="3"), "start must be"),
])
def test_a_watch_given_wrong_types_says_which_argument(tmp_path, arguments, named):
    with pytest.raises(UsageError, match=named):
        arguments(NanoGPT(), tmp_path / "run.jsonl")
    assert not (tmp_path / "run.jsonl").exists()


@pytest.mark.parametrize("loss, lr", [("abc", None), ([1.0], None), (torch.ones(3, dtype=torch.long), None),
                                      (None, "x"), (None, [1])])
def test_watch_step_given_wrong_types_warns_naming_the_argument_and_training_goes_on(tmp_path, loss, lr):
    """Issue 45.4: after construction nothing the Watch does raises into the loop — an unusable argument of step()
    is said once and taken as not given, and recording goes on."""
    model = NanoGPT()
    with Watch(model, tmp_path / "run.jsonl", every=1) as watch:
        for step in range(2):
            ids, targets = nano_batch(step)
            model(ids, targets)[1].backward()
            with pytest.warns(RuntimeWarning, match="loss must be" if lr is None else "lr must be") if step == 0 \
                    else warnings.catch_warnings():
                assert watch.step(loss, lr=lr) is not None
    assert watch.stopped == "closed" and len(read_timeline(tmp_path / "run.jsonl")) == 2  # closed, never stopped


def test_watch_step_takes_numpy_numbers_and_a_per_device_loss_vector_as_its_mean(tmp_path):
    import numpy as np

    model = NanoGPT()
    with Watch(model, tmp_path / "run.jsonl", every=1) as watch:
        ids, targets = nano_batch(0)
        model(ids, targets)[1].backward()
        assert watch.step(np.float32(2.5), lr=np.float64(1e-3))["loss"] == 2.5
        model(ids, targets)[1].backward()
        with pytest.warns(RuntimeWarning, match=r"loss of shape \[2\] recorded as its mean"):
            assert watch.step(torch.tensor([1.0, 3.0]))["loss"] == pytest.approx(2.0)


class ListIds(torch.nn.Module):
    """A model that converts the ids it is given itself (a Python list)."""

    def __init__(self):
        super().__init__()
        self.inner = NanoGPT()

    def forward(self, input_ids, targets):
        return self.inner(torch.tensor(input_ids), targets)


def test_a_forward_given_ids_as_a_python_list_is_recorded_without_raising(tmp_path):
    model = ListIds()
    with Watch(model, tmp_path / "run.jsonl", every=1, blocks="inner.h") as watch:
        ids, targets = nano_batch(0)
        _, loss = model(input_ids=ids.tolist(), targets=targets)
        loss.backward()
        assert watch.step(loss) is not None and watch.stopped is None


def _steps_every(tmp_path, every_batches: int, steps: int = 16) -> list[dict]:
    """A loop whose optimizer.step() runs once every `every_batches` batches, zero_grad() after every batch."""
    model = NanoGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    watch = Watch(model, tmp_path / f"every{every_batches}.jsonl", every=5, optimizer=optimizer)
    entries = []
    for step in range(steps):
        ids, targets = nano_batch(step)
        _, loss = model(ids, targets)
        loss.backward()
        entry = watch.step(loss)
        if entry is not None:
            entries.append(entry)
        if (step + 1) % every_batches == 0:
            optimizer.step()
        optimizer.zero_grad()
    watch.close()
    return entries


def test_the_watch_counts_the_optimizers_steps_between_records(tmp_path):
    """Each record's loop.optimizer_steps: the optimizer.step() calls since the record before — each of them in a
    plain loop; none where step() sits outside the batch loop (blind2's F04), and no_update then blames the loop."""
    plain = _steps_every(tmp_path, 1)
    assert [e["loop"]["optimizer_steps"] for e in plain[1:]] == [5, 5, 5]
    assert not [f for e in plain for f in e["flags"] if f["name"] == "no_update"]
    broken = _steps_every(tmp_path, 16)
    assert [e["loop"]["optimizer_steps"] for e in broken[1:]] == [0, 0, 0]
    flagged = [f for f in broken[1]["flags"] if f["name"] == "no_update"]
    assert flagged and flagged[0]["cause"] == "training_loop"


def _guarded(tmp_path, guard: str, steps: int = 31) -> list[dict]:
    """A loop with a loss-spike guard that skips a step's optimizer.step() (seen in the tenth blind group, F04,
    calibration now): against 2× the running mean of the past losses (a spike guard, which hardly ever skips), or
    against the best loss so far (F04's bug: most steps are skipped once the loss stops improving every step);
    or none, with the gradients accumulated over 4 watch.step() calls before each optimizer step."""
    torch.manual_seed(0)
    model = NanoGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    past: list[float] = []
    with Watch(model, tmp_path / f"{guard}.jsonl", every=5, optimizer=optimizer, overwrite=True) as watch:
        for step in range(steps):
            _, loss = model(*nano_batch(step % 3))
            loss.backward()
            watch.step(loss)
            value = loss.item()
            skip = {"spike": bool(past) and value > 2 * sum(past) / len(past),
                    "best": bool(past) and value > min(past) and step > 4,
                    "accumulate": step % 4 != 3}[guard]
            past.append(value)
            if not skip:
                optimizer.step()
            if guard != "accumulate" or not skip:
                optimizer.zero_grad()
    return read_timeline(tmp_path / f"{guard}.jsonl")


@pytest.mark.parametrize("guard, warned", [("spike", False), ("best", True), ("accumulate", False)])
def test_a_loop_that_stops_stepping_its_optimizer_is_said(tmp_path, guard, warned):
    """The optimizer stepped at every watch.step() in the first interval and at fewer than half of them later: the
    loop has started skipping updates (a guard that compares with the best loss, a loss scale that overflows at
    every step). Accumulation that steps once every few calls from the start is the loop's rhythm, not a change."""
    records = _guarded(tmp_path, guard)
    said = [f for r in records for f in r["flags"] if f["name"] == "optimizer_steps_skipped"]
    assert bool(said) == warned
    if warned:
        assert {f["level"] for f in said} == {"warning"} and said[0]["cause"] == "training_loop"


def test_norms_initialised_far_from_gain_one_are_found_at_the_first_record(tmp_path):
    """blind2's F05 in a Watch: every norm gain drawn from N(0, 0.02) is an initialisation error at step 0; the
    same model initialised as it should be raises nothing of the kind."""
    def first_record(broken: bool) -> dict:
        model = NanoGPT()
        if broken:
            with torch.no_grad():
                for module in model.modules():
                    if isinstance(module, torch.nn.LayerNorm):
                        module.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(0))
        return _train(model, Watch(model, tmp_path / f"{broken}.jsonl", every=5), 1)[0]

    broken, healthy = first_record(True), first_record(False)
    assert all(0.005 < gain < 0.05 for layer in broken["layers"] for gain in layer["norm_gains"].values())
    found = [f for f in broken["flags"] if f["name"] == "norm_gains_not_one"]
    assert found and found[0]["cause"] == "initialisation" and found[0]["level"] == "error"
    assert all(0.9 < gain < 1.1 for layer in healthy["layers"] for gain in layer["norm_gains"].values())
    assert not [f for f in healthy["flags"] if f["name"].startswith("norm_")]
