"""Health checks: each deliberately broken piece gets the right flag at the right step."""

import ast
import itertools
import re
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from blocktrace.config import BlockConfig
from blocktrace.diagnose.grad import GradientReport
from blocktrace.diagnose.checks import CHECKS
from blocktrace.diagnose.health import evaluate
from blocktrace.model.block import build_block
from blocktrace.tracing.tracer import trace

PACKAGE = Path(__file__).resolve().parents[1] / "blocktrace"

X = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))


def flags_of(block, x=X):
    return [(f.name, f.level, f.step) for f in evaluate([trace(block, x, checks=True)])]


@pytest.mark.parametrize("norm, ffn, placement", list(itertools.product(
    ["layernorm", "rmsnorm"], ["gelu", "gelu_tanh", "relu", "swiglu"], ["pre", "post", "deepnorm"])))
def test_a_healthy_block_at_initialisation_has_no_error_flag(norm, ffn, placement):
    for seed in range(3):
        flags = flags_of(build_block(BlockConfig(norm=norm, ffn=ffn, placement=placement), seed=seed))
        assert [f for f in flags if f[1] == "error"] == [], flags


def _broken(config=None, **changes):
    return build_block(config or BlockConfig())


def test_residual_not_added():
    block = build_block(BlockConfig())
    block.residual1.forward = lambda stream, update: update
    assert ("residual_not_added", "error", "residual1") in flags_of(block)


def test_layernorm_replaced_by_identity():
    block = build_block(BlockConfig())
    block.norm1 = nn.Identity()
    assert ("norm_not_normalising", "error", "norm1") in flags_of(block)
    assert not any(f[0] == "norm_not_normalising" and f[2] == "norm2" for f in flags_of(block))


def test_attention_logits_scaled_by_1e4():
    block = build_block(BlockConfig())
    block.attn.scale *= 1e4
    flags = flags_of(block)
    assert ("attention_logit_growth", "error", "attn") in flags
    # every head sharp with huge logits: a collapse of the layer (issue 12: an error, not a warning per head)
    assert ("attention_entropy_collapse", "error", "attn") in flags


def test_nan_introduced_in_the_ffn_is_found_at_its_origin():
    block = build_block(BlockConfig())
    with torch.no_grad():
        block.ffn.fc.weight[0, 0] = float("nan")
    traced = trace(block, X, checks=True)
    found = [f for f in evaluate([traced]) if f.name == "non_finite"]
    assert [(f.step, f.level) for f in found] == [("ffn", "error")]  # residual2's NaN is a consequence
    assert "inputs finite: [True]" in found[0].detail


def test_relu_with_a_bias_of_minus_ten_kills_the_units():
    block = build_block(BlockConfig(ffn="relu"))
    with torch.no_grad():
        block.ffn.fc.bias.fill_(-10.0)
    many_tokens = torch.randn(4, 32, 16, generator=torch.Generator().manual_seed(0))  # ≥ 64: dead, not unlucky
    flags = flags_of(block, many_tokens)
    assert ("ffn_dead_units", "error", "ffn") in flags
    assert not any(f[0] == "ffn_dead_units" for f in flags_of(block))  # 16 tokens are too few to tell


def test_causal_leak_when_the_mask_is_skipped():
    block = build_block(BlockConfig())
    block.attn.causal = False  # the config still says causal
    assert ("causal_leak", "error", "attn") in flags_of(block)


def test_a_zeroed_sublayer_is_too_small_an_update():
    block = build_block(BlockConfig())
    with torch.no_grad():
        block.attn.out_proj.weight.zero_()
        block.attn.out_proj.bias.zero_()
    assert ("update_too_small", "info", "residual1") in flags_of(block)  # context, not a verdict (issue 12)


def test_massive_activation_in_the_stream():
    x = X.clone()
    x[0, 3, 5] = 1e5
    assert ("massive_activation", "info", "residual1") in flags_of(build_block(BlockConfig()), x)  # normal in LLMs


def test_extreme_norm_gain():
    block = build_block(BlockConfig())
    with torch.no_grad():
        block.norm2.weight.fill_(0.01)
    assert ("norm_gain_extreme", "info", "norm2") in flags_of(block)  # trained models have such gains


def test_gradient_flags_from_step_gradient_norms():
    def _gradient_flags(report):
        return evaluate([], gradients=report)

    report = GradientReport(loss=1.0, batches=1,
                            step_norms=[{"attn": 1e-5, "ffn": 3e-5}, {"attn": 1.0, "ffn": 2.0}], weight_norms=[])
    flags = [(f.name, f.layer, f.level.value) for f in _gradient_flags(report)]
    assert flags == [("gradient_vanishing", 0, "error")]  # one finding for the one ratio, an error (issue 12)
    growing = GradientReport(1.0, 1, [{"attn": 1.0, "ffn": 2.0}, {"attn": 1e-5, "ffn": 3e-5}], [])
    assert [f.name for f in _gradient_flags(growing)] == ["gradient_exploding"]
    nan = GradientReport(1.0, 1, [{"attn": float("nan")}], [])
    assert [(f.name, f.level) for f in _gradient_flags(nan)] == [("gradient_exploding", "error")]


def test_every_flag_threshold_and_source_is_in_the_docs():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "check.md").read_text(encoding="utf-8")
    for check in CHECKS.values():
        assert f"`{check.name}`" in readme, check.name
        assert check.threshold.replace("|", "\\|") in readme, check.name
        assert check.source in readme, check.name


@pytest.fixture
def user_blocks(tmp_path, monkeypatch):
    """A module of the user's own blocks, importable from the working directory."""
    (tmp_path / "userblocks_health.py").write_text(textwrap.dedent('''
        import torch
        from torch import nn

        class Block(nn.Module):
            def __init__(self, d=16, forget_residual=False, logit_scale=1.0):
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.attn = nn.Linear(d, d)
                self.ffn = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                self.forget_residual = forget_residual

            def forward(self, x):
                x = x + self.attn(self.ln1(x))
                update = self.ffn(self.ln2(x))
                return update if self.forget_residual else x + update

        def healthy():
            torch.manual_seed(0)
            return Block()

        def broken():
            torch.manual_seed(0)
            return Block(forget_residual=True)

        def large_logits():  # one head's logits past 100: a warning, not an error
            from blocktrace.config import BlockConfig
            from blocktrace.model.block import build_block

            block = build_block(BlockConfig())
            with torch.no_grad():
                block.attn.q_proj.weight[:4] *= 20
                block.attn.k_proj.weight[:4] *= 20
            return block
    '''))
    monkeypatch.chdir(tmp_path)


def test_check_exits_1_on_an_error_and_0_when_healthy(invoke, user_blocks):
    broken = invoke("check", "--module", "userblocks_health:broken")
    assert broken.exit_code == 1
    row = next(line for line in broken.stdout.splitlines() if line.startswith("ERROR"))
    assert row.split()[:5] == ["ERROR", "residual_not_added", "residual", "-", "residual2"]
    assert "most likely: residual" in broken.stdout and "advice:" in broken.stdout
    healthy = invoke("check", "--module", "userblocks_health:healthy")
    assert healthy.exit_code == 0 and "no findings at warning or error level" in healthy.stdout
    assert invoke("run", "--check", "--module", "userblocks_health:broken").exit_code == 1


def test_fail_on_warning(invoke, user_blocks):
    assert invoke("check", "--module", "userblocks_health:large_logits").exit_code == 0
    result = invoke("check", "--module", "userblocks_health:large_logits", "--fail-on", "warning")
    assert result.exit_code == 1 and "WARNING  attention_logit_growth" in result.stdout


def test_flags_column_and_json(invoke, user_blocks):
    import json

    text = invoke("run", "--module", "userblocks_health:broken").stdout
    row = next(line for line in text.splitlines() if re.match(r"\s*6\s+residual2", line))
    assert row.rstrip().endswith("residual_not_added")
    report = json.loads(invoke("run", "--module", "userblocks_health:broken", "--json").stdout)
    assert report["steps"][-1]["flags"] == ["residual_not_added"]
    assert report["flags"][0]["source"].startswith("definition of the residual connection")


@pytest.mark.parametrize("spec, code, message", [
    ("userblocks_health", 2, "--module takes package.module:factory"),
    ("userblocks_health:missing", 2, "userblocks_health has no callable 'missing'"),
    ("no_such_module_here:f", 2, "importing no_such_module_here failed: ModuleNotFoundError"),
])
def test_module_errors(invoke, user_blocks, spec, code, message):
    result = invoke("run", "--module", spec)
    assert result.exit_code == code and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_stack_table_shows_each_layers_flags(invoke):
    import json

    text = invoke("run", "--layers", "3", "--seq-len", "8", "--init", "xiong").stdout
    report = json.loads(invoke("run", "--layers", "3", "--seq-len", "8", "--init", "xiong", "--json").stdout)
    fired = {(f["layer"], f["name"]) for f in report["flags"]}
    assert fired, "xiong init zeroes W_Q and W_K: attention is uniform in every layer"
    header = next(line for line in text.splitlines() if line.startswith("layer"))
    assert header.rstrip().endswith("flags")
    for layer, name in fired:
        row = next(line for line in text.splitlines() if line.split() and line.split()[0] == str(layer))
        assert name in row


def test_a_check_is_one_entry_its_function_is_asked_in_its_scope():
    """Adding a check is one decorated function in diagnose/health.py (its docs row is generated), its name written
    once: evaluate asks it, its findings carry its entry's name, cause and threshold, and the diagnosis reads it like
    any other."""
    from blocktrace.diagnose.checks import Cause, Scope, check, finding
    from blocktrace.vocab import Level

    @check(Scope.STEP, "test_only_wide_output", "any step wider than 3", "this test", "a test's check", Cause.DATA)
    def _wide(record, layer, evidence):
        return [finding(Level.WARNING, record.name, layer, record.shape[-1], "wide")] \
            if record.shape[-1] > 3 else []

    try:
        flags = evaluate([trace(build_block(BlockConfig(d_model=4, n_heads=2)), torch.randn(3, 4), checks=True)])
        found = [f for f in flags if f.name == "test_only_wide_output"]
        assert [f.step for f in found] == ["norm1", "attn", "residual1", "norm2", "ffn", "residual2"]
        assert found[0].cause is Cause.DATA and found[0].to_dict()["threshold"] == "any step wider than 3"
    finally:
        del CHECKS["test_only_wide_output"]


def test_a_check_over_training_is_one_entry_too():
    """dynamics.judge asks every Scope.TRAINING entry: a check over records is its one decorated function."""
    from blocktrace.diagnose.checks import Cause, Scope, check, finding
    from blocktrace.diagnose.dynamics import judge
    from blocktrace.vocab import Level

    @check(Scope.TRAINING, "test_only_loss_rose", "the loss above the record before's", "this test", "a test's check",
           Cause.LEARNING_RATE)
    def _rose(history, entry):
        return [finding(Level.WARNING, None, None, entry["loss"], "rose")] \
            if history and entry["loss"] > history[-1]["loss"] else []

    try:
        record = {"step": 0, "loss": 2.0, "layers": []}
        assert "test_only_loss_rose" not in [f.name for f in judge([], record)]
        later = {"step": 5, "loss": 3.0, "layers": []}
        assert [f.name for f in judge([record], later) if f.name == "test_only_loss_rose"] == ["test_only_loss_rose"]
    finally:
        del CHECKS["test_only_loss_rose"]


class _DroppedBlock(torch.nn.Module):
    """nanoGPT's block with dropout 0.1 on each sub-layer's output before the add (Vaswani et al. 2017's residual
    dropout), or on the residual sum itself (the stream dropped with its update)."""

    def __init__(self, d: int, heads: int, on_stream: bool):
        super().__init__()
        from helpers import NanoAttention

        self.ln_1, self.attn, self.ln_2 = torch.nn.LayerNorm(d), NanoAttention(d, heads), torch.nn.LayerNorm(d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.drop, self.on_stream = torch.nn.Dropout(0.1), on_stream

    def forward(self, x):
        if self.on_stream:
            x = self.drop(x + self.attn(self.ln_1(x)))
            return self.drop(x + self.mlp(self.ln_2(x)))
        x = x + self.drop(self.attn(self.ln_1(x)))
        return x + self.drop(self.mlp(self.ln_2(x)))


def _residual_not_added(tmp_path, blocks: list, training: bool) -> set:
    """The layers residual_not_added names at one recorded step of nanoGPT with these blocks, in training or eval
    mode."""
    from helpers import NanoGPT, nano_batch

    from blocktrace import Watch
    from blocktrace.training.timeline import read_timeline

    torch.manual_seed(0)
    model = NanoGPT()
    model.h = torch.nn.ModuleList(blocks)
    model.train(training)
    with Watch(model, tmp_path / "run.jsonl", every=1, overwrite=True) as watch:
        ids, targets = nano_batch(0)
        _, loss = model(ids, targets)
        loss.backward()
        watch.step(loss)
    return {f["layer"] for f in read_timeline(tmp_path / "run.jsonl")[0]["flags"] if f["name"] == "residual_not_added"}


@pytest.mark.parametrize("on_stream", [False, True])
def test_residual_dropout_in_training_is_a_residual_a_dropped_stream_is_not(tmp_path, on_stream):
    """The sixth blind group's first score: a healthy run with dropout 0.1 on each sub-layer's output before the add
    (a published recipe) was called residual_not_added at step 0 — in training the add holds as
    x + D⊙f(x)/(1 − p), not x + f(x). That identity, dropout's own arithmetic, passes; dropout of the sum (the
    stream dropped with its update) is still no residual."""
    torch.manual_seed(0)
    flagged = _residual_not_added(tmp_path, [_DroppedBlock(16, 2, on_stream) for _ in range(2)], training=True)
    assert flagged == ({0, 1} if on_stream else set())


class _FunctionalDropoutBlock(_DroppedBlock):
    """F.dropout left at its default training=True: it drops in eval too (a common bug, PyTorch's functional
    dropout does not read the module's mode)."""

    def forward(self, x):
        x = x + torch.nn.functional.dropout(self.attn(self.ln_1(x)), 0.1)
        return x + torch.nn.functional.dropout(self.mlp(self.ln_2(x)), 0.1)


@pytest.mark.parametrize("functional", [False, True])
def test_in_eval_the_residual_is_not_fitted_to_dropout(tmp_path, functional):
    """In eval mode dropout is the identity (torch's contract), so the residual add must hold as x + f(x): a block
    that still drops there (F.dropout's default training=True) is no residual; the module's dropout passes."""
    torch.manual_seed(0)
    kind = _FunctionalDropoutBlock if functional else _DroppedBlock
    flagged = _residual_not_added(tmp_path, [kind(16, 2, False) for _ in range(2)], training=False)
    assert flagged == ({0, 1} if functional else set())


@pytest.mark.parametrize("earlier, flagged", [(None, True), (80.0, True), (100.0, False), (130.0, False)])
def test_a_large_attention_logit_is_judged_while_it_grows(earlier, flagged):
    """blind12's H3 and failures2's llama-sgd-healthy, healthy runs, held a layer's largest logit flat at 101-126 for
    dozens of records (sharp heads the model learned) and were called attention_logit_growth and
    attention_entropy_collapse; every failing run those checks caught had its logit grow by 20% or more between
    records there (FAILURES.md). So in a Watch, where the record before gives the same layer's logit, a logit past
    100 is judged while it grows (at least 1.2× the record before's); alone (a checkpoint, a first record) as
    before; past 1e4 always."""
    block = build_block(BlockConfig())
    block.attn.scale *= 300  # largest logits past 100, below 1e4
    traced = trace(block, X, checks=True)
    logit = traced.attention.max_logit
    assert 100 < logit < 1e4, logit
    traced.attention.earlier_max_logit = None if earlier is None else earlier * logit / 100
    names = {f.name for f in evaluate([traced])}
    assert ("attention_logit_growth" in names) == flagged
    if not flagged:
        assert "attention_entropy_collapse" not in names  # a settled logit's sharp heads: no collapse either
    traced.attention.max_logit = 2e4
    assert "attention_logit_growth" in {f.name for f in evaluate([traced])}  # past 1e4: an error, grown or not


def _module_constants() -> dict:
    """Every upper-case module-level number of blocktrace (NAME = v and NAME, OTHER = v, w)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            target = node.targets[0]
            pairs = zip(target.elts, value) if isinstance(target, ast.Tuple) and isinstance(value, tuple) else \
                [(target, value)]
            found.update({name.id: v for name, v in pairs if isinstance(name, ast.Name) and name.id.isupper()
                          and isinstance(v, (int, float)) and not isinstance(v, bool) and v not in (0, 1)})
    return found


def _declared_checks():
    """(name, the literal text of its threshold, the decorated function) of every @check of the package."""
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        functions = {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in functions.values():
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and getattr(decorator.func, "id", "") == "check" and \
                        len(decorator.args) > 2:
                    literal = " ".join(part.value for part in ast.walk(decorator.args[2])
                                       if isinstance(part, ast.Constant) and isinstance(part.value, str))
                    yield decorator.args[1].value, literal, node, functions


def _names_read(function, functions, depth=2) -> set:
    """The names a check's function reads, and those of the module's functions it calls (two levels down)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Name):
            names.add(node.id)
            if depth and node.id in functions and functions[node.id] is not function:
                names |= _names_read(functions[node.id], functions, depth - 1)
    return names


def test_a_checks_threshold_text_is_made_from_the_constants_it_reads():
    """A threshold is written once: the prose of every check formats the constants its code compares against, so
    the two cannot drift apart (issue 43). A number of a constant the check reads, standing in the threshold's
    literal text, is that constant written a second time."""
    constants = _module_constants()
    written_twice = []
    for name, literal, function, functions in _declared_checks():
        for constant in _names_read(function, functions) & constants.keys():
            value = constants[constant]
            for text in {f"{value:g}", str(value)}:
                if re.search(r"(?<![\w.])" + re.escape(text) + r"(?!\w)", literal):
                    written_twice.append((name, constant, text))
    assert not written_twice
    assert len(list(_declared_checks())) > 100  # every check was read


def _zeroed_checkpoint(tmp_path, step: int, suffixes: tuple) -> Path:
    """sample_weights/gpt2-tiny saved as `step_<step>` with the matrices whose names end so set to 0 in every layer."""
    import shutil

    from safetensors.torch import load_file, save_file

    from helpers import SAMPLES

    target = tmp_path / f"step_{step}"
    shutil.copytree(SAMPLES / "gpt2-tiny", target)
    tensors = load_file(target / "model.safetensors")
    for key in tensors:
        if key.endswith(suffixes):
            tensors[key] = torch.zeros_like(tensors[key])
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    return target


def _checked_flags(path) -> dict:
    import json

    from click.testing import CliRunner

    from blocktrace.cli import cli

    result = CliRunner().invoke(cli, ["check", "--weights", str(path), "--token-ids", "1 2 3 4 5 6 7 8", "--json"])
    report = json.loads(result.output)
    return {"flags": {f["name"]: f for f in report["flags"]}, "cause": (report["diagnosis"] or [{}])[0].get("cause")}


@pytest.mark.parametrize("step, zeroed, flagged", [
    (300, ("attn.c_proj.weight", "attn.c_proj.bias"), True),  # failures2's gpt2-broken-attn-o-all
    (0, ("attn.c_proj.weight", "attn.c_proj.bias"), False),  # zero-initialised output projections, at step 0
    (300, ("mlp.c_fc.weight", "mlp.c_proj.weight"), False)])  # a zero saddle: the initialisation's, not this
def test_a_matrix_zero_in_a_trained_checkpoint_was_written_after_training(tmp_path, step, zeroed, flagged):
    """The first step on a matrix used as x·Wᵀ moves it off 0 (its gradient δᵀ·x is nonzero), so in a checkpoint
    past step 0 a zero matrix was written after training — unless its saddle partner is 0 too, which gives it no
    gradient. Calibration: written after failures2's gpt2-broken-attn-o-all (every layer's attention output
    projection zeroed in step 300's checkpoint: weight_outlier compares a layer with its siblings, all zero there)."""
    found = _checked_flags(_zeroed_checkpoint(tmp_path, step, zeroed))
    assert ("weights_zero_after_training" in found["flags"]) == flagged
    if flagged:
        assert found["flags"]["weights_zero_after_training"]["level"] == "error"
        assert found["flags"]["weights_zero_after_training"]["detail"] == \
            "attn.out_proj.weight: exactly 0 in a trained checkpoint (step 300)"
        assert found["cause"] == "weights"
