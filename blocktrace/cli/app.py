"""The `blocktrace` command group and its error boundary: the only place that talks to the user.

Every failure ends here as one `Error: …` line on stderr and exit 2 — a bad option, a bad or
missing file, a checkpoint that does not fit, a block that raised — never a traceback (unless
blocktrace itself has a bug). Exit 1 is kept for findings (`check`, `track`, `run --check`). Heavy imports
(torch, safetensors) happen inside the commands, so that `--help` and `--version` answer at
once.
"""

from __future__ import annotations

import os
import sys

import click

from blocktrace._version import __version__
from blocktrace.errors import ERROR_EXIT, BlocktraceError
from blocktrace.render.documents import chosen

# Options that take several words: `--tokens 猫 吃 鱼` as well as `--tokens "猫 吃 鱼"`.
GREEDY_OPTIONS = ("--tokens", "--token-ids", "--token-type-ids")
# BlockConfig fields as the options that set them, so config errors name what to change.
FIELD_OPTIONS = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff", "eps": "--eps",
                 "norm": "--norm", "ffn": "--ffn", "placement": "--pre-ln/--post-ln/--deepnorm/--sandwich"}
CONTEXT = {"help_option_names": ["-h", "--help"]}
# click ≥ 8.2 raises this for a bare `blocktrace`; older versions print the help themselves.
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class StdoutError(BlocktraceError):
    """Standard output cannot be written (a full disk, a closed pipe)."""


def emit(text: str, nl: bool = True) -> None:
    """Write to standard output; a failure to write is one error line, not a traceback."""
    try:
        click.echo(text, nl=nl)
    except OSError as error:
        raise StdoutError(f"cannot write to standard output: {error.strerror or error}") from None


# The output files a command may write: the parameter click gives each and its option.
OUTPUT_FILES = {"save_path": "--save", "out": "--out", "plot_path": "--plot", "html_path": "--html"}


def prepare_outputs(params: dict) -> None:
    """Everything that can fail about the output files fails here, before the computation: two options naming one
    file, --plot without matplotlib, a path that cannot be written or may not be replaced."""
    from blocktrace.files import check_distinct_outputs, check_output_path

    outputs = {flag: params.get(name) for name, flag in OUTPUT_FILES.items()}
    check_distinct_outputs(outputs)
    if params.get("plot_path") is not None:
        from blocktrace.render.plot import require_pyplot

        require_pyplot(params["plot_path"])
    for path in outputs.values():
        if path is not None:
            check_output_path(path, params["force"])


def show(report, params: dict, text) -> None:
    """The one output stage: the report as the document the options chose (render/documents: --json), or the
    tables `text()` renders from it."""
    document = chosen(params)
    if document is not None:
        emit(document.render(report))
    else:
        emit(text(), nl=False)


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


def refuse_repeated(command: click.Command, args: list[str]) -> None:
    """An option that takes one value, given twice, is refused: click would keep the last and drop the first."""
    single = {name: option for option in command.params if isinstance(option, click.Option)
              and not option.multiple and not option.is_flag and option.nargs == 1 for name in option.opts}
    seen: dict = {}
    for arg in args:
        if arg == "--":
            break
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg
        option = single.get(name)
        if option is None:
            continue
        if option.name in seen:
            also = f" (also as {seen[option.name]})" if seen[option.name] != name else ""
            raise click.UsageError(f"{name} is given twice{also}: give it once (only the last would count)")
        seen[option.name] = name


def _print_help(ctx: click.Context, param, value) -> None:
    """--help through `emit`: click's own callback writes past the error boundary (a full disk gave a traceback)."""
    if value and not ctx.resilient_parsing:
        emit(ctx.get_help())
        ctx.exit()


def _print_version(ctx: click.Context, param, value) -> None:
    if value and not ctx.resilient_parsing:
        emit(f"blocktrace, version {__version__}")
        ctx.exit()


class HelpThroughEmit:
    """Mixed into the command classes: their --help is written as every other output is."""

    def get_help_option(self, ctx):
        option = super().get_help_option(ctx)
        if option is not None:
            option.callback = _print_help
        return option


class GreedyCommand(HelpThroughEmit, click.Command):
    """blocktrace's commands: greedy options joined (see join_greedy_options), repeated options refused."""

    def parse_args(self, ctx, args):
        joined = join_greedy_options(list(args))
        refuse_repeated(self, joined)
        return super().parse_args(ctx, joined)


def _option_prefix(error: BlocktraceError) -> str:
    option = FIELD_OPTIONS.get(getattr(error, "field", ""))
    return f"Invalid value for '{option}': " if option else ""


def _flush_stdout() -> None:
    try:
        sys.stdout.flush()
    except OSError as error:
        # Point stdout at /dev/null so the interpreter's own flush at exit does not fail again.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass
        raise StdoutError(f"cannot write to standard output: {error.strerror or error}") from None


class BlocktraceGroup(HelpThroughEmit, click.Group):
    """Every failure becomes one `Error: ...` line on stderr with the right exit code."""

    command_class = GreedyCommand

    def main(self, args=None, prog_name=None, **extra):
        extra["standalone_mode"] = False
        if sys.stdout is None:  # started with its standard output closed (`>&-`): nothing could be reported
            click.echo("Error: standard output is closed: redirect it to a file or to /dev/null", err=True)
            sys.exit(ERROR_EXIT)
        try:
            try:
                result = super().main(args=args, prog_name=prog_name, **extra)
            except NO_ARGS_IS_HELP as error:  # plain `blocktrace`: the help, exit 0
                emit(error.ctx.get_help())
                result = 0
            _flush_stdout()
        except click.ClickException as error:  # usage and file errors alike
            click.echo(f"Error: {error.format_message()}", err=True)
            sys.exit(ERROR_EXIT)
        except BlocktraceError as error:
            click.echo(f"Error: {_option_prefix(error)}{error}", err=True)
            sys.exit(error.exit_code)
        except click.exceptions.Abort:
            click.echo("Error: aborted", err=True)
            sys.exit(ERROR_EXIT)
        sys.exit(result if isinstance(result, int) else 0)


@click.group(cls=BlocktraceGroup, context_settings=CONTEXT)
@click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
              help="Show the version and exit.")
def cli():
    """See inside a Transformer block: every sub-step (norm1, attn, residual1, norm2, ffn,
    residual2) traced, with shapes, statistics and attention diagnostics.

    Exit codes: 0 clean; 1 findings at --fail-on or worse (check, track, run --check) or traces
    that differ (diff); 2 any error (a bad option, a missing or unreadable file, a model that
    does not fit)."""
