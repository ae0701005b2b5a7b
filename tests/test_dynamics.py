"""Training judged over time (diagnose/dynamics.py): hand-built records whose verdict follows from the definitions,
and real training loops with the bug each check names — the Watch and `track` reaching the same cause."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner
from helpers import NanoGPT, nano_batch, watched_records

from blocktrace import Watch
from blocktrace.cli import cli
from blocktrace.diagnose.dynamics import judge
from blocktrace.diagnose.weights import tensor_kind
from blocktrace.training.timeline import read_timeline


def _layer(index, ratio=None, norm=1.0, grad=0.5, trainable=None, kinds=("attn_qkv", "ffn_w1"), elements=None):
    counted = {} if elements is None else {"elements": elements}
    entry = {"layer": index, "grad_norm": grad,
             "weights": {kind: {"norm": norm, "update_ratio": ratio, **counted} for kind in kinds}}
    if trainable is not None:
        entry["trainable"] = trainable
    return entry


def _record(step, layers, loss=None, lr=None, source="checkpoint", **extra):
    return {"step": step, "source": source, "loss": loss, "lr": lr, "layers": layers, "flags": [], **extra}


def _names(flags):
    return sorted((f.name, f.layer) for f in flags)


def _moving(step, ratios, lr=1e-3, **kwargs):
    """A record whose layer k moved ratios[k] of its norm since the record before."""
    return _record(step, [_layer(k, r, **kwargs) for k, r in enumerate(ratios)], lr=lr)


# --- gradients and movement ---------------------------------------------------------------------------------------

def test_a_trainable_layer_without_a_gradient_is_cut_from_the_loss():
    layers = [_layer(0, grad=0.5, trainable=True), _layer(1, grad=None, trainable=True),
              _layer(2, grad=0.0, trainable=True), _layer(3, grad=None, trainable=False)]
    flags = judge([], _record(10, layers, source="watch"))
    assert _names(flags) == [("no_gradient", 1), ("no_gradient", 2)]  # layer 3 is frozen on purpose
    assert {f.cause.value for f in flags} == {"gradient_flow"}


def test_no_gradient_anywhere_is_left_to_the_watchs_warning():
    layers = [_layer(0, grad=None, trainable=True), _layer(1, grad=None, trainable=True)]
    assert judge([], _record(10, layers, source="watch")) == []


def test_a_layer_that_stands_still_while_the_others_move_is_frozen():
    flags = judge([_moving(0, [None] * 3)], _moving(10, [0.02, 0.0, 0.03], trainable=True))
    assert _names(flags) == [("layer_frozen", 1)]
    assert flags[0].level.value == "error" and flags[0].cause.value == "gradient_flow"


def test_between_checkpoints_a_still_layer_is_information_since_they_cannot_say_whether_it_is_frozen_on_purpose():
    """A fine-tune with layers frozen on purpose (the failure benchmark's llama-frozen-finetune-healthy) and a layer
    cut off from the loss leave the same checkpoints; only a Watch sees requires_grad."""
    flags = judge([_moving(0, [None] * 3)], _moving(10, [0.02, 0.0, 0.03]))
    assert [(f.name, f.layer, f.level.value) for f in flags] == [("layer_frozen", 1, "info")]
    assert "checkpoints cannot tell" in flags[0].detail


def test_blocks_frozen_on_purpose_standing_still_are_no_update_fault():
    """Issue 45.5: a fine-tune that trains only the embeddings or the head leaves every block still on purpose."""
    assert judge([_moving(0, [None] * 2, trainable=False)], _moving(10, [0.0, 0.0], trainable=False)) == []
    flags = judge([_moving(0, [None] * 2, trainable=True)], _moving(10, [0.0, 0.0], trainable=True))
    assert _names(flags) == [("no_update", None)]  # trainable and still: the optimizer


def test_a_step_a_loss_scaler_skipped_on_non_finite_gradients_is_no_update_fault():
    """Issue 45.5: a GradScaler skips optimizer.step() when the gradients overflowed; the record before that step
    holds their norm, inf or NaN."""
    for norm in (float("inf"), float("nan")):
        before = {**_moving(0, [None] * 2), "grad_norm": norm}
        assert judge([before], _moving(1, [0.0, 0.0])) == []
    flags = judge([{**_moving(0, [None] * 2), "grad_norm": 0.7}], _moving(1, [0.0, 0.0]))
    assert _names(flags) == [("no_update", None)]  # finite gradients and no step: the optimizer


def test_a_layer_frozen_on_purpose_is_only_information():
    flags = judge([_moving(0, [None] * 2)], _moving(10, [0.0, 0.03], trainable=False))
    assert [(f.name, f.level.value) for f in flags] == [("layer_frozen", "info")]


def test_nothing_moving_at_all_is_the_optimizer_not_stepping():
    flags = judge([_moving(0, [None] * 2)], _moving(10, [0.0, 0.0]))
    assert _names(flags) == [("no_update", None)] and flags[0].cause.value == "optimizer"
    assert judge([_moving(0, [None] * 2, lr=0.0)], _moving(10, [0.0, 0.0], lr=0.0)) == []  # lr 0: a choice


def test_nothing_moving_because_step_was_never_called_is_the_loop():
    """blind2's F04: optimizer.step() dedented out of the batch loop. The Watch counts the optimizer's steps between
    records: none at all is the loop's fault, not the optimizer's; steps that moved nothing stay the optimizer's."""
    flags = judge([_moving(0, [None] * 2)], {**_moving(10, [0.0, 0.0]), "loop": {"optimizer_steps": 0}})
    assert _names(flags) == [("no_update", None)] and flags[0].cause.value == "training_loop"
    assert "optimizer.step() was not called between them" in flags[0].detail
    stepped = judge([_moving(0, [None] * 2)], {**_moving(10, [0.0, 0.0]), "loop": {"optimizer_steps": 10}})
    assert _names(stepped) == [("no_update", None)] and stepped[0].cause.value == "optimizer"


def test_nothing_moving_at_a_learning_rate_the_schedule_took_to_nothing_is_the_learning_rate():
    """blind15's F03: a warm-up that multiplies the current lr by (k + 1)/20 compounds it to 2e-11 of a 1e-3 peak;
    nothing moves and the optimizer is blameless. A step of lr·u moves a weight by a few lr at most, so a rate far
    below any the run held (or below TINY_LR) explains the stillness by itself; at the run's own rate it does not."""
    history = [_moving(0, [None] * 2, lr=1e-3), _moving(10, [0.01, 0.02], lr=1e-3), _moving(20, [0.0, 0.0], lr=2e-11)]
    shrunk = judge(history, _moving(30, [0.0, 0.0], lr=2e-11))
    assert _names(shrunk) == [("no_update", None)] and shrunk[0].cause.value == "learning_rate"
    assert "at learning rate 2e-11" in shrunk[0].detail
    tiny = judge([_moving(0, [None] * 2, lr=1e-8)], _moving(10, [0.0, 0.0], lr=1e-8))
    assert _names(tiny) == [("no_update", None)] and tiny[0].cause.value == "learning_rate"
    steady = judge(history[:2], _moving(20, [0.0, 0.0], lr=1e-3))
    assert _names(steady) == [("no_update", None)] and steady[0].cause.value == "optimizer"


def test_tiny_updates_blame_the_learning_rate_only_when_it_is_tiny():
    at_normal_lr = judge([_moving(0, [None] * 2)], _moving(10, [1e-5, 2e-5]))  # 1e-6 per step
    assert _names(at_normal_lr) == [("updates_tiny", None)] and at_normal_lr[0].cause.value == "optimizer"
    at_tiny_lr = judge([_moving(0, [None] * 2, lr=1e-8)], _moving(10, [1e-5, 2e-5], lr=1e-8))
    assert at_tiny_lr[0].cause.value == "learning_rate"
    assert judge([_moving(0, [None] * 2)], _moving(10, [0.01, 0.02])) == []


def test_tiny_updates_after_the_schedule_cut_the_learning_rate_a_hundredfold_blame_the_learning_rate():
    """Seen in the fifth blind group (F05, calibration now): a ReduceLROnPlateau built with mode="max" on a loss cut
    the rate tenfold every third check, and the tiny updates that followed were called the optimizer's. A rate at
    1/100 of the largest the run recorded is the schedule's doing, whatever its absolute value."""
    history = [_moving(0, [None] * 2, lr=1e-3), _moving(10, [0.01, 0.02], lr=5e-6)]
    cut = judge(history, _moving(20, [1e-5, 2e-5], lr=5e-6))
    assert _names(cut) == [("updates_tiny", None)] and cut[0].cause.value == "learning_rate"
    history = [_moving(0, [None] * 2, lr=1e-3), _moving(10, [0.01, 0.02], lr=5e-5)]
    decayed = judge(history, _moving(20, [1e-5, 2e-5], lr=5e-5))  # 1/20 of the peak: the optimizer's still
    assert _names(decayed) == [("updates_tiny", None)] and decayed[0].cause.value == "optimizer"


def test_tiny_updates_are_judged_on_the_layers_that_train():
    """A fine-tune that trains its top block alone (the others requires_grad False, their update 0) moves the median
    matrix of all layers by nothing: the trained layer's own updates are what the optimizer makes, and they are
    healthy. failures2's frozen-blocks run was called updates_tiny (optimizer) this way. The still layers are
    layer_frozen's, against the median of the layers that move: information, since neither a Watch (requires_grad
    False) nor checkpoints can tell a mistake from a fine-tune's choice."""
    frozen, trained = dict(trainable=False), dict(trainable=True)
    before = _record(0, [_layer(0, None, **trained), *(_layer(k, None, **frozen) for k in (1, 2, 3))], lr=1e-3)
    after = _record(10, [_layer(0, 0.02, **trained), *(_layer(k, 0.0, **frozen) for k in (1, 2, 3))], lr=1e-3)
    assert [(f.name, f.layer, f.level.value) for f in judge([before], after)] == [
        ("layer_frozen", k, "info") for k in (1, 2, 3)]
    between_checkpoints = judge([_moving(0, [None] * 4)], _moving(10, [0.02, 0.0, 0.0, 0.0]))
    assert [(f.name, f.level.value) for f in between_checkpoints] == [("layer_frozen", "info")] * 3
    tiny = _record(10, [_layer(0, 1e-5, **trained), *(_layer(k, 0.0, **frozen) for k in (1, 2, 3))], lr=1e-3)
    assert ("updates_tiny", None) in _names(judge([before], tiny))  # the layer that trains barely moves: still said


def test_most_layers_cut_off_from_the_loss_are_found_against_the_layers_that_move():
    """In a Watch, layers that require a gradient and do not move while one does are cut off (an error), however many
    they are: the median of all layers would be 0 with three of four still, and nothing would stand out."""
    flags = judge([_moving(0, [None] * 4)], _moving(10, [0.0, 0.0, 0.0, 0.02], trainable=True))
    assert [(f.name, f.layer, f.level.value, f.cause.value) for f in flags] == [
        ("layer_frozen", k, "error", "gradient_flow") for k in (0, 1, 2)]


def test_under_adam_updates_are_judged_per_unit_of_learning_rate():
    """Adam moves each weight by about lr·|m̂/√v̂|: 1e-4 of the norm per step at lr 1e-3 is tiny under Adam (a huge
    eps), not under SGD, whose step is lr times a gradient of any size."""
    def moved(optimizer):
        return judge([_moving(0, [None] * 2)], {**_moving(10, [1e-3, 1e-3]), "optimizer": optimizer})
    assert _names(moved("AdamW")) == [("updates_tiny", None)] and moved("AdamW")[0].cause.value == "optimizer"
    assert moved("SGD") == [] and moved(None) == []


def test_under_adam_a_tiny_update_is_judged_by_the_step_each_weight_takes_whatever_the_weights_size():
    """Adam moves each weight by about lr·|m̂/√v̂|, |m̂/√v̂| ≈ 0.1–1, whatever the weight's size: weights grown 20×
    (a learning rate too high) move 20× less of their norm at the same healthy step — not updates_tiny (issue 44's
    lr-too-high run). rms(ΔW) = ratio × ‖W‖ / √n: at ‖W‖ 1 over 2,500 elements (std 0.02) a per-step ratio of 1e-4
    is rms(ΔW) 2e-6 = 0.002 × lr, tiny; at ‖W‖ 20 it is 4e-5 = 0.04 × lr, an Adam step."""
    def moved(norm):
        before = _record(0, [_layer(k, None, norm=norm, elements=2500) for k in range(2)], lr=1e-3)
        after = _record(10, [_layer(k, 1e-3, norm=norm, elements=2500) for k in range(2)], lr=1e-3,
                        optimizer="AdamW")
        return judge([before], after)
    assert _names(moved(1.0)) == [("updates_tiny", None)]
    assert moved(20.0) == []


def test_a_watchs_records_count_each_kinds_elements(tmp_path):
    weights = watched_records(tmp_path / "run.jsonl")[-1]["layers"][0]["weights"]
    expected: dict = {}
    for name, parameter in NanoGPT().h[0].named_parameters():
        expected[tensor_kind(name)] = expected.get(tensor_kind(name), 0) + parameter.numel()
    assert {kind: w["elements"] for kind, w in weights.items()} == expected


def test_an_update_ten_times_its_usual_size_per_unit_of_learning_rate_is_a_spike():
    history = [_moving(10 * k, [0.01, 0.01]) for k in range(5)]
    assert judge(history, _moving(50, [0.015, 0.015])) == []
    assert _names(judge(history, _moving(50, [0.2, 0.2]))) == [("update_spike", None)]
    # twice the learning rate, twice the update: no spike
    assert judge(history, _moving(50, [0.02, 0.02], lr=2e-3)) == []


def test_updates_that_grow_steadily_are_not_a_spike():
    """Seen in the ninth blind group (H4, calibration now): Prodigy (Mishchenko & Defazio 2023) estimates its own step
    size d, growing ~3× per record from 1e-6 while the group's lr stays 1.0 — per unit of lr its updates grew steadily
    (2e-4, 7e-4, 7.5e-3, 2.6e-2, …) and each was called a spike against the lagging median. A spike is one interval
    far above the one just before it."""
    growing = [_moving(10 * k, [2e-4 * 3 ** k] * 2) for k in range(5)]
    assert judge(growing, _moving(50, [2e-4 * 3 ** 5] * 2)) == []
    assert _names(judge(growing, _moving(50, [2e-4 * 3 ** 4 * 30] * 2))) == [("update_spike", None)]


def test_a_learning_rate_ten_times_any_before_is_a_jump_but_warm_up_is_not():
    history = [_moving(10 * k, [0.01, 0.01], lr=1e-3) for k in range(3)]
    flags = judge(history, _moving(30, [0.01, 0.01], lr=0.086))
    assert ("lr_jump", None) in _names(flags) and flags[0].cause.value == "learning_rate"
    warmup = [_moving(0, [None] * 2, lr=0.0), _moving(10, [0.01, 0.01], lr=2e-4)]
    assert judge(warmup, _moving(20, [0.01, 0.01], lr=4e-4)) == []


def test_zeroed_weights_and_collapsing_norms():
    first = _moving(0, [None] * 3, norm=2.0)
    before = _moving(10, [0.01] * 3, norm=2.0)
    zeroed = _record(20, [_layer(0, 1.0, norm=0.0), _layer(1, 0.01, norm=2.0), _layer(2, 0.01, norm=2.0)], lr=1e-3)
    assert _names(judge([first, before], zeroed)) == [("weights_zeroed", 0)]
    gradually = _record(10, [_layer(0, 0.01, norm=0.5), _layer(1, 0.01, norm=2.0), _layer(2, 0.01, norm=2.0)])
    shrunk = _record(20, [_layer(0, 0.01, norm=0.4), _layer(1, 0.01, norm=1.9), _layer(2, 0.01, norm=2.0)],
                     lr=1e-3)  # layer 0: 0.2× its first norm, 0.8× the record before's
    flags = judge([first, gradually], shrunk)
    assert _names(flags) == [("weight_norm_collapse", 0)] and flags[0].cause.value == "optimizer"


# --- the loss and the data ----------------------------------------------------------------------------------------

def test_the_loss_against_uniform_guessing():
    vocab = 100  # log V = 4.605
    assert _names(judge([], _record(10, [], loss=5.2, vocab=vocab))) == [("loss_above_uniform", None)]
    assert _names(judge([], _record(150, [], loss=4.6, vocab=vocab))) == [("loss_stuck", None)]
    assert judge([], _record(50, [], loss=4.6, vocab=vocab)) == []  # too early to say
    assert judge([], _record(150, [], loss=4.4, vocab=vocab)) == []


def test_a_loss_near_zero_is_a_leak():
    flags = judge([], _record(20, [], loss=0.01))
    assert _names(flags) == [("loss_near_zero", None)] and flags[0].cause.value == "data"
    assert judge([], _record(0, [], loss=0.01)) == []  # step 0 says nothing of training


def test_a_negative_loss_is_no_cross_entropy():
    """blind2's F02: F.nll_loss given logits — the loss fell below zero and was called a leak (data). A cross-entropy
    is −log p ≥ 0: below zero the loss function is wrong, from step 0 on."""
    for step in (0, 20):
        flags = judge([], _record(step, [], loss=-0.13, vocab=256))
        assert _names(flags) == [("loss_negative", None)] and flags[0].cause.value == "loss_function"
        assert flags[0].level.value == "error"
    assert judge([], _record(20, [], loss=0.3, vocab=256)) == []  # low but a cross-entropy can be that
    unknown = judge([], _record(20, [], loss=-0.5))  # no vocabulary: an objective of another kind may be negative
    assert _names(unknown) == [("loss_negative", None)] and unknown[0].level.value == "warning"


def _gains(step, gains, loss, width=128, vocab=256):
    """A record whose every layer's norms have these effective gains (rms), its loss and width."""
    layers = [{"layer": k, "steps": {"x": {"mean": 0.0}}, "norm_gains": {"norm1": g, "norm2": g}, "width": width}
              for k, g in enumerate(gains)]
    return _record(step, layers, loss=loss, vocab=vocab, width=width)


def test_norms_a_fresh_model_starts_with_far_from_gain_one_are_its_initialisation():
    """blind2's F05: RMSNorm gains drawn from N(0, 0.02). Every norm initialises its gain to 1; a model whose loss
    is still uniform guessing (a fresh one) with every norm's gain far from it was initialised wrong."""
    fresh = judge([], _gains(0, [0.02, 0.019, 0.021], loss=math.log(256)))
    assert _names(fresh) == [("norm_gains_not_one", None)] and fresh[0].cause.value == "initialisation"
    assert fresh[0].level.value == "error"
    assert judge([], _gains(0, [0.02, 0.019, 0.021], loss=2.1)) == []  # a pretrained model fine-tuned: learned
    assert judge([], _gains(0, [0.02, 1.0, 0.021], loss=math.log(256))) == []  # not every norm
    assert judge([], _gains(0, [1.0, 0.98, 1.02], loss=math.log(256))) == []  # gains at 1
    later = [_gains(0, [1.0] * 3, loss=math.log(256))]
    assert "norm_gains_not_one" not in {f.name for f in judge(later, _gains(10, [0.02] * 3, loss=math.log(256)))}


def test_norms_that_scale_by_one_over_root_d_divide_by_the_l2_norm():
    """blind2's F08: RMSNorm written as F.normalize(x) · g, without × √d: every norm's output has rms 1/√d."""
    flags = judge([], _gains(0, [0.0884, 0.0884, 0.0884], loss=math.log(256), width=128))
    assert _names(flags) == [("norm_is_l2", None)] and flags[0].cause.value == "norm"
    later = judge([_gains(0, [1.0] * 3, loss=3.0)], _gains(50, [0.0884] * 3, loss=3.0, width=128))
    assert _names(later) == [("norm_is_l2", None)]  # at any step: no learned gain lands on 1/√d in every norm
    assert judge([], _gains(0, [0.0884, 0.05, 0.0884], loss=2.0, width=128)) == []


def test_a_loss_spike_is_six_sigmas_above_the_recent_records():
    history = [_record(10 * k, [], loss=2.0 + 0.01 * (k % 3)) for k in range(10)]
    assert _names(judge(history, _record(100, [], loss=3.0))) == [("loss_spike", None)]
    assert judge(history, _record(100, [], loss=2.05)) == []
    assert judge(history[:5], _record(50, [], loss=3.0)) == []  # fewer than 8 records: no spread to judge by


def test_the_batch_a_watch_saw():
    flags = judge([], _record(10, [], source="watch", data={"repeated": True, "labels_are_inputs": True}))
    assert [(f.name, f.level.value) for f in flags] == [("repeated_batch", "error"), ("labels_are_inputs", "info")]
    assert {f.cause.value for f in flags} == {"data"}


def test_targets_equal_to_the_inputs_are_an_error_once_the_loss_shows_the_copy():
    """Unshifted targets are right for a model that shifts inside, a leak for one that does not: the loss tells
    them apart (a copying model falls far below what language allows, one that shifts stays above)."""
    leak = {"repeated": False, "labels_are_inputs": True}
    copying = judge([], _record(200, [], source="watch", loss=0.3, data=leak))
    assert [(f.name, f.level.value, f.cause.value) for f in copying] == [("labels_are_inputs", "error", "data")]
    shifting = judge([], _record(200, [], source="watch", loss=2.5, data=leak))
    assert [(f.name, f.level.value) for f in shifting] == [("labels_are_inputs", "info")]
    fine = judge([], _record(200, [], source="watch", loss=0.3, data={"repeated": False, "labels_are_inputs": False}))
    assert fine == []


def test_findings_a_record_holds_already_are_not_repeated():
    entry = _record(20, [], loss=0.01, flags=[])
    entry["flags"] = [{"name": "loss_near_zero", "layer": None}]
    assert judge([], entry) == []


# --- real training loops ------------------------------------------------------------------------------------------

def _nanogpt(seed=5):
    torch.manual_seed(seed)
    model = NanoGPT()
    with torch.no_grad():
        model.wte.weight.normal_(0.0, 0.02)  # nanoGPT's init (PyTorch's N(0, 1) tied head is worse than uniform)
    return model


def _train(model, watch, steps, lr=3e-3, batch=nano_batch, targets_of=None, lr_at=None):
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(steps):
        ids, targets = batch(step)
        if targets_of is not None:
            targets = targets_of(ids, targets)
        if lr_at is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
        _, loss = model(ids, targets)
        optimizer.zero_grad()
        loss.backward()
        watch.step(loss, lr=optimizer.param_groups[0]["lr"])
        optimizer.step()
    watch.close()


def _top(entry):
    return entry["diagnosis"][0]["cause"] if entry["diagnosis"] else None


def test_a_gradient_cut_inside_the_residual_stream_is_gradient_flow_not_the_learning_rate(tmp_path):
    model = _nanogpt()
    model.h[1].register_forward_pre_hook(lambda module, args: (args[0].detach(),))  # the bug: block 0 cut off
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=11)
    records = read_timeline(tmp_path / "run.jsonl")
    flags = [(f["name"], f["layer"]) for f in records[0]["flags"] if f["level"] == "error"]
    assert ("no_gradient", 0) in flags
    assert all(_top(entry) == "gradient_flow" for entry in records)
    assert "detach" in records[0]["diagnosis"][0]["advice"]


def test_targets_equal_to_the_inputs_in_a_hand_written_model(tmp_path):
    """The helpers' NanoGPT does not shift its targets: given its inputs as targets it would learn to copy each
    token. The Watch says so as context (info); the verdict is loss_near_zero's, when the loss falls."""
    model = _nanogpt()
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=6, targets_of=lambda ids, targets: ids)
    records = read_timeline(tmp_path / "run.jsonl")
    assert records[0]["data"]["repeated"] is False and records[0]["data"]["labels_are_inputs"] is True
    assert [(f["name"], f["level"], f["cause"]) for f in records[0]["flags"] if f["name"] == "labels_are_inputs"] == \
        [("labels_are_inputs", "info", "data")]


def test_a_hugging_face_model_given_labels_equal_to_its_inputs_is_right(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_embd=16, n_head=2, n_layer=2, n_positions=32, vocab_size=61))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, tmp_path / "run.jsonl", every=1) as watch:
        for step in range(2):
            ids, _ = nano_batch(step)
            model(ids, labels=ids).loss.backward()
            watch.step()
            optimizer.step()
            optimizer.zero_grad()
    records = read_timeline(tmp_path / "run.jsonl")
    assert [(r["data"]["repeated"], r["data"]["labels_are_inputs"]) for r in records] == [(False, False)] * 2
    assert records[0]["vocab"] == 61


def test_the_same_batch_again(tmp_path):
    model = _nanogpt()
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=6, batch=lambda step: nano_batch(0))
    records = read_timeline(tmp_path / "run.jsonl")
    assert [r["data"]["repeated"] for r in records] == [False, True]
    assert ("repeated_batch", None) in [(f["name"], f["layer"]) for f in records[1]["flags"]]


def test_a_batch_refilled_in_place_is_not_the_same_batch_again(tmp_path):
    buffer = nano_batch(0)[0].clone()

    def refilled(step):
        ids, targets = nano_batch(step)
        buffer.copy_(ids)  # one preallocated tensor, new contents each step
        return buffer, targets
    model = _nanogpt()
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=6, batch=refilled)
    assert [r["data"]["repeated"] for r in read_timeline(tmp_path / "run.jsonl")] == [False, False]


def test_a_learning_rate_that_jumps_for_one_step(tmp_path):
    model = _nanogpt()
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=21, lr_at=lambda step: 0.3 if step == 20 else 3e-3)
    records = read_timeline(tmp_path / "run.jsonl")
    assert [f["name"] for f in records[-1]["flags"] if f["level"] == "error"] == ["lr_jump"]
    assert all(f["level"] == "info" for r in records[:-1] for f in r["flags"])


def test_the_watch_judges_the_loss_against_its_vocabulary(tmp_path):
    torch.manual_seed(5)
    model = NanoGPT()  # PyTorch's N(0, 1) embedding as the head: loss far above log V at step 0
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=1)
    entry = read_timeline(tmp_path / "run.jsonl")[0]
    assert entry["vocab"] == 61 and entry["loss"] > math.log(61) + 0.5
    assert [(f["name"], f["cause"]) for f in entry["flags"] if f["level"] == "error"] == \
        [("loss_above_uniform", "initialisation")]


def test_track_judges_a_timeline_written_without_the_dynamics(tmp_path):
    """An older Watch's timeline (no dynamics findings): track raises them itself, with one diagnosis."""
    model = _nanogpt()
    model.h[1].register_forward_pre_hook(lambda module, args: (args[0].detach(),))
    _train(model, Watch(model, tmp_path / "run.jsonl", every=5), steps=11)
    lines = []
    for entry in read_timeline(tmp_path / "run.jsonl"):
        entry.update(flags=[], diagnosis=[])
        lines.append(json.dumps(entry))
    (tmp_path / "old.jsonl").write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(cli, ["track", str(tmp_path / "old.jsonl"), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert report["first_sign"]["name"] == "no_gradient" and report["first_sign"]["cause"] == "gradient_flow"
    assert report["last_flags"]["names"] == ["layer_frozen", "no_gradient"]  # its weights stand still too
    assert report["records"][0]["diagnosis"][0]["cause"] == "gradient_flow"
    text = CliRunner().invoke(cli, ["track", str(tmp_path / "old.jsonl"), "--brief"]).output
    assert "still there at the last step (10): layer_frozen, no_gradient" in text


# --- a run against a healthy one ----------------------------------------------------------------------------------

def _seeded_run(path, seed, data_offset=0, cut_from=None, steps=31):
    """NanoGPT trained with a Watch every 5 steps; from step `cut_from` on, block 0 is cut from the loss."""
    model = _nanogpt(seed)
    cut = {"on": False}
    model.h[1].register_forward_pre_hook(lambda module, args: (args[0].detach(),) if cut["on"] else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    with Watch(model, path, every=5) as watch:
        for step in range(steps):
            cut["on"] = cut_from is not None and step >= cut_from
            ids, targets = nano_batch(step + data_offset)
            _, loss = model(ids, targets)
            optimizer.zero_grad()
            loss.backward()
            watch.step(loss, lr=3e-3)
            optimizer.step()
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("against")
    return {"healthy": _seeded_run(folder / "healthy.jsonl", seed=1),
            "other_seed": _seeded_run(folder / "seed2.jsonl", seed=2, data_offset=500),
            "buggy": _seeded_run(folder / "buggy.jsonl", seed=1, cut_from=20)}


def test_two_seeds_of_one_recipe_do_not_part(runs):
    result = CliRunner().invoke(cli, ["track", str(runs["other_seed"]), "--against", str(runs["healthy"]), "--json"])
    assert result.exit_code == 0, result.output
    against = json.loads(result.output)["against"]
    assert against["matched"] == 7 and against["first_parted"] is None
    assert all(not step["parted"] for step in against["steps"])


def test_a_run_parts_from_its_healthy_twin_at_the_step_and_layer_of_its_bug(runs):
    result = CliRunner().invoke(cli, ["track", str(runs["buggy"]), "--against", str(runs["healthy"]), "--json"])
    assert result.exit_code == 1
    first = json.loads(result.output)["against"]["first_parted"]
    assert (first["step"], first["layer"], first["quantity"]) == (20, 0, "grad_norm")
    assert first["run"] is None and first["reference"] > 0
    text = CliRunner().invoke(cli, ["track", str(runs["buggy"]), "--against", str(runs["healthy"]), "--brief"]).output
    assert "the runs part at step 20: L0 grad_norm — vs " in text


def test_against_compares_like_with_like(runs):
    result = CliRunner().invoke(cli, ["track", str(runs["healthy"]), "--against", "sample_weights/gpt2-tiny"])
    assert result.exit_code == 2 and result.stderr.startswith("Error: --against sample_weights/gpt2-tiny: compare like")
    assert len(result.stderr.strip().splitlines()) == 1  # one line, not click's usage block


@pytest.mark.parametrize("reentrant", [True, False])
def test_blocks_cut_from_the_loss_by_reentrant_checkpointing(tmp_path, reentrant):
    """A blind held-out run (benchmarks/blind F12): frozen embeddings, every block under
    torch.utils.checkpoint(use_reentrant=True) — the blocks run under no_grad and no gradient reaches them, while
    the head gets one. use_reentrant=False, the same loop otherwise, is the legitimate twin."""
    import warnings

    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    model = NanoGPT()
    model.wte.weight.requires_grad_(False)
    model.wpe.weight.requires_grad_(False)
    head = torch.nn.Linear(16, 61)
    blocks = list(model.h)

    class Checkpointed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.head = model, head

        def forward(self, ids):
            x = model.wte(ids) + model.wpe(torch.arange(ids.shape[1]))
            for block in blocks:
                x = checkpoint(block, x, use_reentrant=reentrant)
            return self.head(model.ln_f(x))

    whole = Checkpointed()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Watch(whole, tmp_path / "run.jsonl", every=1, blocks=blocks, overwrite=True) as watch:
            ids, targets = nano_batch(0)
            loss = torch.nn.functional.cross_entropy(whole(ids).reshape(-1, 61), targets.reshape(-1))
            loss.backward()
            entry = watch.step(loss)
    found = [f for f in entry["flags"] if f["name"] == "blocks_cut_from_loss"]
    assert bool(found) == reentrant
    from blocktrace.training.timeline import read_timeline

    assert read_timeline(tmp_path / "run.jsonl")[0]["blocks"]["without_gradient"] == (2 if reentrant else 0)
    if reentrant:
        assert entry["diagnosis"][0]["cause"] == "gradient_flow"


def _layerdrop_run(path, rate: float, steps: int = 41, layers: int = 4) -> list[dict]:
    """NanoGPT under LayerDrop (Fan, Grave & Joulin 2020) written as a forward hook that returns the block's input
    in place of its output at a training forward, with probability `rate` (seen in the tenth blind group, H3 and
    F06, calibration now): a skipped block's computation is thrown away, so it gets no gradient that step."""
    torch.manual_seed(0)
    model = NanoGPT(layers=layers)
    for embedding in (model.wte, model.wpe):
        torch.nn.init.normal_(embedding.weight, std=0.02)  # GPT-2's: the loss starts at log V
    draws = torch.Generator().manual_seed(1)

    def layerdrop(module, args, kwargs, output):
        return args[0] if module.training and torch.rand((), generator=draws).item() < rate else output

    for block in model.h:
        block.register_forward_hook(layerdrop, with_kwargs=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, path, every=5, optimizer=optimizer, overwrite=True) as watch:
        for step in range(steps):
            _, loss = model(*nano_batch(step))
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
    return read_timeline(path)


@pytest.mark.parametrize("rate, warned", [(0.2, False), (0.8, True)])
def test_blocks_skipped_by_layerdrop_are_said_and_not_judged_and_a_rate_past_the_published_is_warned(
        tmp_path, rate, warned):
    """A block whose output is its very input passed the stream through: it took no part in the forward, so neither
    its residual identity nor its missing gradient is a finding. Published LayerDrop and stochastic-depth rates are
    at most 0.5 (Fan et al. 2020 train at 0.1–0.2; Huang et al. 2016 decay linearly to 0.5 at the last layer): a
    rate above it, measured over the records, leaves most of the network out of every forward."""
    records = _layerdrop_run(tmp_path / "run.jsonl", rate)
    skipped = sum(r["blocks"]["skipped"] for r in records)
    assert skipped > 0 and all(r["blocks"]["traced"] + r["blocks"]["skipped"] == 4 for r in records)
    serious = {f["name"] for r in records for f in r["flags"] if f["level"] in ("error", "warning")}
    assert not serious & {"residual_not_added", "no_gradient", "blocks_cut_from_loss", "layer_frozen", "no_update"}
    said = [f for r in records for f in r["flags"] if f["name"] == "blocks_skipped"]
    assert said and {f["level"] for f in said} <= {"info", "warning"}
    assert any(f["level"] == "warning" for f in said) == warned
    if warned:
        assert "architecture" in {r["diagnosis"][0]["cause"] for r in records if r.get("diagnosis")}
