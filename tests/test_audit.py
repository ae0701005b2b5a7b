"""diagnose/audit.py: the optimizer's settings against the region its definition is valid in — each rule on both
sides: the fault (a Watch over a real loop, and the record alone) and the legitimate settings published recipes
use beside it."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from helpers import NanoGPT, make_gpt2, make_llama, nano_batch

from blocktrace import Watch
from blocktrace.diagnose.audit import DECAY_HALVES_IN, DECAY_TOO_STRONG
from blocktrace.diagnose.dynamics import judge
from blocktrace.training.model_facts import exterior_parameters
from blocktrace.training.settings import optimizer_hyperparameters
from blocktrace.training.timeline import read_timeline
from blocktrace.vocab import Exterior, Level

AUDIT = {"optimizer_ascends", "moment_rates_invalid", "weight_decay_too_strong"}


def _train(path, make_optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3), model=None, clamp=None,
           steps=6) -> list[dict]:
    """A nanoGPT loop with the README's Watch lines (a loss clamped at `clamp` if given: a clamp meant to tame
    spikes); the records as `track` reads them back."""
    torch.manual_seed(0)
    model = model or NanoGPT()
    optimizer = make_optimizer(model.parameters())
    with Watch(model, path, every=5, optimizer=optimizer, overwrite=True) as watch:
        for step in range(steps):
            ids, targets = nano_batch(step)
            _, loss = model(ids, targets)
            loss = loss if clamp is None else loss.clamp(max=clamp)
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
    return read_timeline(path)


def _audited(optimizer) -> dict:
    """The audit's findings, by name, on a record holding this optimizer's settings."""
    entry = {"step": 0, "layers": [], "loop": {"optimizer": optimizer_hyperparameters(optimizer)}}
    return {f.name: f for f in judge([], entry) if f.name in AUDIT}


def _parameters() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.ones(2, 2))]


def test_an_optimizer_told_to_maximize_is_caught_at_the_first_record_with_its_cause(tmp_path):
    records = _train(tmp_path / "run.jsonl", lambda ps: torch.optim.AdamW(ps, lr=1e-3, maximize=True))
    found = [f for f in records[0]["flags"] if f["name"] == "optimizer_ascends"]
    assert found and found[0]["level"] == "error" and "maximize=True" in found[0]["detail"]
    assert records[0]["diagnosis"][0]["cause"] == "optimizer"
    assert records[0]["loop"]["optimizer"]["groups"][0]["maximize"] is True  # read back through the schema

    healthy = _train(tmp_path / "healthy.jsonl", lambda ps: torch.optim.AdamW(ps, lr=1e-3))
    assert not {f["name"] for r in healthy for f in r["flags"]} & AUDIT


def test_a_learning_rate_below_zero_climbs_the_loss():
    optimizer = torch.optim.SGD(_parameters(), lr=0.1)
    optimizer.param_groups[0]["lr"] = -0.1  # what a schedule gone below 0 leaves (torch refuses it at construction)
    assert "lr=-0.1 < 0" in _audited(optimizer)["optimizer_ascends"].detail
    assert _audited(optimizer)["optimizer_ascends"].cause.value == "learning_rate"  # the lr's value, not the rule
    assert "optimizer_ascends" not in _audited(torch.optim.SGD(_parameters(), lr=0.0))  # 0 is not a climb


def test_swapped_adam_betas_lie_outside_the_region_where_adam_converges(tmp_path):
    records = _train(tmp_path / "run.jsonl", lambda ps: torch.optim.Adam(ps, lr=1e-3, betas=(0.999, 0.9)))
    found = [f for f in records[0]["flags"] if f["name"] == "moment_rates_invalid"]
    assert found and found[0]["level"] == "error" and "β1 = 0.999 ≥ √β2" in found[0]["detail"]
    assert records[0]["diagnosis"][0]["cause"] == "optimizer"


# the betas of published recipes: GPT-3 and Llama, the Transformer and RoBERTa, Adam's paper and BERT, β1 = 0
# (Adafactor's recipe), a GAN's Adam (0.5, 0.999); and just inside the bound
PUBLISHED_BETAS = [(0.9, 0.95), (0.9, 0.98), (0.9, 0.999), (0.0, 0.99), (0.5, 0.999), (0.94, 0.8836 + 1e-6)]


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.RAdam])
@pytest.mark.parametrize("betas", PUBLISHED_BETAS)
def test_published_adam_betas_pass(kind, betas):
    assert _audited(kind(_parameters(), lr=1e-3, betas=betas)) == {}


@pytest.mark.parametrize("betas", [(0.95, 0.9), (0.99, 0.98), (1.0, 0.999), (0.9, 1.0)])
def test_adam_betas_on_or_past_the_bound_are_said_with_the_bound(betas):
    optimizer = torch.optim.Adam(_parameters(), lr=1e-3)
    optimizer.param_groups[0]["betas"] = betas  # torch refuses a beta of 1 at construction; a group can still hold it
    detail = _audited(optimizer)["moment_rates_invalid"].detail
    assert ("outside [0, 1)" in detail) if max(betas) >= 1 else (f"√β2 = {math.sqrt(betas[1]):.4g}" in detail)


class Lion(torch.optim.Optimizer):
    """Lion's param groups (Chen et al. 2023): betas that interpolate signs, not Adam's moment rates."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay})


def test_the_adam_bound_is_not_applied_to_an_optimizer_whose_betas_mean_otherwise():
    assert _audited(Lion(_parameters(), betas=(0.95, 0.9))) == {}  # β1 ≥ √β2, but not Adam's moments
    assert "outside [0, 1)" in _audited(Lion(_parameters(), betas=(0.9, 1.5)))["moment_rates_invalid"].detail


def test_sgd_momentum_of_one_never_forgets_nesterov_and_heavy_ball_pass():
    assert "momentum=1" in _audited(torch.optim.SGD(_parameters(), lr=0.1, momentum=1.0))["moment_rates_invalid"].detail
    assert _audited(torch.optim.SGD(_parameters(), lr=0.1, momentum=0.9, nesterov=True)) == {}
    assert _audited(torch.optim.SGD(_parameters(), lr=0.1, momentum=0.99)) == {}
    assert _audited(torch.optim.SGD(_parameters(), lr=0.1)) == {}


class _GroupsOnly(torch.optim.Optimizer):
    """A hand-written optimizer's param groups, as the audit reads them (its step is not taken here)."""

    def __init__(self, params, **settings):
        super().__init__(params, settings)


def test_nesterov_with_dampening_and_a_dampening_of_1_are_outside_sgds_definition():
    """Seen in the sixth blind group (F07, calibration): a hand-written Nesterov SGD given dampening = momentum = 0.9
    (Torch7's convention) averages its velocity where Nesterov's sums it; torch.optim.SGD refuses the pair."""
    found = _audited(_GroupsOnly(_parameters(), lr=0.3, momentum=0.9, dampening=0.9, nesterov=True))
    assert "Nesterov momentum is defined without dampening" in found["moment_rates_invalid"].detail
    assert "dampening=1 is outside" in _audited(_GroupsOnly(_parameters(), lr=0.1, momentum=0.9, dampening=1.0,
                                                            nesterov=False))["moment_rates_invalid"].detail
    assert _audited(torch.optim.SGD(_parameters(), lr=0.1, momentum=0.9, dampening=0.9)) == {}  # heavy ball, damped
    assert _audited(_GroupsOnly(_parameters(), lr=0.3, momentum=0.9, dampening=0.0, nesterov=True)) == {}


def test_decoupled_weight_decay_that_zeroes_or_halves_the_weights_is_caught_published_decay_passes():
    assert (1 - DECAY_TOO_STRONG) ** DECAY_HALVES_IN == pytest.approx(0.5)  # the bound is what its comment says
    strong = _audited(torch.optim.AdamW(_parameters(), lr=1e-2, weight_decay=200.0))["weight_decay_too_strong"]
    assert strong.level.value == "error" and strong.value == pytest.approx(2.0)
    halving = _audited(torch.optim.AdamW(_parameters(), lr=1e-2, weight_decay=1.0))["weight_decay_too_strong"]
    assert halving.level.value == "warning"
    for lr, decay in ((6e-4, 0.1), (3e-4, 0.1), (1e-2, 0.1), (1e-3, 0.01)):  # nanoGPT, Llama 2, a high lr, a small λ
        assert _audited(torch.optim.AdamW(_parameters(), lr=lr, weight_decay=decay)) == {}
    # an L2 term added to the gradient (Adam's and SGD's weight_decay) is not a multiplication of the weights
    assert _audited(torch.optim.Adam(_parameters(), lr=1e-2, weight_decay=1.0)) == {}
    assert _audited(torch.optim.SGD(_parameters(), lr=1e-2, weight_decay=1.0)) == {}


def _zeroed(*, everything: bool) -> NanoGPT:
    torch.manual_seed(0)
    model = NanoGPT()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and (everything or name.endswith(("c_proj", "mlp.2"))):
            torch.nn.init.zeros_(module.weight)
            torch.nn.init.zeros_(module.bias)
    return model


def test_every_linear_layer_zeroed_at_step_0_is_initialisation_one_output_projection_zeroed_is_a_recipe(tmp_path):
    """Issue 41.3: every nn.Linear zero-initialised was called architecture (dead FFN units): a matrix pair that is
    its own gradient's factor, zero at step 0, is the initialisation."""
    records = _train(tmp_path / "zero.jsonl", model=_zeroed(everything=True))
    found = [f for f in records[0]["flags"] if f["name"] == "weights_zero_stuck"]
    assert {f["layer"] for f in found} == {0, 1} and "since the first record (step 0)" in found[0]["detail"]
    assert records[0]["diagnosis"][0]["cause"] == "initialisation"
    assert records[1]["diagnosis"][0]["cause"] == "initialisation"  # still zero later: still the initialisation

    # zero-initialised residual-branch output projections (modded-nanoGPT, Fixup): their inputs are not zero
    recipe = _train(tmp_path / "recipe.jsonl", model=_zeroed(everything=False))
    assert recipe[0]["layers"][0]["weights"]["ffn_w2"]["norm"] == 0 == recipe[0]["layers"][0]["weights"]["attn_o"]["norm"]
    assert not {f["name"] for r in recipe for f in r["flags"]} & {"weights_zero_stuck"}


def test_a_loss_whose_gradient_is_zero_everywhere_is_gradient_flow_from_the_first_record(tmp_path):
    """Issue 41.3: a loss clamped below its value has gradient exactly 0 for every parameter — it was found at step
    10 as updates_tiny (cause optimizer); a backward that reaches no parameter is gradient flow."""
    records = _train(tmp_path / "clamp.jsonl", clamp=1.0)
    assert "gradient_zero_everywhere" in {f["name"] for f in records[0]["flags"]}
    assert all(r["diagnosis"][0]["cause"] == "gradient_flow" for r in records)

    loose = _train(tmp_path / "loose.jsonl", clamp=1e6)  # a clamp above the loss: a gradient flows
    assert "gradient_zero_everywhere" not in {f["name"] for r in loose for f in r["flags"]}


def _hf_trained(path, model, optimizer, steps: int, every: int) -> list[dict]:
    """An HF causal LM trained on random ids (vocabulary 101) under a Watch given its optimizer: its records."""
    with Watch(model, path, every=every, optimizer=optimizer, overwrite=True) as watch:
        for step in range(steps):
            ids = torch.randint(0, 101, (4, 32), generator=torch.Generator().manual_seed(step))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
    return read_timeline(path)


def test_a_zero_initialised_head_is_a_recipe_not_a_backward_that_reaches_nothing(tmp_path):
    """modded-nanogpt zero-initialises its head (`lm_head.weight.zero_()`) and µP its readout (Yang et al. 2021): at
    step 0 every block's gradient is exactly 0 — ∂L/∂h = W_headᵀ·(p − y) = 0 — while the head's is not, and the first
    step moves the head. It was called gradient_zero_everywhere ('the backward reached no parameter') at step 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=False))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    records = _hf_trained(tmp_path / "run.jsonl", model, optimizer, steps=3, every=1)
    assert all(layer["grad_norm"] == 0 for layer in records[0]["layers"]) and records[0]["grad_norm"] > 0
    assert all(layer["grad_norm"] > 0 for layer in records[1]["layers"])
    assert not [f for r in records for f in r["flags"] if f["level"] in ("error", "warning")]


@pytest.mark.parametrize("p, found", [(0.9, "error"), (0.8, "error"), (0.5, "warning"), (0.3, None)])
def test_a_dropout_rate_no_recipe_uses_is_a_warning_and_a_keep_probability_an_error(tmp_path, p, found):
    """Published LM recipes drop 0 to 0.3; p ≥ 0.5 drops every other activation or more (a warning); p ≥ 0.8 keeps
    at most a fifth — TensorFlow 1's keep_prob (0.8–0.9) given as PyTorch's drop rate — an error. The error level
    is calibration: written after failures3's gpt2-radam-dropout-0.9, an outside run already seen, was warned of
    at step 0 and counted missed."""
    torch.manual_seed(0)
    model = make_gpt2(head=True, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p).train()
    with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
        ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(0))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        entry = watch.step(loss)
    flagged = [f for f in entry["flags"] if f["name"] == "dropout_too_high"]
    assert bool(flagged) == bool(found)
    if found:
        assert flagged[0]["level"] == found and f"p = {p:g}" in flagged[0]["detail"]


def test_zero_gradients_made_by_zero_weights_are_the_initialisation_not_gradient_flow(tmp_path):
    """Issue 41.3, seen in the third blind group (F04, after its first score): every nn.Linear and the tied embedding
    zero-initialised give every parameter a gradient of exactly 0 — the zero saddle, a fact about the weights at step
    0 — and were ranked gradient flow. The zero gradients follow from the zero matrices: one finding, initialisation."""
    model = _zeroed(everything=True)
    with torch.no_grad():
        model.wte.weight.zero_()
        model.wpe.weight.zero_()
    records = _train(tmp_path / "zero.jsonl", model=model)
    assert all(layer["grad_norm"] == 0 for layer in records[0]["layers"])  # the case: no gradient anywhere
    names = {f["name"] for f in records[0]["flags"]}
    assert "weights_zero_stuck" in names and "gradient_zero_everywhere" not in names
    assert records[0]["diagnosis"][0]["cause"] == "initialisation"


# --- update_exceeds_its_bound and second_moment_lost: the optimizer's arithmetic against its definition -----------

class _HandAdam(torch.optim.Optimizer):
    """Adam from Kingma & Ba's Algorithm 1, or one of two published slips: no square root in the denominator, bias
    corrections multiplied in."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, fault=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.fault = fault

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in (p for p in group["params"] if p.grad is not None):
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                if self.fault == "bias_multiplied":
                    m_hat, v_hat = m * (1 - b1 ** t), v * (1 - b2 ** t)
                else:
                    m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
                denominator = v_hat if self.fault == "no_sqrt" else v_hat.sqrt()
                p.addcdiv_(m_hat, denominator.add_(group["eps"]), value=-group["lr"])


class _HandLion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023): w ← w·(1 − lr·λ) − lr·sign(β1·m + (1 − β1)·g); m ← β2·m + (1 − β2)·g. With
    `signed=False`, the published slip of applying the interpolation itself."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.1, signed=True, in_place=False):
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        self.signed, self.in_place = signed, in_place

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in (p for p in group["params"] if p.grad is not None):
                m = self.state[p].setdefault("exp_avg", torch.zeros_like(p))
                p.mul_(1 - group["lr"] * group["weight_decay"])
                if self.in_place:  # blind11's F07: the update made on the state itself, then signed in place
                    p.add_(m.mul_(b1).add_(p.grad, alpha=1 - b1).sign_(), alpha=-group["lr"])
                else:
                    update = m * b1 + p.grad * (1 - b1)
                    p.add_(torch.sign(update) if self.signed else update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.9, 0.95), (0.0, 0.99)])
def test_the_adam_move_bound_is_reached_by_torch_adam_on_its_extremal_gradients_and_never_passed(betas):
    """The bound against torch.optim.Adam itself (eps = 0): gradients g_i ∝ (β2/β1)^i make Cauchy–Schwarz an
    equality, so Adam's move at step t is the bound at t; random gradients stay under the supremum."""
    from blocktrace.diagnose.audit import adam_move_bound
    beta1, beta2 = betas
    steps = 40
    weight = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    adam = torch.optim.Adam([weight], lr=1.0, betas=betas, eps=0.0)
    for i in range(1, steps + 1):
        before = weight.detach().clone()
        weight.grad = torch.full_like(weight, (beta2 / beta1) ** i if beta1 else float(i == steps) + 1e-30)
        adam.step()
        moved = float((weight.detach() - before).abs())
    gamma = beta1 ** 2 / beta2
    at_t = (1 - beta1) / math.sqrt(1 - beta2) * math.sqrt((1 - gamma ** steps) / (1 - gamma)) \
        * math.sqrt(1 - beta2 ** steps) / (1 - beta1 ** steps)
    assert moved == pytest.approx(at_t, rel=1e-9) and moved <= adam_move_bound(*betas) * (1 + 1e-12)

    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.zeros(10_000, dtype=torch.float64))
    adam = torch.optim.Adam([weights], lr=1.0, betas=betas, eps=0.0)
    for i in range(300):
        before = weights.detach().clone()
        weights.grad = torch.randn_like(weights) * torch.rand(()) ** 4 * 10 ** (i % 7 - 3)
        adam.step()
        assert float((weights.detach() - before).abs().max()) <= adam_move_bound(*betas)


def _bound_flags(records: list[dict]) -> list[dict]:
    return [f for r in records for f in r["flags"] if f["name"] in {"update_exceeds_its_bound", "second_moment_lost"}]


@pytest.mark.parametrize("fault", ["no_sqrt", "bias_multiplied"])
def test_a_hand_written_adam_whose_arithmetic_is_not_adams_is_the_optimizer(tmp_path, fault):
    """Seen in the fourth and fifth blind groups (F04, F08; calibration now): a hand-written Adam without the square
    root, or with its bias corrections multiplied in, was found through its symptoms and called the learning rate.
    Its settings are valid; its moves are not: each is larger than any Adam's can be."""
    records = _train(tmp_path / "run.jsonl", lambda ps: _HandAdam(ps, lr=1e-3, fault=fault))
    found = [f for f in _bound_flags(records[1:]) if f["name"] == "update_exceeds_its_bound"]
    assert found and found[0]["level"] == "error" and "_HandAdam's param group 0" in found[0]["detail"]
    assert "after the record at step 0" in found[0]["detail"]
    assert records[1]["diagnosis"][0]["cause"] == "optimizer"
    assert records[1]["loop"]["update_step"] == 1  # a fresh optimizer's first step: Adam moves a weight by ≤ lr
    assert records[1]["loop"]["update_moves"][0] > 1.5 and "at its step 1" in found[0]["detail"]


@pytest.mark.parametrize("make", [
    lambda ps: _HandAdam(ps, lr=1e-3),
    lambda ps: torch.optim.Adam(ps, lr=3e-3, weight_decay=0.01),
    lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1),
    lambda ps: torch.optim.AdamW(ps, lr=1e-3, amsgrad=True),
    lambda ps: _HandLion(ps, lr=1e-4),
    lambda ps: torch.optim.RAdam(ps, lr=1e-3),
], ids=["hand-adam", "adam-l2", "adamw-0.95", "amsgrad", "lion", "radam"])
def test_adam_and_lion_moves_within_their_bound_pass(tmp_path, make):
    records = _train(tmp_path / "run.jsonl", make, steps=21)
    assert all(r["loop"]["update_moves"] is not None for r in records[1:])  # measured at steps 1, 6, 11, 16
    assert records[-1]["loop"]["update_step"] in (16, None)  # RAdam and Lion keep no count in torch's form
    assert not _bound_flags(records)


@pytest.mark.parametrize("optimizer_class, betas, move, flagged", [
    ("HandAdam", [0.9, 0.999], 12.0, True), ("HandAdam", [0.9, 0.999], 10.0, False),
    ("AdamW", [0.9, 0.95], 2.0, True), ("RAdam", [0.9, 0.999], 50.0, False), ("NAdam", [0.9, 0.999], 50.0, False),
    ("AdamWScheduleFree", [0.9, 0.999], 50.0, False), ("Lion", [0.9, 0.99], 1.6, True), ("Lion", [0.9, 0.99], 1.0, False),
    ("SGD", None, 50.0, False),
])
def test_the_move_bound_applies_to_the_optimizers_that_define_it(optimizer_class, betas, move, flagged):
    group = {"lr": 1e-3, **({"betas": betas} if betas else {})}
    entry = {"step": 10, "layers": [], "loop": {"optimizer": {"class": optimizer_class, "groups": [group]},
                                                "update_moves": [move], "step_gradient_at": 5}}
    names = {f.name for f in judge([], entry)}
    assert ("update_exceeds_its_bound" in names) == flagged


def test_a_lion_whose_update_is_not_a_sign_is_the_optimizer(tmp_path):
    """Seen in the eleventh blind group (F08, calibration): Lion's update applied without sign(). Lion moves every
    weight by exactly its learning rate; without the sign no weight moves by half of it. Lion as written passes
    (test_adam_and_lion_moves_within_their_bound_pass), at its first step too."""
    records = _train(tmp_path / "run.jsonl", lambda ps: _HandLion(ps, lr=1e-4, signed=False))
    found = [f for r in records[1:] for f in r["flags"] if f["name"] == "sign_update_short"]
    assert found and found[0]["level"] == "error" and "_HandLion's param group 0" in found[0]["detail"]
    assert records[1]["loop"]["update_moves"][0] < 0.5 and records[1]["diagnosis"][0]["cause"] == "optimizer"
    signed = _train(tmp_path / "signed.jsonl", lambda ps: _HandLion(ps, lr=1e-4), steps=21)
    assert all(r["loop"]["update_moves"][0] == pytest.approx(1.0, abs=0.01) for r in signed[1:])
    assert not [f for r in signed for f in r["flags"] if f["name"] == "sign_update_short"]


@pytest.mark.parametrize("optimizer_class, move, flagged", [
    ("Lion", 0.01, True), ("HandLion", 0.4, True), ("Lion", 0.99, False), ("AdamW", 0.01, False),
    ("SGD", 0.0, False),
])
def test_the_sign_update_applies_to_sign_optimizers_only(optimizer_class, move, flagged):
    entry = {"step": 10, "layers": [], "loop": {"optimizer": {"class": optimizer_class, "groups": [{"lr": 1e-3}]},
                                                "update_moves": [move], "step_gradient_at": 5}}
    assert ("sign_update_short" in {f.name for f in judge([], entry)}) == flagged


def test_adams_second_moment_rounded_to_0_by_a_16_bit_save_is_precision(tmp_path):
    """A state saved through float16 (its smallest value 6e-8) loses every v below it while m keeps its value: the
    resumed run's first steps divide m by ε alone. Seen as an update spike called the learning rate (fifth blind
    group, F03; calibration)."""
    def run(path, rounded: bool) -> list[dict]:
        torch.manual_seed(0)
        model = NanoGPT()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        for step in range(3):  # the earlier job
            ids, targets = nano_batch(step)
            model(ids, targets)[1].backward()
            optimizer.step()
            optimizer.zero_grad()
        if rounded:  # saved in float16, loaded back: torch casts the state to the parameters' dtype
            for state in optimizer.state.values():
                state["exp_avg"], state["exp_avg_sq"] = state["exp_avg"].half().float(), \
                    state["exp_avg_sq"].half().float()
        return _train(path, lambda ps: optimizer, model=model)

    records = run(tmp_path / "rounded.jsonl", rounded=True)
    lost = [f for f in _bound_flags(records[1:]) if f["name"] == "second_moment_lost"]
    assert lost and lost[0]["cause"] == "precision"
    assert records[1]["diagnosis"][0]["cause"] == "precision"
    assert not _bound_flags(run(tmp_path / "kept.jsonl", rounded=False))


def test_every_linear_layer_set_to_one_value_is_initialisation_at_step_0(tmp_path):
    """Seen in the fifth blind group (F06, calibration now): nn.init.constant_(w, 0.02) where normal_ was meant made
    every unit of a layer a copy of the others; it was found at step 20 through the residual stream's growth and
    called the learning rate. A matrix of one value is a fact about the weights at step 0."""
    torch.manual_seed(0)
    model = NanoGPT()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            torch.nn.init.constant_(module.weight, 0.02)
    records = _train(tmp_path / "constant.jsonl", model=model)
    found = [f for f in records[0]["flags"] if f["name"] == "weights_constant"]
    assert {f["layer"] for f in found} == {0, 1} and found[0]["level"] == "error"
    assert records[0]["diagnosis"][0]["cause"] == "initialisation"

    healthy = _train(tmp_path / "healthy.jsonl", model=_zeroed(everything=False))  # zero projections: a recipe
    assert "weights_constant" not in {f["name"] for r in healthy for f in r["flags"]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_large_constant_matrix_has_spread_0_where_its_float32_moments_leave_a_std(dtype):
    from blocktrace.diagnose.weights import sampled_spread, sum_and_squares
    constant = torch.full((4096, 4096), 0.02, dtype=dtype)
    assert float(sampled_spread(constant)) == 0
    total, squares = sum_and_squares(constant)
    n = constant.numel()
    assert dtype is torch.bfloat16 or float(squares - total ** 2 / n) > 0  # the moments' rounding: not 0
    assert float(sampled_spread(torch.randn(4096, 4096).to(dtype) * 0.02)) > 0


def test_a_dropout_rate_no_recipe_uses_outranks_the_symptom_it_explains():
    """failures3's gpt2-radam-dropout-0.9: the dropout rate was said as a warning at step 0, and its tiny updates
    at step 10 (an error, a symptom with no mechanism of its own) took the diagnosis to the optimizer. A setting
    observed outside every recipe is a fact about the run; a symptom it explains does not outrank it."""
    from blocktrace.diagnose.checks import Cause, Flag
    from blocktrace.diagnose.diagnosis import Context, diagnose

    flags = [Flag("dropout_too_high", Level.WARNING, None, None, 0.9, "p = 0.9", Cause.ARCHITECTURE),
             Flag("updates_tiny", Level.ERROR, None, None, 1e-6, "tiny", Cause.OPTIMIZER)]
    assert diagnose(flags, Context(step=10))[0]["cause"] == "architecture"


class _Rounded(torch.nn.Linear):
    """A Linear whose forward uses its weight rounded to 8 bits (fake quantisation), with or without the
    straight-through estimator."""

    def __init__(self, linear: torch.nn.Linear, straight_through: bool):
        super().__init__(linear.in_features, linear.out_features)
        self.load_state_dict(linear.state_dict())
        self.straight_through = straight_through

    def forward(self, x):
        scale = self.weight.abs().max() / 127
        rounded = torch.round(self.weight / scale) * scale
        weight = self.weight + (rounded - self.weight).detach() if self.straight_through else rounded
        return torch.nn.functional.linear(x, weight, self.bias)


def _quantised(straight_through: bool) -> NanoGPT:
    torch.manual_seed(0)
    model = NanoGPT()
    for block in model.h:
        block.mlp[0] = _Rounded(block.mlp[0], straight_through)
    return model


@pytest.mark.parametrize("straight_through", [False, True])
def test_weights_the_gradient_reaches_only_through_a_rounding_are_gradient_flow(tmp_path, straight_through):
    """Seen in the sixth blind group (F01, calibration): quantisation-aware training without the straight-through
    estimator — torch.round has a zero derivative, so the weight gets a gradient only through its scale (one entry):
    nothing was raised. With the estimator (a published recipe) every entry gets its gradient."""
    records = _train(tmp_path / "run.jsonl", model=_quantised(straight_through), steps=11)
    found = [f for r in records for f in r["flags"] if f["name"] == "gradient_misses_weights"]
    if straight_through:
        assert not found
        return
    assert {f["layer"] for f in found} == {0, 1} and "ffn_w1 gets a nonzero gradient at 1 of its entries" in \
        found[0]["detail"]
    assert records[1]["diagnosis"][0]["cause"] == "gradient_flow"
    assert records[0]["layers"][0]["weights"]["ffn_w1"]["gradient_entries"] == 1  # the largest entry, by the scale


def test_a_zero_initialised_partner_leaves_a_matrix_without_gradient_for_one_step_only(tmp_path):
    records = _train(tmp_path / "run.jsonl", model=_zeroed(everything=False), steps=11)
    assert records[0]["layers"][0]["weights"]["ffn_w1"]["gradient_entries"] == 0  # ∂L/∂W1 ∝ W2 = 0 at step 0
    assert not [f for r in records for f in r["flags"] if f["name"] == "gradient_misses_weights"]


@pytest.mark.parametrize("n_inner, found", [(2, True), (None, False), (8, False)])
def test_an_ffn_narrower_than_any_published_one_is_the_architecture(tmp_path, n_inner, found):
    """Seen in the sixth blind group (F03, calibration): GPT2Config(n_inner=4) — a width where a ratio was meant —
    makes a 4-unit MLP; nothing was raised. Published FFNs are 8/3·d to 4·d, experts no narrower than d/4."""
    records = _train(tmp_path / "run.jsonl", lambda ps: torch.optim.AdamW(ps, lr=1e-3),
                     model=_HFLoss(make_gpt2(head=True, n_inner=n_inner).train()), steps=1)
    flagged = [f for f in records[0]["flags"] if f["name"] == "ffn_too_narrow"]
    assert bool(flagged) == found
    if found:
        assert {f["layer"] for f in flagged} == {0, 1, 2} and "c_fc.weight has 2 units for a 32-wide stream" in \
            flagged[0]["detail"] and flagged[0]["level"] == "warning"


class _HFLoss(torch.nn.Module):
    """An HF causal LM called as the README's nanoGPT loop calls its model: (ids, targets) -> (logits, loss)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, targets=None):
        out = self.model(input_ids=ids)
        loss = torch.nn.functional.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), targets.reshape(-1))
        return out.logits, loss


def _hf_loop(path, model) -> list[dict]:
    """An HF language model trained on its own loss (labels = ids) for 6 steps under AdamW."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with Watch(model, path, every=5, optimizer=optimizer, overwrite=True) as watch:
        for step in range(6):
            ids, _ = nano_batch(step, vocab=model.config.vocab_size)
            loss = model(ids, labels=ids).loss
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
    return read_timeline(path)


@pytest.mark.parametrize("untie, tied", [(False, True), (True, False)])
def test_a_head_its_config_ties_to_the_embedding_held_as_another_tensor_is_caught(tmp_path, untie, tied):
    """GPT-2's config ties the head to the token embedding (tie_word_embeddings, true by default) and HF makes them
    one tensor; a head re-created as a copy (as a device move or a wrapper copying parameters one by one can leave
    it) is a model other than the config's."""
    model = make_gpt2(head=True)
    if untie:
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    records = _hf_loop(tmp_path / "run.jsonl", model)
    assert records[0]["loop"]["embeddings"] == {"tied": tied}
    found = [f for f in records[0]["flags"] if f["name"] == "embeddings_untied"]
    assert [f["level"] for f in found] == ([] if tied else ["error"])


def test_a_model_whose_config_does_not_tie_or_that_has_no_config_is_not_judged(tmp_path):
    model = make_gpt2(head=True, tie_word_embeddings=False)
    assert _hf_loop(tmp_path / "hf.jsonl", model)[0]["loop"]["embeddings"] is None
    assert _train(tmp_path / "nano.jsonl")[0]["loop"]["embeddings"] is None


class _MuonWithAuxAdam(torch.optim.SGD):
    """The shape of KellerJordan/Muon's MuonWithAuxAdam for the audit: param groups flagged use_muon (the update rule
    itself is not what the audit reads)."""

    def __init__(self, groups):
        super().__init__([{k: v for k, v in g.items()} for g in groups], lr=0.02)


class Muon(torch.optim.SGD):
    """An optimizer named Muon whose groups carry no use_muon flag, as torch.optim.Muon (torch ≥ 2.9) and KellerJordan's
    Muon are: every group is Muon's (its update rule is not what the audit reads; SGD keeps the test on any torch)."""


def _hidden_matrices(model) -> list[torch.nn.Parameter]:
    return [p for p in model.h.parameters() if p.ndim >= 2]


def _the_rest(model, muon) -> list[torch.nn.Parameter]:
    chosen = {id(p) for p in muon}
    return [p for p in model.parameters() if id(p) not in chosen]


def _two_optimizer_loop(path, muon_params_of) -> list[dict]:
    """Muon on the matrices `muon_params_of` picks, AdamW on the rest, as Muon's README pairs them; the Watch is given
    Muon's optimizer."""
    torch.manual_seed(0)
    model = NanoGPT()
    muon_params = muon_params_of(model)
    muon = Muon(muon_params, lr=0.02)
    adam = torch.optim.AdamW(_the_rest(model, muon_params), lr=1e-3)
    with Watch(model, path, every=5, optimizer=muon, overwrite=True) as watch:
        for step in range(6):
            ids, targets = nano_batch(step)
            _, loss = model(ids, targets)
            loss.backward()
            watch.step(loss)
            for optimizer in (muon, adam):
                optimizer.step()
                optimizer.zero_grad()
    return read_timeline(path)


def test_muon_on_the_embedding_or_the_head_is_outside_its_definition(tmp_path):
    """Muon is defined for the hidden layers' matrices; its authors, Keras and DeepSpeed keep the embedding and the
    output head on AdamW: every 2D parameter handed to Muon (the README's model.body left out) puts them in."""
    every_matrix = _two_optimizer_loop(tmp_path / "all.jsonl", lambda m: [p for p in m.parameters() if p.ndim >= 2])
    found = [f for f in every_matrix[0]["flags"] if f["name"] == "orthogonalised_embedding_or_head"]
    assert found and found[0]["level"] == "warning"
    assert "embedding" in found[0]["detail"] and "head" in found[0]["detail"]  # nanoGPT's head is the tied wte
    assert every_matrix[0]["loop"]["optimizer"]["groups"][0]["holds_embedding"] is True  # read back by the schema

    hidden_only = _two_optimizer_loop(tmp_path / "hidden.jsonl", _hidden_matrices)
    assert not [f for r in hidden_only for f in r["flags"] if f["name"] == "orthogonalised_embedding_or_head"]


def test_muons_groups_are_read_by_their_use_muon_flag():
    model = make_gpt2(head=True)
    head, embedding = model.get_output_embeddings().weight, model.transformer.wpe.weight
    hidden = [p for p in model.transformer.h.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]

    def audited(muon_group, adam_group):
        optimizer = _MuonWithAuxAdam([dict(params=muon_group, use_muon=True),
                                      dict(params=adam_group, use_muon=False)])
        entry = {"step": 0, "layers": [],
                 "loop": {"optimizer": optimizer_hyperparameters(optimizer, exterior_parameters(model))}}
        return [f for f in judge([], entry) if f.name == "orthogonalised_embedding_or_head"]

    assert not audited(hidden, rest + [head, embedding])  # the README's split: exterior weights on Adam
    found = audited(hidden + [embedding], rest + [head])
    assert found and "embedding" in found[0].detail and "head" not in found[0].detail
    assert found[0].cause.value == "optimizer"


class _TrustRatioSGD(torch.optim.Optimizer):
    """LARS/LAMB's layer-wise step, w ← w − lr·(‖w‖/‖g‖)·g, with or without the guard that takes the ratio as 1
    where ‖w‖ or ‖g‖ is 0 (You et al. 2019; cybertronai/pytorch-lamb PR #6 added it)."""

    def __init__(self, params, lr, guarded):
        super().__init__(params, {"lr": lr})
        self.guarded = guarded

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                w_norm, g_norm = p.norm(), p.grad.norm()
                ratio = w_norm / g_norm.clamp_min(1e-12)
                if self.guarded:
                    ratio = torch.where((w_norm > 0) & (g_norm > 0), ratio, torch.ones_like(ratio))
                p.add_(p.grad, alpha=-(group["lr"] * float(ratio)))


def _zero_projection_model() -> NanoGPT:
    """NanoGPT with each attention's output projection zero-initialised (Fixup, GPT-NeoX's recipes)."""
    torch.manual_seed(0)
    model = NanoGPT()
    with torch.no_grad():
        for block in model.h:
            block.attn.c_proj.weight.zero_()
            block.attn.c_proj.bias.zero_()
    return model


def test_a_zero_matrix_a_trust_ratio_holds_at_zero_is_the_optimizer(tmp_path):
    records = _train(tmp_path / "run.jsonl", lambda ps: _TrustRatioSGD(ps, lr=0.05, guarded=False),
                     model=_zero_projection_model(), steps=11)
    found = [f for f in records[-1]["flags"] if f["name"] == "zero_matrix_not_updated"]
    assert found and found[0]["level"] == "error" and "exactly 0 at steps 5 and 10" in found[0]["detail"]
    assert records[-1]["diagnosis"][0]["cause"] == "optimizer"
    assert "gradient_misses_weights" not in {f["name"] for f in records[-1]["flags"]}  # the zero matrix explains it


def test_a_guarded_trust_ratio_and_a_group_at_lr_0_pass(tmp_path):
    guarded = _train(tmp_path / "guarded.jsonl", lambda ps: _TrustRatioSGD(ps, lr=0.05, guarded=True),
                     model=_zero_projection_model(), steps=11)
    assert not [f for r in guarded for f in r["flags"] if f["name"] == "zero_matrix_not_updated"]
    frozen = _train(tmp_path / "frozen.jsonl", lambda ps: torch.optim.SGD(ps, lr=0.0),
                    model=_zero_projection_model(), steps=11)
    assert not [f for r in frozen for f in r["flags"] if f["name"] == "zero_matrix_not_updated"]


def test_a_matrix_drawn_from_torch_rand_is_off_centre_at_step_0(tmp_path):
    """torch.rand's U[0, 1) has mean/std = 0.5/0.289: no published initialisation is off centre; the nanoGPT
    model's own draws (normal, Kaiming uniform) are centred."""
    torch.manual_seed(0)
    model = NanoGPT()
    with torch.no_grad():
        model.h[0].attn.c_attn.weight.copy_(torch.rand_like(model.h[0].attn.c_attn.weight))
    records = _train(tmp_path / "rand.jsonl", model=model, steps=1)
    found = [f for f in records[0]["flags"] if f["name"] == "weights_off_centre"]
    assert found and found[0]["level"] == "error" and found[0]["layer"] == 0 and found[0]["cause"] == "initialisation"
    mean, std = (float(word.rstrip(",;")) for word in found[0]["detail"].split() if word[0].isdigit())
    assert mean / std == pytest.approx(0.5 / (1 / 12) ** 0.5, rel=0.1)  # U[0, 1): mean / std = √3
    healthy = _train(tmp_path / "healthy.jsonl", steps=1)
    assert "weights_off_centre" not in {f["name"] for f in healthy[0]["flags"]}


def test_the_embedding_and_the_head_are_found_in_hf_and_hand_written_models():
    """exterior_parameters: HF's input/output embeddings (tied or not) and every nn.Embedding; in a hand-written model
    the last Linear as wide as the vocabulary, or the embedding its logits multiply by (nanoGPT's tie)."""
    from book_gpt import SMALL, GPTModel

    llama = make_llama(head=True, tie_word_embeddings=False)[0]
    roles = exterior_parameters(llama)
    assert roles[id(llama.lm_head.weight)] == {Exterior.HEAD}
    assert roles[id(llama.model.embed_tokens.weight)] == {Exterior.EMBEDDING}
    gpt2 = make_gpt2(head=True)  # tied: one tensor, both roles
    assert exterior_parameters(gpt2)[id(gpt2.transformer.wte.weight)] == {Exterior.EMBEDDING, Exterior.HEAD}
    book = GPTModel(SMALL)  # the book's out_head, tok_emb and pos_emb
    roles = exterior_parameters(book)
    assert roles[id(book.out_head.weight)] == {Exterior.HEAD} and roles[id(book.pos_emb.weight)] == {Exterior.EMBEDDING}
    nano = NanoGPT()  # logits = x @ wte.weight.T
    assert exterior_parameters(nano)[id(nano.wte.weight)] == {Exterior.EMBEDDING, Exterior.HEAD}
    hidden = {id(p) for p in book.trf_blocks.parameters()}
    assert not hidden & set(exterior_parameters(book))


def _watched(path, model, optimizer, loss_at=lambda model, step: model(*nano_batch(step))[1], steps=6,
             after_step=lambda step, loss: None) -> list[dict]:
    """`steps` steps of a loop under a Watch recording every 5: `loss_at(model, step)`, backward, watch.step, the
    optimizer's step, zero_grad, then `after_step(step, loss)`; the timeline."""
    with Watch(model, path, every=5, optimizer=optimizer, overwrite=True) as watch:
        for step in range(steps):
            loss = loss_at(model, step)
            loss.backward()
            watch.step(loss)
            optimizer.step()
            optimizer.zero_grad()
            after_step(step, loss)
    return read_timeline(path)


def _scheduled(path, make_scheduler, step_scheduler, steps=6) -> list[dict]:
    """A nanoGPT loop whose scheduler the Watch is not given: it finds the ones driving its optimizer."""
    torch.manual_seed(0)
    model = NanoGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = make_scheduler(optimizer)
    return _watched(path, model, optimizer, steps=steps,
                    after_step=lambda step, loss: step_scheduler(scheduler, step, loss))


def _one_cycle(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=100)


def test_a_scheduler_stepped_with_the_loss_is_evaluated_at_a_value_not_a_step(tmp_path):
    """Seen in the eighth blind group (F03, calibration now): OneCycleLR.step(loss.item()), the call
    ReduceLROnPlateau needs, sets the schedule's step count to the loss (pytorch/pytorch#2849)."""
    with pytest.warns(UserWarning):  # torch's own deprecation warning for step(epoch)
        records = _scheduled(tmp_path / "bad.jsonl", _one_cycle, lambda s, step, loss: s.step(loss.item()))
    found = [f for f in records[1]["flags"] if f["name"] == "scheduler_stepped_with_a_value"]
    assert found and found[0]["level"] == "error" and found[0]["cause"] == "learning_rate"
    assert "OneCycleLR" in found[0]["detail"]
    assert records[1]["loop"]["schedulers"][0]["last_epoch"] != int(records[1]["loop"]["schedulers"][0]["last_epoch"])
    assert records[1]["diagnosis"][0]["cause"] == "learning_rate"


@pytest.mark.parametrize("name, make, step, sought", [
    ("one-cycle stepped each step", _one_cycle, lambda s, step, loss: s.step(), True),
    ("warm restarts at fractional epochs", lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=2),
     lambda s, step, loss: s.step(step / 4), True),  # torch's docs: scheduler.step(epoch + i / iters)
    # ReduceLROnPlateau takes the loss by definition and leaves no initial_lr in the groups: it is not sought
    ("plateau stepped with the loss", lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o),
     lambda s, step, loss: s.step(loss.item()), False),
])
def test_schedulers_stepped_as_their_definitions_say_pass(tmp_path, name, make, step, sought):
    records = _scheduled(tmp_path / "good.jsonl", make, step)
    assert bool(records[1]["loop"].get("schedulers")) == sought  # found without being handed to the Watch
    assert not [f for r in records for f in r["flags"] if f["name"] == "scheduler_stepped_with_a_value"]


def _flagged(records: list[dict], name: str) -> list[dict]:
    return [f for r in records for f in r["flags"] if f["name"] == name]


def test_a_schedule_whose_warmup_is_longer_than_the_schedule_has_its_lengths_swapped(tmp_path):
    """shirley-wu/cross-doc-misinfo-detection#1: get_cosine_schedule_with_warmup(optimizer, 160, 10), the two lengths
    by position in the wrong order — the warm-up spans the run and the decay never starts. Found at the first record
    from the schedule function's own keywords (the Watch is not given the scheduler); the same lengths in order pass."""
    from transformers import get_cosine_schedule_with_warmup

    records = _scheduled(tmp_path / "bad.jsonl", lambda o: get_cosine_schedule_with_warmup(o, 160, 10),
                         lambda s, step, loss: s.step())
    schedule = records[0]["loop"]["schedulers"][0]["schedule"]
    assert (schedule["warmup"], schedule["end"]) == (160, 10)  # the keywords the call gave
    assert schedule["function"] == "get_cosine_schedule_with_warmup"
    found = _flagged(records[:1], "warmup_beyond_schedule")
    assert found and found[0]["level"] == "error" and found[0]["cause"] == "learning_rate"
    assert records[0]["diagnosis"][0]["cause"] == "learning_rate"
    good = _scheduled(tmp_path / "good.jsonl", lambda o: get_cosine_schedule_with_warmup(o, 10, 160),
                      lambda s, step, loss: s.step())
    assert not _flagged(good, "warmup_beyond_schedule")


@pytest.mark.parametrize("warmup, found", [(0.1, True), (0.06, True), (0, False), (1, False), (15.5, False)])
def test_a_warmup_below_one_step_is_a_ratio_given_as_a_count(tmp_path, warmup, found):
    """transformers #6673 / PR #10229: warmup_ratio is TrainingArguments' own argument; num_warmup_steps=0.1 makes
    the factor step / max(1, 0.1): 0 at step 0, the full rate from step 1. No warm-up (0), one step, and a count
    computed as a float (0.1 × 155 = 15.5) are warm-ups of whole or computed steps and pass."""
    from transformers import get_linear_schedule_with_warmup

    records = _scheduled(tmp_path / "run.jsonl", lambda o: get_linear_schedule_with_warmup(o, warmup, 160),
                         lambda s, step, loss: s.step())
    flagged = _flagged(records, "warmup_given_as_ratio")
    assert bool(flagged) == found
    if found:
        assert flagged[0]["level"] == "error" and flagged[0]["cause"] == "warmup"
        assert records[0]["diagnosis"][0]["cause"] == "warmup"


def _wsd(optimizer, floor):
    from transformers import get_wsd_schedule

    return get_wsd_schedule(optimizer, 0, num_decay_steps=1, num_stable_steps=1, min_lr_ratio=floor)


@pytest.mark.parametrize("name, make, found", [
    ("linear: 0 past its end", lambda o: __import__("transformers").get_linear_schedule_with_warmup(o, 0, 2), True),
    ("cosine: climbs back past its end",
     lambda o: __import__("transformers").get_cosine_schedule_with_warmup(o, 0, 2), True),
    ("WSD with no floor: 0 past its end", lambda o: _wsd(o, 0.0), True),
    ("WSD keeps its floor of 0.1 past its end", lambda o: _wsd(o, 0.1), False),
    ("polynomial decay keeps lr_end past its end",
     lambda o: __import__("transformers").get_polynomial_decay_schedule_with_warmup(o, 0, 2, lr_end=1e-5), False),
    ("linear within its end", lambda o: __import__("transformers").get_linear_schedule_with_warmup(o, 0, 100), False),
    ("a lambda of the user's own is never called", lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.0),
     False),
    ("torch's cosine annealing climbs back past T_max", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 2),
     True),
    ("torch's cosine annealing within T_max", lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 100), False),
    ("torch's polynomial decay is 0 past total_iters",
     lambda o: torch.optim.lr_scheduler.PolynomialLR(o, total_iters=2), True),
    ("torch's linear factor is held past total_iters by design",
     lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=2), False),
])
def test_a_run_past_its_schedules_end_at_a_rate_of_zero_or_climbing_back_is_found(tmp_path, name, make, found):
    """A schedule of 2 steps in a run of 6 (num_training_steps or T_max counted per epoch, say): at the record of
    step 5 the linear schedule gives 0 and the cosine one has wrapped round to 0.5 (HF's formula: ½(1 + cos(π·2.5)));
    torch's cosine annealing is back at ½(1 + cos(π·5/2)) of its base rate and its polynomial decay at 0. Schedules
    that keep a floor above 0 past their end pass, and so do a schedule within its end, torch's LinearLR holding its
    end factor, and a LambdaLR of the user's own (not evaluated: only transformers' pure schedule functions are)."""
    records = _scheduled(tmp_path / "run.jsonl", make, lambda s, step, loss: s.step())
    flagged = _flagged(records, "schedule_past_its_end")
    assert bool(flagged) == found
    if found:
        assert flagged[0]["level"] == "error" and flagged[0]["cause"] == "learning_rate"
        assert records[1]["loop"]["schedulers"][0]["last_epoch"] == 5
    if "user's own" in name:
        assert "schedule" not in records[1]["loop"]["schedulers"][0]


def test_a_loop_without_a_scheduler_never_walks_the_garbage_collector(tmp_path, monkeypatch):
    """The referrer walk costs one pass over every object Python tracks (~25 ms with transformers imported, more in
    a large process): it is taken only once a torch scheduler has marked the groups (`initial_lr`)."""
    import gc

    from blocktrace.training.schedulers import SEARCHES

    walks = []
    monkeypatch.setattr(gc, "get_referrers", lambda *objects: walks.append(objects) or [])
    _scheduled(tmp_path / "plain.jsonl", lambda optimizer: None, lambda s, step, loss: None, steps=11)
    assert walks == []
    _scheduled(tmp_path / "scheduled.jsonl", _one_cycle, lambda s, step, loss: s.step(), steps=11)
    assert len(walks) == SEARCHES  # the patched walk finds nothing: it is tried at the first SEARCHES records


@pytest.mark.parametrize("eps, tiny", [(1e-8, False), (10.0, True)])
def test_radam_first_steps_are_not_adam_steps(tmp_path, eps, tiny):
    """RAdam (Liu et al. 2020) takes lr·m̂ — no division by √v̂ — while ρ_t ≤ 5 (its steps 1–5 at β2 0.999), so its
    first interval moves weights far less than Adam's lr per weight: a healthy RAdam with decoupled decay was called
    updates_tiny at step 5. Once rectified it is Adam's step, and an ε of 10 that shrinks it is still found."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=128))
    optimizer = torch.optim.RAdam(model.parameters(), lr=1e-3, eps=eps, weight_decay=0.1, decoupled_weight_decay=True)
    records = _hf_trained(tmp_path / "run.jsonl", model, optimizer, steps=11, every=5)
    found = {r["step"] for r in records for f in r["flags"] if f["name"] == "updates_tiny"}
    assert found == ({10} if tiny else set())


class _RezeroedSGD(torch.optim.Optimizer):
    """SGD with (Nesterov) momentum written by hand with torch.optim.SGD's rule, whose buffer is created anew at
    every step when `rezero` (kozistr/pytorch_optimizer PR #516's SignSGD: the state set up without checking that it
    exists): each update is then (1 + μ)·g, plain SGD."""

    def __init__(self, params, lr, momentum=0.9, nesterov=True, rezero=True):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))
        self.rezero = rezero

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if self.rezero or "buf" not in state:
                    state["buf"] = torch.zeros_like(p)
                buf = state["buf"].mul_(group["momentum"]).add_(p.grad)
                p.add_(p.grad.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf, alpha=-group["lr"])


def _unexplained(records: list[dict]) -> list:
    return [(r["loop"]["update_unexplained"] or [None])[0] for r in records]


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.5, dampening=0.5),
    lambda ps: _RezeroedSGD(ps, lr=0.05, rezero=False),
    lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9),
], ids=["sgd", "nesterov-decay", "dampening", "hand-written", "rmsprop"])
def test_a_momentum_that_carries_earlier_gradients_passes(tmp_path, make):
    """A momentum's update holds earlier gradients: far from any a·g + b·w (measured from the second record on;
    the first step's update is the gradient's alone, by definition, and is not judged)."""
    records = _train(tmp_path / "run.jsonl", make, steps=21)
    shares = _unexplained(records)
    # the record at step 5 holds the step after step 0's: the optimizer's first, not judged
    assert shares[:2] == [None, None] and all(share > 0.05 for share in shares[2:]), shares
    assert not [f for r in records for f in r["flags"] if f["name"] == "momentum_not_carried"]


def test_a_momentum_made_anew_at_every_step_is_the_optimizer(tmp_path):
    """Seen in the eleventh blind group (F03, calibration): a hand-written Nesterov SGD whose buffer is zeros at
    every step — each update (1 + μ)·g. Found at the second record after the first step; SGD without momentum and
    Adam are not judged."""
    records = _train(tmp_path / "run.jsonl", lambda ps: _RezeroedSGD(ps, lr=0.05), steps=21)
    shares = _unexplained(records)
    assert shares[:2] == [None, None] and all(share < 1e-3 for share in shares[2:]), shares
    found = [(r["step"], f) for r in records for f in r["flags"] if f["name"] == "momentum_not_carried"]
    # the records at 10 and 15 hold the steps after those at 5 and 10: the first two judged
    assert [step for step, _ in found] == [15, 20] and found[0][1]["level"] == "error"
    assert "momentum 0.9" in found[0][1]["detail"] and "at steps 5, 10" in found[0][1]["detail"]
    assert records[3]["diagnosis"][0]["cause"] == "optimizer"
    plain = _train(tmp_path / "plain.jsonl", lambda ps: torch.optim.SGD(ps, lr=0.05), steps=11)
    assert all(r["loop"]["update_unexplained"] in (None, [None]) for r in plain)


@pytest.mark.parametrize("make", [
    lambda ps: torch.optim.AdamW(ps, lr=1e-3), lambda ps: torch.optim.Adam(ps, lr=3e-3, betas=(0.9, 0.95)),
    lambda ps: torch.optim.RAdam(ps, lr=1e-3), lambda ps: torch.optim.NAdam(ps, lr=1e-3),
    lambda ps: _HandAdam(ps, lr=1e-3), lambda ps: _HandLion(ps, lr=1e-4),
], ids=["adamw", "adam-0.95", "radam", "nadam", "hand-adam", "lion"])
def test_first_moments_that_average_their_gradients_pass(tmp_path, make):
    """An exponential average of gradients is never larger than the largest of them: well under the limit."""
    records = _train(tmp_path / "run.jsonl", make, steps=21)
    ratios = [r["loop"]["first_moment_ratio"] for r in records[2:]]
    assert all(ratio is not None and ratio < 10 for ratio in ratios), ratios
    assert not [f for r in records for f in r["flags"] if f["name"] == "first_moment_outgrew_gradients"]


def test_a_lion_updated_in_place_on_its_state_is_the_optimizer(tmp_path):
    """Seen in the eleventh blind group (F07, calibration): Lion's update computed in place on its first moment and
    signed there — the state becomes ±1, tens to hundreds of times the gradients it should average, and every step repeats
    the first one's direction. Found at the second record whose step had state before it."""
    records = _train(tmp_path / "run.jsonl", lambda ps: _HandLion(ps, lr=1e-4, in_place=True), steps=21)
    assert all(r["loop"]["first_moment_ratio"] >= 10 for r in records[2:])
    found = [(r["step"], f) for r in records for f in r["flags"] if f["name"] == "first_moment_outgrew_gradients"]
    assert [step for step, _ in found] == [15, 20] and found[0][1]["level"] == "error"
    assert records[3]["diagnosis"][0]["cause"] == "optimizer"


class _HandADOPT(torch.optim.Optimizer):
    """ADOPT (Taniguchi et al. 2024; iShohei220/adopt): m averages g/max(√v, ε) clamped to ±t^¼ — normalised
    gradients of size ~1, whatever the gradients' own."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.9999), eps=1e-6):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in (p for p in group["params"] if p.grad is not None):
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=p.grad.square())
                    continue
                state["step"] += 1
                normed = (p.grad / state["exp_avg_sq"].sqrt().clamp_min(group["eps"])).clamp(
                    -state["step"] ** 0.25, state["step"] ** 0.25)
                state["exp_avg"].lerp_(normed, 1 - b1)
                p.add_(state["exp_avg"], alpha=-group["lr"])
                state["exp_avg_sq"].mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)


def test_an_optimizer_that_averages_normalised_gradients_is_not_judged_by_their_size(tmp_path):
    """blind12's first score (H3, a false alarm): ADOPT's exp_avg averages g/√v, hundreds of times the gradients'
    size by definition; the rule holds for Adam's family and Lion only."""
    records = _train(tmp_path / "run.jsonl", lambda ps: _HandADOPT(ps), steps=21)
    # above any average of raw gradients (Adam's stay at 0.4-0.6 here), growing: 215x in blind12's H3
    assert all(r["loop"]["first_moment_ratio"] > 2 for r in records[2:])
    assert not [f for r in records for f in r["flags"] if f["name"] == "first_moment_outgrew_gradients"]


def _frozen_flags(records: list[dict]) -> list[list[dict]]:
    return [[f for f in r["flags"] if f["name"] == "frozen_matrix_zero"] for r in records]


def test_a_position_embedding_zeroed_and_frozen_is_a_component_switched_off(tmp_path):
    """failures3's gpt2-6l-wpe-frozen-zero (calibration: an outside run already seen): GPT-2's wpe zeroed and
    requires_grad=False leaves no position signal but the causal mask, for the whole run; the loss never shows it.
    A frozen tensor keeps its values, and a table of zeros adds nothing: the Watch says so at every record."""
    torch.manual_seed(0)
    model = make_gpt2(head=True).train()
    with torch.no_grad():
        model.transformer.wpe.weight.zero_()
    model.transformer.wpe.weight.requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    records = _hf_trained(tmp_path / "run.jsonl", model, optimizer, steps=4, every=2)
    flags = _frozen_flags(records)
    assert all(len(found) == 1 and found[0]["level"] == "error" for found in flags), flags
    assert "transformer.wpe.weight is exactly 0 and requires no gradient" in flags[0][0]["detail"]
    assert records[0]["diagnosis"][0]["cause"] == "architecture"
    assert records[1]["loop"]["frozen_zero"] == ["transformer.wpe.weight"]  # read back through the schema


class _LoRA(torch.nn.Module):
    """Hu et al. 2021: a frozen GPT-2 Conv1D (weight [in, out]) plus x·A·B, A random and B zero-initialised, both
    trained."""

    def __init__(self, base, rank: int = 4):
        super().__init__()
        self.base = base
        self.a = torch.nn.Parameter(torch.randn(base.weight.shape[0], rank) * 0.01)
        self.b = torch.nn.Parameter(torch.zeros(rank, base.weight.shape[1]))

    def forward(self, x):
        return self.base(x) + x @ self.a @ self.b


def test_frozen_pretrained_matrices_zero_initialised_trained_ones_and_frozen_zero_biases_pass(tmp_path):
    """The published recipes beside it: a LoRA-style fine-tune (the base frozen with its nonzero weights, the
    adapter's B zero-initialised and trained), and a frozen bias of zeros (a vector: a shift of 0, not a module
    switched off)."""
    torch.manual_seed(0)
    model = make_gpt2(head=True)
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        model.transformer.h[0].attn.c_attn.bias.zero_()
    mlp = model.transformer.h[0].mlp
    mlp.c_proj = _LoRA(mlp.c_proj)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    records = _hf_trained(tmp_path / "run.jsonl", model, optimizer, steps=4, every=2)
    assert _frozen_flags(records) == [[], []]
    assert not [f for r in records for f in r["flags"] if f["level"] in ("error", "warning")]
    assert records[0]["loop"]["frozen_zero"] == []


def test_after_the_first_record_only_the_frozen_matrices_found_at_zero_are_read_again():
    """A large frozen base model is read once: the matrices found nonzero at the first record cannot move but by a
    write outside the optimizer, so only those at 0 are read again."""
    from blocktrace.training.model_facts import FrozenAtZero

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    for p in model.parameters():
        p.requires_grad_(False)
    with torch.no_grad():
        model[1].weight.zero_()
    frozen = FrozenAtZero()
    first = frozen.evidence(model)
    assert first["names"] == ["0.weight", "1.weight"]  # the biases are vectors: not read
    assert frozen.settle({"names": first["names"], "zero": first["zero"].tolist()}) == ["1.weight"]
    assert frozen.evidence(model)["names"] == ["1.weight"]


NEXT_TOKEN = {"target_match": {"same": 0.01, "next": 1.0, "previous": 0.0}}  # nanoGPT's targets: the next ids
CLASSES = {"target_match": {"same": 0.0, "next": 0.0, "previous": 0.0}}  # a classifier's: no relation to the ids


def _lr_record(step: int, rates: list, loss: float = math.log(256), optimizer: str = "AdamW",
               data: dict = NEXT_TOKEN) -> dict:
    return {"step": step, "layers": [], "loss": loss, "vocab": 256, "optimizer": optimizer, "lr": rates[0],
            "loop": {"lr_groups": rates}, "data": data}


def _below_pretraining(records: list[dict]) -> list:
    return [f for f in judge(records[:-1], records[-1]) if f.name == "learning_rate_below_pretraining"]


def test_adam_from_scratch_at_a_fine_tuning_learning_rate_is_the_learning_rate(tmp_path):
    """failures2's gpt2-lr-1e-6 (calibration: an outside run already seen, caught late by updates_tiny at step 280):
    AdamW at 1e-6 from initialisation. The smallest published pre-training peak is GPT-3 175B's 6e-5, and Adam moves
    each weight by about lr per step, so the model barely leaves its initialisation. Said at the second record, the
    first whose learning rate is seen not to rise."""
    records = _train(tmp_path / "run.jsonl", lambda ps: torch.optim.AdamW(ps, lr=1e-6), steps=11)
    found = [[f for f in r["flags"] if f["name"] == "learning_rate_below_pretraining"] for r in records]
    assert [len(f) for f in found] == [0, 1, 1]
    assert found[1][0]["level"] == "error" and "no higher than 1e-06" in found[1][0]["detail"]
    assert records[1]["diagnosis"][0]["cause"] == "learning_rate"


@pytest.mark.parametrize("case", ["warm-up", "fine-tune", "sgd", "peak passed", "pre-training rate", "classifier"])
def test_a_warm_up_a_fine_tune_sgd_and_a_decayed_schedule_are_not_judged(case):
    """The recipes beside it: a warm-up from 0 (its rates rise record after record), a fine-tune of a trained model
    at 1e-6 (RLHF's and DPO's rates; its first loss far below log V), SGD (whose learning rate means otherwise), a
    cosine schedule decayed below 1e-5 after a peak of 6e-4, a pre-training rate, and a classifier fine-tuned with
    a new head at 1e-5 (RoBERTa-large's rate; its first loss near log C, its targets no shift of its inputs)."""
    records = {
        "warm-up": [_lr_record(0, [0.0]), _lr_record(10, [1e-6]), _lr_record(20, [2e-6])],
        "fine-tune": [_lr_record(0, [1e-6], loss=2.1), _lr_record(10, [1e-6], loss=2.0)],
        "sgd": [_lr_record(0, [1e-6], optimizer="SGD"), _lr_record(10, [1e-6], optimizer="SGD")],
        "peak passed": [_lr_record(0, [6e-4]), _lr_record(10, [5e-6]), _lr_record(20, [1e-6])],
        "pre-training rate": [_lr_record(0, [3e-4, 3e-4]), _lr_record(10, [3e-4, 3e-4])],
        "classifier": [_lr_record(0, [1e-5], data=CLASSES), _lr_record(10, [1e-5], data=CLASSES)],
    }[case]
    assert _below_pretraining(records) == []
    if case == "warm-up":  # once the warm-up ends below the floor, it is judged
        assert _below_pretraining([*records, _lr_record(30, [2e-6])])


def _optimizer_named(name: str, **defaults) -> torch.optim.Optimizer:
    """An optimizer of another library, as the audit sees it: its class name and its param groups' settings."""
    kind = type(name, (torch.optim.Optimizer,), {"step": lambda self, closure=None: None})
    return kind(_parameters(), defaults)


@pytest.mark.parametrize("name, settings", [("ADOPT", {"betas": (0.9999, 0.9)}), ("Lion", {"betas": (0.999, 0.99)}),
                                            ("SGD", {"momentum": 0.999})])
def test_a_first_moment_rate_spanning_a_thousand_steps_is_the_optimizer(name, settings):
    """A moving average at rate β spans 1/(1 − β) steps; published first rates stay at or below 0.99. blind12's F05
    (ADOPT with its betas swapped, (0.9999, 0.9)) lies outside Adam's family, where β1 < √β2 is not the rule.
    Calibration: written after blind12's score."""
    optimizer = _optimizer_named(name, lr=1e-3, **settings) if name != "SGD" else \
        torch.optim.SGD(_parameters(), lr=0.1, **settings)
    found = _audited(optimizer)["moment_rates_invalid"]
    assert found.level is Level.ERROR and "spans" in found.detail and "steps" in found.detail


@pytest.mark.parametrize("name, settings", [
    ("Adan", {"betas": (0.98, 0.92, 0.99)}), ("SophiaG", {"betas": (0.965, 0.99)}),
    ("AdEMAMix", {"betas": (0.9, 0.999, 0.9999)}), ("Lion", {"betas": (0.95, 0.98)}), ("ADOPT", {"betas": (0.9, 0.9999)})])
def test_published_first_moment_rates_pass(name, settings):
    assert "moment_rates_invalid" not in _audited(_optimizer_named(name, lr=1e-3, **settings))


def test_a_schedule_decayed_long_after_its_peak_is_not_judged_when_the_peak_left_the_window():
    """A Watch keeps the first record and the last few (diagnose/history.History), and the largest learning rate over
    every record: a cosine schedule decayed below 1e-5 for more records than the window holds, after a peak of 6e-4
    the window no longer shows, is not a pre-training rate too small."""
    from blocktrace.diagnose.history import HISTORY, History

    history = History()
    history.add(_lr_record(0, [0.0]))
    history.add(_lr_record(10, [6e-4]))  # the peak
    for step in range(20, 20 + 10 * (HISTORY + 2), 10):
        history.add(_lr_record(step, [5e-6]))
    assert all(record["lr"] < 1e-5 for record in history)  # the peak is out of the window
    assert [f for f in judge(history, _lr_record(1000, [4e-6])) if f.name == "learning_rate_below_pretraining"] == []


def _unfrozen(path, unfreeze) -> list[dict]:
    """A nanoGPT frozen whole (requires_grad_(False)), then `unfreeze(model)`; AdamW over the parameters that require
    a gradient, as fine-tuning recipes build it (the embedding always among them)."""
    torch.manual_seed(0)
    model = NanoGPT()
    model.requires_grad_(False)
    model.wte.requires_grad_(True)
    unfreeze(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return _watched(path, model, optimizer)


def _set_attribute(module, value: bool) -> None:
    module.requires_grad = value  # the bug: a plain attribute, not nn.Module.requires_grad_()


@pytest.mark.parametrize("name, unfreeze, found", [
    ("an attribute set to unfreeze", lambda m: _set_attribute(m.h[1], True), True),
    ("an attribute set to freeze a training module", lambda m: (m.h[0].requires_grad_(True),
                                                                _set_attribute(m.h[0], False)), True),
    ("the method", lambda m: m.h[1].requires_grad_(True), False),
    ("an attribute that agrees with the parameters", lambda m: (m.h[1].requires_grad_(True),
                                                               _set_attribute(m.h[1], True)), False),
])
def test_requires_grad_set_as_a_modules_attribute_changes_no_parameter(tmp_path, name, unfreeze, found):
    """Seen in the fourteenth blind group (F05, calibration now): `layer.requires_grad = True` to unfreeze a layer
    sets a plain attribute on the nn.Module — torch reads requires_grad on each parameter, which
    nn.Module.requires_grad_() sets — so the layer stays frozen (and out of an optimizer built from the parameters
    that require a gradient). A module's attribute that its parameters contradict is the finding; one they agree
    with, and the method itself, pass."""
    records = _unfrozen(tmp_path / "run.jsonl", unfreeze)
    flagged = _flagged(records[:1], "requires_grad_attribute_ignored")
    assert bool(flagged) == found, name
    if found:
        assert flagged[0]["level"] == "error" and flagged[0]["cause"] == "gradient_flow"
        assert "h." in flagged[0]["detail"]
        assert records[0]["diagnosis"][0]["cause"] == "gradient_flow"


def _first_records(path, prepare, hf: bool = False) -> list[dict]:
    """Two records of a model whose weights `prepare(model)` sets before the loop: a nanoGPT (its head tied to wte
    by nanoGPT's own `x @ wte.weight.T`), or an HF Llama with an untied head."""
    torch.manual_seed(0)
    if hf:
        from transformers import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig(vocab_size=61, hidden_size=32, num_hidden_layers=2,
                                             num_attention_heads=4, intermediate_size=64, tie_word_embeddings=False))
    else:
        model = NanoGPT()
    with torch.no_grad():
        prepare(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if not hf:
        return _watched(path, model, optimizer)
    return _watched(path, model, optimizer, lambda model, step: model(input_ids=nano_batch(step)[0],
                                                                      labels=nano_batch(step)[0]).loss)


@pytest.mark.parametrize("name, hf, prepare, found", [
    ("the tied table zeroed through its head", False, lambda m: m.wte.weight.zero_(), True),
    ("nanoGPT as it is", False, lambda m: None, False),
    ("an untied output head zeroed (muP's zero readout)", True, lambda m: m.lm_head.weight.zero_(), False),
    ("an HF token embedding zeroed", True, lambda m: m.model.embed_tokens.weight.zero_(), True),
])
def test_a_token_embedding_of_zeros_at_the_start_is_the_initialisation(tmp_path, name, hf, prepare, found):
    """Seen in the fifteenth blind group (F04, calibration now): a head zeroed in place of a tied embedding zeroes the
    token embedding with it — every token enters the model as the same vector, only positions tell them apart. A
    zero readout (Yang et al. 2021, μP's zero-initialised output layer) is published; a zero input table is not."""
    records = _first_records(tmp_path / "run.jsonl", prepare, hf)
    flagged = _flagged(records[:1], "token_embedding_zero")
    assert bool(flagged) == found, name
    if found:
        assert flagged[0]["level"] == "error" and flagged[0]["cause"] == "initialisation"
        assert records[0]["diagnosis"][0]["cause"] == "initialisation"
    assert not _flagged(records[1:], "token_embedding_zero")  # read once, at the first record


def _autocast_loop(path, whole_loop: bool, autocast: bool = True) -> tuple[list[dict], dict]:
    """A nanoGPT loop under bfloat16 autocast on the CPU: one context around the whole loop (autocast's cast cache
    then lives across optimizer steps), or one per step around forward, loss, backward and the Watch's step (the
    optimizer's step outside it), or none. Returns the timeline and, from the whole-loop context, what the first
    Linear computed at the last step and what its step-0 and current weights compute in a fresh context."""
    torch.manual_seed(0)
    model = NanoGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    linear, x = model.h[0].attn.c_attn, torch.randn(4, 16)
    start, seen = (linear.weight.detach().clone(), linear.bias.detach().clone()), {}
    context = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast)  # noqa: E731
    with Watch(model, path, every=5, optimizer=optimizer, overwrite=True) as watch, \
            context() if whole_loop else contextlib.nullcontext():
        for step in range(6):
            with contextlib.nullcontext() if whole_loop else context():
                ids, targets = nano_batch(step)
                loss = model(ids, targets)[1]
                loss.backward()
                watch.step(loss)
                if whole_loop and step == 5:
                    seen["served"] = linear(x).float()
            optimizer.step()
            optimizer.zero_grad()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        seen["step_0"] = torch.nn.functional.linear(x, *start).float()
        seen["now"] = linear(x).float()
    return read_timeline(path), seen


def test_an_autocast_held_across_optimizer_steps_serves_the_first_steps_casts(tmp_path):
    """Seen in the fifteenth blind group (F05, calibration now): one torch.autocast around the whole training loop.
    Autocast caches each weight's cast until its outermost context exits, so the forward keeps computing with the
    bfloat16 weights of the step the context opened at — shown here without blocktrace: the Linear's output under
    that context is its step-0 weights' (the weights have moved). Found at the first record after a step (5), not
    at 0, where the cache is still fresh."""
    records, seen = _autocast_loop(tmp_path / "whole.jsonl", whole_loop=True)
    assert torch.equal(seen["served"], seen["step_0"]) and not torch.equal(seen["served"], seen["now"])
    assert not _flagged(records[:1], "autocast_casts_stale")
    flagged = _flagged(records[1:], "autocast_casts_stale")
    assert flagged and flagged[0]["level"] == "error" and flagged[0]["cause"] == "precision"
    assert "h.0.attn.c_attn.weight" in flagged[0]["detail"]
    assert records[1]["loop"]["autocast_stale"]["share"] > 0.5
    assert records[1]["diagnosis"][0]["cause"] == "precision"


@pytest.mark.parametrize("autocast", [True, False])
def test_an_autocast_opened_for_each_step_serves_fresh_casts(tmp_path, autocast):
    """PyTorch's AMP recipe: autocast around each step's forward and loss (here also the backward and the Watch's
    step), the optimizer's step outside it — every cast fresh; and a loop without autocast."""
    records, _ = _autocast_loop(tmp_path / "per_step.jsonl", whole_loop=False, autocast=autocast)
    assert not _flagged(records, "autocast_casts_stale")
    stale = [r["loop"].get("autocast_stale") for r in records]
    assert all((s is None) != autocast and (s is None or s["share"] == 0) for s in stale)


class _HandAdamW(torch.optim.Optimizer):
    """A hand-written AdamW whose second moment is `update(v, g, beta2)` (in place), its denominator `denom(v, t)`."""

    def __init__(self, params, update, denom, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.update, self.denom = update, denom

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
                state["step"] += 1
                m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                self.update(v, p.grad, beta2)
                denom = self.denom(v, t, beta2, group["eps"])
                p.addcdiv_(m, denom, value=-group["lr"] / (1 - beta1 ** t))


def _ema(v, g, beta2):
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)


def _out_of_place(v, t, beta2, eps):
    return (v / (1 - beta2 ** t)).sqrt() + eps


SECOND_MOMENT_FAULTS = [
    # blind15's F08: the denominator built in place overwrites v with sqrt(v̂) + ε at every step
    ("the denominator built in place", _ema,
     lambda v, t, beta2, eps: v.sqrt_().div_(math.sqrt(1 - beta2 ** t)).add_(eps)),
    ("g averaged instead of g²", lambda v, g, beta2: v.mul_(beta2).add_(g, alpha=1 - beta2),
     lambda v, t, beta2, eps: (v.abs() / (1 - beta2 ** t)).sqrt() + eps),
]


@pytest.mark.parametrize("name, update, denom", SECOND_MOMENT_FAULTS, ids=[f[0] for f in SECOND_MOMENT_FAULTS])
def test_a_second_moment_that_is_no_average_of_squared_gradients_is_the_optimizer(tmp_path, name, update, denom):
    """Seen in the fifteenth blind group (F08, calibration now): Adam's v is β2·v + (1 − β2)·g², between its last
    value and the new square whatever β2 (from 0 at the first step); a hand-written one that leaves that range is not
    Adam. The step after the first record is measured, and reported at the next record."""
    torch.manual_seed(0)
    model = NanoGPT()
    records = _watched(tmp_path / "run.jsonl", model, _HandAdamW(model.parameters(), update, denom))
    assert not _flagged(records[:1], "second_moment_not_an_average")  # no optimizer step measured yet
    flagged = _flagged(records[1:], "second_moment_not_an_average")
    assert flagged and flagged[0]["level"] == "error" and flagged[0]["cause"] == "optimizer", name
    assert records[1]["loop"]["second_moment_outside"]["judged"] >= 100


SECOND_MOMENT_HEALTHY = [
    ("AdamW", lambda ps: torch.optim.AdamW(ps, lr=1e-3)),
    ("Adam with an L2 decay (g + λw averaged)", lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.5)),
    ("AMSGrad", lambda ps: torch.optim.AdamW(ps, lr=1e-3, amsgrad=True)),
    ("NAdam", lambda ps: torch.optim.NAdam(ps, lr=1e-3)),
    ("RAdam, decoupled", lambda ps: torch.optim.RAdam(ps, lr=1e-3, decoupled_weight_decay=True, weight_decay=0.1)),
    ("Adam β2 0.5", lambda ps: torch.optim.Adam(ps, lr=1e-3, betas=(0.0, 0.5))),
    ("Adam β2 0 (RMS of the last gradient)", lambda ps: torch.optim.Adam(ps, lr=1e-3, betas=(0.0, 0.0))),
    ("maximize", lambda ps: torch.optim.Adam(ps, lr=1e-4, maximize=True)),
    ("the hand-written AdamW as written", lambda ps: _HandAdamW(ps, _ema, _out_of_place)),
    ("Adagrad (its sum has another name)", lambda ps: torch.optim.Adagrad(ps, lr=1e-2)),
    ("HF Adafactor (factored matrices; its vectors' exp_avg_sq averages g² + ε1)", lambda ps: _adafactor(ps)),
]


def _adafactor(parameters):
    from transformers.optimization import Adafactor

    return Adafactor(parameters, lr=1e-3, relative_step=False, scale_parameter=False)


@pytest.mark.parametrize("name, make", SECOND_MOMENT_HEALTHY, ids=[h[0] for h in SECOND_MOMENT_HEALTHY])
def test_the_second_moments_of_published_adams_are_averages(tmp_path, name, make):
    """The optimizer steps after the records at 0 (the state made from 0) and at 5 are measured."""
    torch.manual_seed(0)
    model = NanoGPT()
    records = _watched(tmp_path / "run.jsonl", model, make(model.parameters()), steps=11)
    assert not _flagged(records, "second_moment_not_an_average"), name
    judged = [(r["loop"].get("second_moment_outside") or {}).get("judged") for r in records[1:]]
    assert all(judged) or "Adagrad" in name, judged  # (Adagrad keeps no exp_avg_sq: nothing judged)


def test_bfloat16_adam_state_stays_within_its_averages(tmp_path):
    """Pure bfloat16 training (the parameters, so torch's Adam state, in bfloat16): the state's rounding is inside
    the factor of two."""
    torch.manual_seed(0)
    model = NanoGPT().to(torch.bfloat16)
    records = _watched(tmp_path / "run.jsonl", model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    outside = records[1]["loop"]["second_moment_outside"]
    assert outside["judged"] >= 100 and outside["share"] < 0.01


def test_the_share_outside_the_averages_against_a_naive_count():
    """StepSample's share against a count element by element: a parameter of 10 000 elements (sampled with a stride
    of 2), its v set to chosen values after the step."""
    from blocktrace.training.stepping import StepSample

    torch.manual_seed(0)
    parameter = torch.nn.Parameter(torch.randn(100, 100))
    parameter.grad = torch.randn(100, 100)
    optimizer = torch.optim.SGD([parameter], lr=0.1)  # its groups; the state is written by hand
    v_before = torch.rand(100, 100)
    optimizer.state[parameter] = {"exp_avg_sq": v_before.clone()}
    sample = StepSample(optimizer, first_step=False)
    after = v_before * torch.where(torch.rand(100, 100) < 0.3, 5.0, 1.0)  # 30% pushed up 5×
    after.view(-1)[7] = -1.0  # negative: below every average
    optimizer.state[parameter]["exp_avg_sq"] = after
    flat_v, flat_g, flat_after = v_before.view(-1), parameter.grad.view(-1), after.view(-1)
    outside = judged = 0
    for i in range(0, 10000, 2):
        low, high = min(flat_v[i].item(), flat_g[i].item() ** 2), max(flat_v[i].item(), flat_g[i].item() ** 2)
        judged += 1
        outside += flat_after[i].item() > 2 * high or flat_after[i].item() < low / 2
    measured = sample.second_moment_outside()
    assert int(measured["judged"]) == judged
    assert float(measured["share"]) == pytest.approx(outside / judged, abs=1e-12)
