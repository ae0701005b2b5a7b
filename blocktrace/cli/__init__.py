"""The `blocktrace` command line: the only module that talks to the user.

Heavy imports (torch, safetensors) happen inside the commands, so that `--help` and
`--version` answer at once.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from tabulate import tabulate_formats

from blocktrace._version import __version__
from blocktrace.config import INITS, FFNKind, Norm, Placement
from blocktrace.errors import BlocktraceError, UsageError
from blocktrace.render.words import LANGUAGES

# Options that take several words: `--tokens 猫 吃 鱼` as well as `--tokens "猫 吃 鱼"`.
GREEDY_OPTIONS = ("--tokens", "--token-ids")


def _is_option_like(arg: str) -> bool:
    if not arg.startswith("-") or arg == "-":
        return False
    try:
        float(arg)  # a negative number is a value, not an option
        return False
    except ValueError:
        return True


def join_greedy_options(args: list[str], greedy=GREEDY_OPTIONS) -> list[str]:
    """Fold the words after a greedy option into one value, up to the next option."""
    joined, i = [], 0
    while i < len(args):
        joined.append(args[i])
        if args[i] in greedy:
            j = i + 1
            while j < len(args) and not _is_option_like(args[j]):
                j += 1
            if j > i + 1:
                joined.append(" ".join(args[i + 1 : j]))
            i = j
        else:
            i += 1
    return joined


class GreedyCommand(click.Command):
    def parse_args(self, ctx, args):
        return super().parse_args(ctx, join_greedy_options(list(args)))


# BlockConfig fields as the options that set them, so config errors name what to change.
FIELD_OPTIONS = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff", "eps": "--eps",
                 "norm": "--norm", "ffn": "--ffn", "placement": "--pre-ln/--post-ln/--deepnorm"}


def _option_prefix(error: BlocktraceError) -> str:
    option = FIELD_OPTIONS.get(getattr(error, "field", ""))
    return f"Invalid value for '{option}': " if option else ""


class BlocktraceGroup(click.Group):
    """Every failure becomes one `Error: ...` line on stderr with the right exit code."""

    def main(self, args=None, prog_name=None, **extra):
        extra["standalone_mode"] = False
        try:
            result = super().main(args=args, prog_name=prog_name, **extra)
        except click.ClickException as error:  # usage errors: exit 2; file errors: exit 1
            click.echo(f"Error: {error.format_message()}", err=True)
            sys.exit(error.exit_code)
        except BlocktraceError as error:
            click.echo(f"Error: {_option_prefix(error)}{error}", err=True)
            sys.exit(error.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(1)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=BlocktraceGroup)
@click.version_option(__version__, prog_name="blocktrace")
def cli():
    """See inside a Transformer block: every sub-step (norm1, attn, residual1, norm2, ffn,
    residual2) traced, with shapes, statistics and attention diagnostics."""


def _choice(enum_cls):
    return click.Choice([member.value for member in enum_cls])


class DepthList(click.ParamType):
    """`--layers 12` (a stack) or `--layers 6,8,10` (a depth sweep, with --grad)."""

    name = "N[,N...]"

    def convert(self, value, param, ctx):
        if isinstance(value, tuple):
            return value
        try:
            depths = tuple(int(part) for part in str(value).split(","))
        except ValueError:
            self.fail(f"{value!r} is not a depth or a comma-separated list of depths, e.g. 12 or 6,8,10", param, ctx)
        if any(depth < 1 for depth in depths):
            self.fail(f"{value!r}: every depth must be at least 1", param, ctx)
        return depths


def _options(*decorators):
    def apply(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return apply


SHARED_OPTIONS = _options(
    click.option("--d-model", type=click.IntRange(min=1), default=16, show_default=True, help="Width of the residual stream."),
    click.option("--heads", type=click.IntRange(min=1), default=4, show_default=True, help="Attention heads; must divide --d-model."),
    click.option("--d-ff", type=click.IntRange(min=1), default=None, help="FFN hidden width.  [default: 4 × d-model]"),
    click.option("--causal/--no-causal", default=True, show_default=True, help="Mask future tokens before the softmax."),
    click.option("--eps", type=click.FloatRange(min=0, min_open=True), default=1e-5, show_default=True, help="Norm epsilon."),
    click.option("--bias/--no-bias", default=True, show_default=True, help="Biases on linear layers and LayerNorm."),
    click.option("--seed", type=int, default=0, show_default=True, help="Seed of parameters and input: same seed, same numbers."),
    click.option("--init", type=click.Choice(INITS), default="default", show_default=True, help="Parameter init: PyTorch's default, Xavier, or Xiong et al. 2020's setting (Xavier, zero biases, W^Q = W^K = 0)."),
    click.option("--tokens", "tokens_text", metavar="TOKEN...", help="Input tokens, e.g. --tokens 猫 吃 鱼 (seeded embedding + sinusoidal positions)."),
    click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Random input of this many tokens (when no --tokens).  [default: 5]"),
    click.option("--batch", type=click.IntRange(min=1), default=None, help="Add a batch dimension of this size; without it x is [T, d-model]."),
    click.option("--weights", type=click.Path(path_type=Path), default=None, help="A GPT-2, BERT or Llama safetensors checkpoint: a .safetensors file or a directory with model.safetensors (or a sharded index) and config.json."),
    click.option("--layer", type=click.IntRange(min=0), default=0, show_default=True, help="Which block of --weights to trace (the first, with --layers)."),
    click.option("--token-ids", "token_ids_text", metavar="ID...", help="Token ids fed through the checkpoint's embeddings (and the blocks before --layer); several sequences separated by / form a padded batch, e.g. 1 2 3 / 4 5."),
    click.option("--text", default=None, help="Text tokenized by the tokenizer.json beside --weights (needs the [text] extra)."),
    click.option("--input", "input_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Exact block input: a .safetensors file holding 'x' (or one tensor), [T, d] or [B, T, d]."),
    click.option("--dtype", type=click.Choice(["float32", "float64", "float16", "bfloat16"]), default="float32", show_default=True, help="Compute dtype (checkpoints in half precision are upcast unless this says otherwise)."),
    click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True, help="Where to run; auto picks cuda when available."),
    click.option("--attn-chunk", type=click.IntRange(min=1), default=None, help="Query rows the attention computes at once, to bound memory on long inputs.  [default: as many as fit 256 MiB of scores]"),
    click.option("--layers", "depths", type=DepthList(), default=None, help="A stack of N blocks (per-layer table), or a list of depths 6,8,10 for a gradient sweep (needs --grad)."),
    click.option("--steps", "show_steps", is_flag=True, help="With --layers: print every block's six steps."),
    click.option("--grad", is_flag=True, help="One backward pass: gradient norms at every step and of every weight matrix (loss in README)."),
    click.option("--batches", type=click.IntRange(min=1), default=1, show_default=True, help="With --grad: average the gradient over this many seeded mini-batches before taking norms."),
    click.option("--format", "fmt", type=click.Choice(tabulate_formats), default="simple", show_default=True, help="Table format (any tabulate format)."),
    click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema in README) instead of tables."),
    click.option("--lang", type=click.Choice(LANGUAGES), default="en", show_default=True, help="Headings and explanations in English or Chinese."),
    click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write a PNG: attention heatmaps, or per-layer curves with --layers (needs the [plot] extra)."),
    click.option("--force", is_flag=True, help="Let --save / --plot overwrite an existing file."),
)

# Config fields by the parameter names click gives them.
OPTION_FIELDS = {"d_model": "d_model", "heads": "n_heads", "d_ff": "d_ff", "norm": "norm", "ffn": "ffn",
                 "placement": "placement", "causal": "causal", "eps": "eps", "bias": "bias"}


def _explicit_fields(ctx: click.Context, names) -> set[str]:
    """Config fields whose options the user typed (not defaults): these may override a checkpoint."""
    return {OPTION_FIELDS[name] for name in names
            if ctx.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE}


def _request(ctx: click.Context, options: dict, **config_fields):
    from blocktrace.sources.source import RunRequest

    fields = dict(d_model=options["d_model"], n_heads=options["heads"], d_ff=options["d_ff"],
                  causal=options["causal"], eps=options["eps"], bias=options["bias"], **config_fields)
    explicit = _explicit_fields(ctx, [n for n in OPTION_FIELDS if n in ctx.params])
    return RunRequest(fields, explicit, options["tokens_text"], options["token_ids_text"], options["text"],
                      options["input_path"], options["seq_len"], options["batch"], options["seed"],
                      options["weights"], options["layer"], options["dtype"], options["device"], options["init"],
                      options["attn_chunk"])


def _analysis(options: dict, **extra):
    from blocktrace.pipeline import Analysis

    depths = options["depths"] or (1,)
    if len(depths) > 1 and not options["grad"]:
        raise click.BadParameter("a list of depths is a gradient sweep: add --grad (or give one depth)",
                                 param_hint="'--layers'")
    if options["plot_path"] is not None:
        from blocktrace.sources.tracefile import check_output_path

        check_output_path(options["plot_path"], options["force"])
    return Analysis(depths=depths, stacked=options["depths"] is not None, grad=options["grad"],
                    batches=options["batches"], **extra)


def _emit(report: dict, options: dict, render) -> None:
    if options["plot_path"] is not None:
        from blocktrace.render.plot import write_plot

        write_plot(report, options["plot_path"])
    if options["as_json"]:
        click.echo(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        click.echo(render(report), nl=False)


RUN_OPTIONS = _options(
    click.option("--norm", type=_choice(Norm), default="layernorm", show_default=True),
    click.option("--ffn", type=_choice(FFNKind), default="gelu_tanh", show_default=True, help="gelu_tanh is GPT-2's."),
    click.option("--pre-ln", "placement", flag_value="pre", default=True, help="Norm before each sublayer (GPT-2, Llama).  [default]"),
    click.option("--post-ln", "placement", flag_value="post", help="Norm after each residual add (original Transformer, BERT)."),
    click.option("--deepnorm", "placement", flag_value="deepnorm", help="Post-LN with the stream scaled by α = (2N)^¼ (Wang et al. 2022)."),
    SHARED_OPTIONS,
    click.option("--save", "save_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write every step's tensor to this .safetensors file (one block)."),
    click.option("--values", "n_values", type=click.IntRange(min=1), default=None, help="Show the first N numbers of one token's vector at every step."),
    click.option("--token-index", type=int, default=0, show_default=True, help="Which token --values shows (first sequence of a batch)."),
    click.option("--explain", is_flag=True, help="Add one sentence per step on what it does and why."),
    click.option("--fail-on", type=click.Choice(["warning", "error"]), default="error", show_default=True, help="With --check: the flag level that makes the exit code 1."),
    click.option("--module", "module_spec", metavar="PKG.MOD:FACTORY", default=None, help="Trace your own block: imports PKG.MOD and calls FACTORY() for an nn.Module. This RUNS YOUR CODE."),
    click.option("--step-names", default=None, metavar="JSON", help='With --module, for a block of unknown layout: its submodules, e.g. \'{"norm1": "ln_1", "attn": "attn", "norm2": "ln_2", "ffn": "mlp"}\'.'),
)


@cli.command(cls=GreedyCommand)
@RUN_OPTIONS
@click.option("--check", "check_only", is_flag=True, help="Print only the health-check findings; exit 1 when one reaches --fail-on.")
@click.pass_context
def run(ctx, check_only, **options):
    """Run one block (or a stack) and print the six-step table.

    \b
    Examples:
      blocktrace run --d-model 4 --heads 2 --tokens 猫 吃 鱼
      blocktrace run --weights sample_weights/gpt2-tiny --layer 1 --token-ids 1 2 3
      blocktrace run --layers 12 --grad
    """
    _run(ctx, check_only, **options)


@cli.command(cls=GreedyCommand)
@RUN_OPTIONS
@click.pass_context
def check(ctx, **options):
    """Run the health checks and print only the findings, with what each means and what people
    usually do about it; exit 1 when a flag reaches --fail-on (to guard a training script or CI).
    Takes the options of `run`."""
    _run(ctx, True, **options)


def _step_names(text):
    if text is None:
        return None
    try:
        names = json.loads(text)
    except ValueError as error:
        raise click.BadParameter(f"not valid JSON ({error})", param_hint="'--step-names'") from None
    if not isinstance(names, dict) or not all(isinstance(v, str) for v in names.values()):
        raise click.BadParameter('give a JSON object of step: submodule path, e.g. {"norm1": "ln_1"}',
                                 param_hint="'--step-names'")
    return names


def _run(ctx, check_only, norm, ffn, placement, save_path, n_values, token_index, explain, fail_on, module_spec,
         step_names, **options):
    from blocktrace import pipeline as commands
    from blocktrace.sources import source as runner
    from blocktrace.render.text import render_findings, render_run

    request = _request(ctx, options, norm=norm, ffn=ffn, placement=placement)
    if save_path is not None:
        if options["depths"] is not None:
            raise click.BadParameter("--save writes one block's steps: drop --layers", param_hint="'--save'")
        runner.check_output_path(save_path, options["force"])
    names = _step_names(step_names)
    if names is not None and module_spec is None:
        raise click.BadParameter("names the steps of a block given with --module", param_hint="'--step-names'")
    analysis = _analysis(options, keep_tensors=save_path is not None, n_values=n_values, token_index=token_index,
                         checks=True, steps=names, placement="post" if placement == "post" else "pre")
    if module_spec is not None:
        for option, given in (("--weights", options["weights"]), ("--layers", options["depths"]), ("--grad", options["grad"])):
            if given:
                raise UsageError(f"{option} works on blocktrace's own blocks, not with --module")
        block = runner.load_user_block(module_spec)
        source = runner.user_block_source(request, block)
        _check_token_index(source, n_values, token_index)
        report, traces = commands.run_user_block(block, source, request, analysis)
    else:
        source = runner.prepare_source(request)
        _check_token_index(source, n_values, token_index)
        report, traces = commands.run_report(source, request, analysis)
    if save_path is not None:
        runner.save_run(save_path, traces[0], source.tokens)
    if check_only:
        from blocktrace.diagnose.health import LEVELS

        _emit(report, options, lambda r: render_findings(r, fail_on))
        levels = [flag["level"] for flag in report.get("flags") or []]
        ctx.exit(1 if any(LEVELS.index(level) >= LEVELS.index(fail_on) for level in levels) else 0)
    _emit(report, options, lambda r: render_run(r, lang=options["lang"], fmt=options["fmt"], explain=explain,
                                                 token_index=token_index, steps=options["show_steps"]))


def _check_token_index(source, n_values, token_index):
    n_tokens = source.x.shape[-2]
    if n_values is not None and not -n_tokens <= token_index < n_tokens:
        raise click.BadParameter(f"{token_index} is out of range: {n_tokens} tokens, valid 0–{n_tokens - 1}",
                                 param_hint="'--token-index'")


@cli.command()
@click.argument("trace_a", type=click.Path(path_type=Path))
@click.argument("trace_b", type=click.Path(path_type=Path))
@click.option("--atol", type=click.FloatRange(min=0), default=1e-5, show_default=True, help="Absolute tolerance.")
@click.option("--rtol", type=click.FloatRange(min=0), default=1e-4, show_default=True, help="Relative tolerance.")
@click.option("--format", "fmt", type=click.Choice(tabulate_formats), default="simple", show_default=True, help="Table format (any tabulate format).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of a table.")
@click.pass_context
def diff(ctx, trace_a, trace_b, atol, rtol, fmt, as_json):
    """Compare two trace files (from --save) step by step: max |Δ|, relative error, cosine
    similarity, and the first step beyond --atol/--rtol; exit 1 when they diverge."""
    from blocktrace.diagnose.diff import diff_traces, render_diff

    report = diff_traces(trace_a, trace_b, atol, rtol)
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_diff(report, fmt), nl=False)
    ctx.exit(1 if report["diverged"] else 0)


AXIS_FLAGS = {
    "placement": [("--pre-ln", "pre"), ("--post-ln", "post"), ("--deepnorm", "deepnorm")],
    "norm": [("--layernorm", "layernorm"), ("--rmsnorm", "rmsnorm")],
    "ffn": [("--gelu", "gelu"), ("--gelu-tanh", "gelu_tanh"), ("--relu", "relu"), ("--swiglu", "swiglu")],
}
_AXIS_DECORATORS = [click.option(flag, f"want_{value}", is_flag=True, help=f"Compare with {value}.")
                    for flags in AXIS_FLAGS.values() for flag, value in flags]


@cli.command(cls=GreedyCommand)
@_options(*_AXIS_DECORATORS)
@click.option("--norm", type=_choice(Norm), default="layernorm", show_default=True, help="The norm of both variants (when the norm is not compared).")
@click.option("--ffn", type=_choice(FFNKind), default="gelu_tanh", show_default=True, help="The FFN of both variants (when the FFN is not compared).")
@click.option("--placement", type=_choice(Placement), default="pre", show_default=True, help="The wiring of both variants (when the wiring is not compared).")
@SHARED_OPTIONS
@click.pass_context
def compare(ctx, norm, ffn, placement, **options):
    """Run two variants of one design axis on the same parameters and the same input.

    \b
    Give two values of one axis:
      --pre-ln --post-ln | --post-ln --deepnorm | --layernorm --rmsnorm |
      two of --gelu --gelu-tanh --relu --swiglu
    Examples:
      blocktrace compare --pre-ln --post-ln
      blocktrace compare --pre-ln --post-ln --layers 12 --init xiong --heads 1 --d-ff 16 --ffn relu
    """
    from blocktrace import pipeline as commands
    from blocktrace.sources import source as runner
    from blocktrace.diagnose.compare import choose_axis
    from blocktrace.render.compare import render_compare

    wanted = {axis: [value for _, value in flags if options.pop(f"want_{value}")] for axis, flags in AXIS_FLAGS.items()}
    axis, values = choose_axis(wanted, {value: flag for flags in AXIS_FLAGS.values() for flag, value in flags})
    fixed = {"placement": placement, "norm": norm, "ffn": ffn}
    if ctx.get_parameter_source(axis) is click.core.ParameterSource.COMMANDLINE:
        raise UsageError(f"--{axis} fixes the axis being compared ({' vs '.join(values)}): drop --{axis}")
    request = _request(ctx, options, **fixed)
    analysis = _analysis(options)
    source = runner.prepare_source(request)
    report = commands.compare_report(source, request, analysis, axis, values)
    _emit(report, options, lambda r: render_compare(r, fmt=options["fmt"], lang=options["lang"],
                                                     steps=options["show_steps"]))


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(tabulate_formats), default="simple", show_default=True, help="Table format (any tabulate format).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
def inspect(path, fmt, as_json):
    """Show a checkpoint's layout, config and per-layer tensors (names, shapes, dtypes, norms)."""
    from blocktrace.sources.inspect import inspect_checkpoint, render_inspection

    report = inspect_checkpoint(path)
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        click.echo(render_inspection(report, fmt), nl=False)


def main():
    cli(prog_name="blocktrace")
