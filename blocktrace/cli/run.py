"""`blocktrace run` (the six-step table) and `blocktrace check` (only the health findings)."""

from __future__ import annotations

import click

from blocktrace.cli.app import cli, prepare_outputs, show
from blocktrace.cli.options import (AXIS_VALUE_OPTIONS, DISPLAY_OPTIONS, DOCUMENT_OPTIONS, FAIL_ON_OPTION,
                                    FORMAT_OPTION, HTML_OPTION, LANG_OPTION, MODULE_OPTIONS, PAGE_LANG_OPTION,
                                    PLOT_OPTION, SAVE_OPTION, SOURCE_OPTIONS, STEPS_OPTION, chosen_placement,
                                    force_option, make_analysis, make_request)
from blocktrace.cli.progress import progress_wanted, shown
from blocktrace.cli.rules import CHECK_RULES, RUN_RULES, enforce, refuse_beside_model
from blocktrace.errors import FINDINGS_EXIT
from blocktrace.render.documents import chosen
from blocktrace.vocab import FFNKind, Lang, Level, Norm


@cli.command()
@AXIS_VALUE_OPTIONS
@SOURCE_OPTIONS
@STEPS_OPTION
@DOCUMENT_OPTIONS
@FORMAT_OPTION
@LANG_OPTION
@PLOT_OPTION
@HTML_OPTION
@SAVE_OPTION
@force_option("--save / --plot / --html")
@DISPLAY_OPTIONS
@click.option("--check", "check_only", is_flag=True, help="Print only the health-check findings; exit 1 when one reaches --fail-on.")
@FAIL_ON_OPTION
@MODULE_OPTIONS
@click.pass_context
def run(ctx, **params):
    """Run one block (or a stack) and print the six-step table.

    \b
    Examples:
      blocktrace run --d-model 4 --heads 2 --tokens 猫 吃 鱼
      blocktrace run --weights sample_weights/gpt2-tiny --layer 1 --token-ids 1 2 3
      blocktrace run --layers 12 --grad
    """
    _weights_exist(params)
    enforce(ctx, RUN_RULES)
    _run(ctx, params, check_only=params["check_only"])


@cli.command()
@AXIS_VALUE_OPTIONS
@SOURCE_OPTIONS
@DOCUMENT_OPTIONS
@FORMAT_OPTION
@HTML_OPTION
@PAGE_LANG_OPTION
@force_option("--html")
@FAIL_ON_OPTION
@MODULE_OPTIONS
@click.option("--model", "model_spec", metavar="FILE.py:FACTORY", default=None, help="Check your own model on its checkpoint (--weights, read as it is, no key renamed): imports FILE.py (or PKG.MOD) and calls FACTORY (with the model arguments stored in the checkpoint when it takes them), then one forward and backward on the input, judged as a Watch record. This RUNS YOUR CODE.")
@click.pass_context
def check(ctx, **params):
    """Run the health checks and print the findings, a likely cause and advice; exit 1 when a
    finding reaches --fail-on (to guard a training script or CI). With --weights: every layer of
    the checkpoint (--layer / --layers narrow it) and the model's own loss (--grad: its gradients).
    With --model FILE.py:FACTORY --weights: your own model's code on its checkpoint.
    Takes the block, input and checkpoint options of `run`."""
    _weights_exist(params)
    refuse_beside_model(ctx)
    if params["model_spec"]:
        _check_user_model(ctx, params)
        return
    enforce(ctx, CHECK_RULES)
    _run(ctx, params, check_only=True)


def _check_user_model(ctx, params: dict) -> None:
    """`check --model`: one Watch record of the user's model, shown as `track` shows a timeline."""
    from blocktrace.pipeline.user_model import check_user_model
    from blocktrace.render.track import render_track

    request = make_request(ctx, params, norm=Norm(params["norm"]), ffn=FFNKind(params["ffn"]),
                           placement=chosen_placement(ctx), qk_norm=params["qk_norm"])
    fail_on = Level(params["fail_on"])
    with shown(progress_wanted(chosen(params) is not None, params["quiet"])):
        report, notes = check_user_model(params["model_spec"], request, fail_on)
    records = report["records"]
    blocks = (records[0].get("blocks") or {}).get("count", len(records[0]["layers"]))
    header = (f"{params['model_spec']} on {params['weights']}: {records[0].get('model')} with {blocks} blocks, one "
              "forward and backward on the input, judged as a Watch record")
    show(report, params, lambda: render_track(records, report["first_sign"], report["last_flags"], fail_on,
                                              "timeline", params["fmt"], header=header,
                                              trained=False)
         + "".join(f"note: {note}\n" for note in notes))
    ctx.exit(FINDINGS_EXIT if report["first_sign"] is not None else 0)


def _weights_exist(params: dict) -> None:
    """A --weights path that is not there is said first, before any rule about the input it would need."""
    if params.get("weights") is not None:
        from blocktrace.sources.hf_cache import resolve_weights

        resolve_weights(params["weights"])


def _run(ctx, params: dict, check_only: bool) -> None:
    from blocktrace import pipeline

    placement = chosen_placement(ctx)
    request = make_request(ctx, params, norm=Norm(params["norm"]), ffn=FFNKind(params["ffn"]), placement=placement,
                           qk_norm=params["qk_norm"])
    save_path = params.get("save_path")
    analysis = make_analysis(params, keep_tensors=save_path is not None, n_values=params.get("n_values"),
                             token_index=params.get("token_index", 0), checks=True, placement=placement,
                             attention_map=params.get("html_path") is not None)
    prepare_outputs(params)
    with shown(progress_wanted(chosen(params) is not None, params["quiet"])):
        if check_only and request.weights is not None:
            traced = pipeline.check_model_request(request, analysis)
        else:
            traced = pipeline.run_request(request, analysis)
    report = traced.report
    _write_outputs(params, traced)
    if check_only:
        _findings(ctx, report, params)
        return
    from blocktrace.render.text import render_run

    show(report, params, lambda: render_run(report, lang=Lang(params["lang"]), fmt=params["fmt"],
                                                        explain=params["explain"], token_index=params["token_index"],
                                                        steps=params["show_steps"]))


def _write_outputs(params: dict, traced) -> None:
    """Every output or none (files.all_or_none); --plot is drawn before anything is written."""
    from blocktrace.files import all_or_none

    with all_or_none():
        _write_each(params, traced)


def _write_each(params: dict, traced) -> None:
    report = traced.report
    plot_path, save_path = params.get("plot_path"), params.get("save_path")
    plot = None
    if plot_path is not None:
        from blocktrace.render.plot import plot_bytes

        plot = plot_bytes(report, plot_path)
    if save_path is not None:
        from blocktrace.sources.tracefile import save_trace

        save_trace(traced.traces[0], save_path, traced.tokens, force=params["force"])
    if plot is not None:
        from blocktrace.render.plot import write_bytes

        write_bytes(plot_path, plot, params["force"])
    if params.get("html_path") is not None:
        from blocktrace.render.html import write_html

        write_html(params["html_path"], report, "check" if params.get("check_only", True) else "run",
                   Lang(params.get("lang", Lang.EN.value)), params["force"])


def _findings(ctx, report: dict, params: dict) -> None:
    from blocktrace.render.text import render_findings

    fail_on = Level(params["fail_on"])
    show(report, params, lambda: render_findings(report, fail_on, params["fmt"]))
    levels = [Level(flag["level"]) for flag in report.get("flags") or []]
    ctx.exit(FINDINGS_EXIT if any(level.reaches(fail_on) for level in levels) else 0)
