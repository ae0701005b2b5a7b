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
from blocktrace.config import FFNKind, Norm
from blocktrace.errors import BlocktraceError
from blocktrace.text import LANGUAGES

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


# BlockConfig fields as the options that set them, so config errors name what to change.
FIELD_OPTIONS = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff", "eps": "--eps",
                 "norm": "--norm", "ffn": "--ffn", "placement": "--pre-ln/--post-ln"}


def _option_prefix(error: BlocktraceError) -> str:
    option = FIELD_OPTIONS.get(getattr(error, "field", ""))
    return f"Invalid value for '{option}': " if option else ""


@click.group(cls=BlocktraceGroup)
@click.version_option(__version__, prog_name="blocktrace")
def cli():
    """See inside a Transformer block: every sub-step (norm1, attn, residual1, norm2, ffn,
    residual2) traced, with shapes, statistics and attention diagnostics."""


def _choice(enum_cls):
    return click.Choice([member.value for member in enum_cls])


def _explicit_config_fields(ctx: click.Context) -> set[str]:
    """Config fields whose options the user typed (not defaults): these may override a checkpoint."""
    option_fields = {"d_model": "d_model", "heads": "n_heads", "d_ff": "d_ff", "norm": "norm", "ffn": "ffn",
                     "pre_ln": "placement", "causal": "causal", "eps": "eps", "bias": "bias"}
    return {fld for option, fld in option_fields.items()
            if ctx.get_parameter_source(option) is click.core.ParameterSource.COMMANDLINE}


@cli.command(cls=GreedyCommand)
@click.option("--d-model", type=click.IntRange(min=1), default=16, show_default=True, help="Width of the residual stream.")
@click.option("--heads", type=click.IntRange(min=1), default=4, show_default=True, help="Attention heads; must divide --d-model.")
@click.option("--d-ff", type=click.IntRange(min=1), default=None, help="FFN hidden width.  [default: 4 × d-model]")
@click.option("--tokens", "tokens_text", metavar="TOKEN...", help="Input tokens, e.g. --tokens 猫 吃 鱼 (seeded embedding + sinusoidal positions).")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Random input of this many tokens (when no --tokens).  [default: 5]")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Add a batch dimension of this size; without it x is [T, d-model].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of parameters and input: same seed, same numbers.")
@click.option("--norm", type=_choice(Norm), default="layernorm", show_default=True)
@click.option("--ffn", type=_choice(FFNKind), default="gelu_tanh", show_default=True, help="gelu_tanh is GPT-2's.")
@click.option("--pre-ln/--post-ln", "pre_ln", default=True, show_default=True, help="Norm before each sublayer (GPT-2) or after each residual add (original Transformer, BERT).")
@click.option("--causal/--no-causal", default=True, show_default=True, help="Mask future tokens before the softmax.")
@click.option("--eps", type=click.FloatRange(min=0, min_open=True), default=1e-5, show_default=True, help="Norm epsilon.")
@click.option("--bias/--no-bias", default=True, show_default=True, help="Biases on linear layers and LayerNorm.")
@click.option("--weights", type=click.Path(path_type=Path), default=None, help="A GPT-2 safetensors checkpoint: a .safetensors file or a directory with model.safetensors (or a sharded index) and config.json.")
@click.option("--layer", type=click.IntRange(min=0), default=0, show_default=True, help="Which block of --weights to trace.")
@click.option("--token-ids", "token_ids_text", metavar="ID...", help="Token ids fed through the checkpoint's embeddings (and the blocks before --layer).")
@click.option("--text", default=None, help="Text tokenized by the tokenizer.json beside --weights (needs the [text] extra).")
@click.option("--input", "input_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Exact block input: a .safetensors file holding 'x' (or one tensor), [T, d] or [B, T, d].")
@click.option("--dtype", type=click.Choice(["float32", "float64", "float16", "bfloat16"]), default="float32", show_default=True, help="Compute dtype (checkpoints in half precision are upcast unless this says otherwise).")
@click.option("--device", type=click.Choice(["cpu", "cuda", "auto"]), default="cpu", show_default=True, help="Where to run; auto picks cuda when available.")
@click.option("--format", "fmt", type=click.Choice(tabulate_formats), default="simple", show_default=True, help="Table format (any tabulate format).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (schema in README) instead of tables.")
@click.option("--save", "save_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write every step's tensor to this .safetensors file.")
@click.option("--force", is_flag=True, help="Let --save overwrite an existing file.")
@click.option("--values", "n_values", type=click.IntRange(min=1), default=None, help="Show the first N numbers of one token's vector at every step.")
@click.option("--token-index", type=int, default=0, show_default=True, help="Which token --values shows (first sequence of a batch).")
@click.option("--lang", type=click.Choice(LANGUAGES), default="en", show_default=True, help="Headings and explanations in English or Chinese.")
@click.option("--explain", is_flag=True, help="Add one sentence per step on what it does and why.")
@click.pass_context
def run(ctx, d_model, heads, d_ff, tokens_text, seq_len, batch, seed, norm, ffn, pre_ln, causal, eps, bias,
        weights, layer, token_ids_text, text, input_path, dtype, device,
        fmt, as_json, save_path, force, n_values, token_index, lang, explain):
    """Run one block and print the six-step table.

    \b
    Examples:
      blocktrace run --d-model 4 --heads 2 --tokens 猫 吃 鱼
      blocktrace run --weights sample_weights/gpt2-tiny --layer 1 --token-ids 5 17 99
    """
    from blocktrace import runner

    config_fields = dict(d_model=d_model, n_heads=heads, d_ff=d_ff, norm=norm, ffn=ffn,
                         placement="pre" if pre_ln else "post", causal=causal, eps=eps, bias=bias)
    request = runner.RunRequest(config_fields, _explicit_config_fields(ctx), tokens_text, token_ids_text, text,
                                input_path, seq_len, batch, seed, weights, layer, dtype, device)
    if save_path is not None:
        runner.check_output_path(save_path, force)
    prepared = runner.prepare(request)
    n_tokens = prepared.x.shape[-2]
    if n_values is not None and not -n_tokens <= token_index < n_tokens:
        raise click.BadParameter(f"{token_index} is out of range: {n_tokens} tokens, valid 0–{n_tokens - 1}",
                                 param_hint="'--token-index'")
    result = runner.run_block(prepared, seed=seed, keep_tensors=save_path is not None,
                              n_values=n_values, token_index=token_index)
    if save_path is not None:
        runner.save_run(save_path, result)
    if as_json:
        click.echo(json.dumps(result.report, ensure_ascii=False, indent=2))
    else:
        from blocktrace.render import render_run

        click.echo(render_run(result.report, lang=lang, fmt=fmt, explain=explain, token_index=token_index), nl=False)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(tabulate_formats), default="simple", show_default=True, help="Table format (any tabulate format).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of tables.")
def inspect(path, fmt, as_json):
    """Show a checkpoint's layout, config and per-layer tensors (names, shapes, dtypes, norms)."""
    from blocktrace.inspect import inspect_checkpoint, render_inspection

    report = inspect_checkpoint(path)
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False, indent=2))
    else:
        click.echo(render_inspection(report, fmt), nl=False)


def main():
    cli(prog_name="blocktrace")
