"""`blocktrace compare`: two variants of one design axis on the same parameters and input."""

from __future__ import annotations

import click

from blocktrace.cli.app import cli, prepare_outputs, show
from blocktrace.cli.options import (FORMAT_OPTION, HTML_OPTION, DOCUMENT_OPTIONS, LANG_OPTION, PLOT_OPTION,
                                    SOURCE_OPTIONS, STEPS_OPTION, enum_choice, force_option, given, make_analysis,
                                    make_request, options)
from blocktrace.cli.progress import progress_wanted, shown
from blocktrace.cli.rules import COMPARE_RULES, enforce
from blocktrace.errors import UsageError
from blocktrace.render.documents import chosen
from blocktrace.vocab import QK_NORM_VALUES, Axis, FFNKind, Lang, Norm, Placement
from blocktrace.wiring import WIRINGS

AXIS_FLAGS = {
    Axis.PLACEMENT: [(wiring.flag, placement) for placement, wiring in WIRINGS.items()],
    Axis.NORM: [("--layernorm", Norm.LAYERNORM), ("--rmsnorm", Norm.RMSNORM)],
    Axis.FFN: [("--gelu", FFNKind.GELU), ("--gelu-tanh", FFNKind.GELU_TANH), ("--relu", FFNKind.RELU),
               ("--swiglu", FFNKind.SWIGLU), ("--geglu", FFNKind.GEGLU)],
}
# What each side of a comparison is, for --help (a flag's bare value, "pre", told a reader nothing).
AXIS_HELP = {
    **{placement: wiring.help.replace("  [default]", "") for placement, wiring in WIRINGS.items()},
    Norm.LAYERNORM: "LayerNorm: (x − mean) / √(var + eps) · g + b.",
    Norm.RMSNORM: "RMSNorm: x / √(mean(x²) + eps) · g.",
    FFNKind.GELU: "A GELU FFN (the exact erf form).", FFNKind.GELU_TANH: "A GELU FFN, GPT-2's tanh approximation.",
    FFNKind.RELU: "A ReLU FFN.", FFNKind.SWIGLU: "SwiGLU (Llama): down(silu(gate)·up).",
    FFNKind.GEGLU: "GeGLU (Gemma): down(gelu_tanh(gate)·up).",
}
AXIS_OPTIONS = options(*[click.option(flag, f"want_{value.value}", is_flag=True,
                                      help=f"{AXIS_HELP[value]} (One side of the comparison.)")
                         for flags in AXIS_FLAGS.values() for flag, value in flags],
                       click.option("--qk-norm", "want_qk_norm", is_flag=True,
                                    help="Compare without and with QK-norm (RMSNorm on each head's q and k)."))


def choose_axis(ctx: click.Context, params: dict) -> tuple[Axis, list[str]]:
    """The one axis with exactly two values asked."""
    asked = {axis: [value.value for flag, value in flags if params.pop(f"want_{value.value}")]
             for axis, flags in AXIS_FLAGS.items()}
    if params.pop("want_qk_norm"):
        asked[Axis.QK_NORM] = list(QK_NORM_VALUES)
    asked = {axis: values for axis, values in asked.items() if values}
    everything = [value for values in asked.values() for value in values]
    if len(asked) != 1 or len(everything) != 2:
        spelled = {value.value: flag for flags in AXIS_FLAGS.values() for flag, value in flags}
        spelled.update({value: "--qk-norm" for value in QK_NORM_VALUES})
        shown = " ".join(spelled[v] for v in everything) or "nothing"
        raise UsageError(
            f"compare needs two values of one axis, got {shown}: e.g. --pre-ln --post-ln, --pre-ln --sandwich, "
            "--post-ln --deepnorm, --layernorm --rmsnorm, two of --gelu --gelu-tanh --relu --swiglu --geglu, "
            "or --qk-norm alone (without against with)")
    (axis, values), = asked.items()
    if axis.value in ctx.params and given(ctx, axis.value):
        raise UsageError(f"--{axis.value} fixes the axis being compared ({' vs '.join(values)}): drop --{axis.value}")
    return axis, values


@cli.command()
@AXIS_OPTIONS
@click.option("--norm", type=enum_choice(Norm), default=Norm.LAYERNORM.value, show_default=True, help="The norm of both variants (when the norm is not compared).")
@click.option("--ffn", type=enum_choice(FFNKind), default=FFNKind.GELU_TANH.value, show_default=True, help="The FFN of both variants (when the FFN is not compared).")
@click.option("--placement", type=enum_choice(Placement), default=Placement.PRE.value, show_default=True, help="Where both variants' norms sit (when placement is not the axis compared).")
@SOURCE_OPTIONS
@STEPS_OPTION
@DOCUMENT_OPTIONS
@FORMAT_OPTION
@LANG_OPTION
@click.option("--explain", is_flag=True, help="Add one sentence per step of each variant on what it does, in its own wiring's order.")
@PLOT_OPTION
@HTML_OPTION
@force_option("--plot / --html")
@click.pass_context
def compare(ctx, **params):
    """Run two variants of one design axis on the same parameters and the same input.

    \b
    Give two values of one axis:
      --pre-ln --post-ln | --pre-ln --sandwich | --post-ln --deepnorm |
      --layernorm --rmsnorm | two of --gelu --gelu-tanh --relu --swiglu --geglu |
      --qk-norm (without against with)
    Examples:
      blocktrace compare --pre-ln --post-ln
      blocktrace compare --pre-ln --post-ln --layers 12 --init xiong --heads 1 --d-ff 16 --ffn relu
    """
    from blocktrace import pipeline

    axis, values = choose_axis(ctx, params)
    enforce(ctx, COMPARE_RULES)
    fixed = {"placement": Placement(params["placement"]), "norm": Norm(params["norm"]), "ffn": FFNKind(params["ffn"])}
    request = make_request(ctx, params, **fixed)
    analysis = make_analysis(params)
    prepare_outputs(params)
    with shown(progress_wanted(chosen(params) is not None, params["quiet"])):
        report = pipeline.compare_request(request, analysis, axis, values)
    if params["plot_path"] is not None:
        from blocktrace.render.plot import write_plot

        write_plot(report, params["plot_path"], params["force"])
    if params["html_path"] is not None:
        from blocktrace.render.html import write_html

        write_html(params["html_path"], report, "compare", Lang(params["lang"]), params["force"])
    from blocktrace.render.compare import render_compare

    show(report, params, lambda: render_compare(report, fmt=params["fmt"], lang=Lang(params["lang"]),
                                                steps=params["show_steps"], explain=params["explain"]))
