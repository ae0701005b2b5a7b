"""`blocktrace track`: a model over training — checkpoints in step order, or a Watch's timeline."""

from __future__ import annotations

from pathlib import Path

import click

from blocktrace.cli.app import cli, prepare_outputs, show
from blocktrace.cli.options import (DEVICE_OPTION, DTYPE_OPTION, FAIL_ON_OPTION, FORMAT_OPTION, HTML_OPTION,
                                    PAGE_LANG_OPTION, IDS_FILE_OPTIONS, DOCUMENT_OPTIONS, QUIET_OPTION, SEED_OPTION,
                                    TEXT_FILE_OPTION, TEXT_OPTION, TOKEN_IDS_OPTION, TOKEN_TYPES_OPTION, IntegerList,
                                    OutputFile, force_option, given, ids_file_fields)
from blocktrace.cli.progress import progress_wanted, shown
from blocktrace.cli.rules import (IDS_FILE_RULES, PAGE_LANG_RULE, Excludes, Needs, beside_documents, enforce,
                                  force_needs, is_set)
from blocktrace.errors import FINDINGS_EXIT
from blocktrace.files import all_or_none
from blocktrace.render.documents import chosen
from blocktrace.request import TIMELINE_SUFFIXES, WEIGHT_SUFFIXES, InputSpec, RunRequest, TrackRequest, is_timeline, \
    may_hold_weights
from blocktrace.vocab import Device, DType, Lang, Level

INPUT_PARAMS = ("token_ids_text", "text", "text_file", "token_ids_file")


def _reads_timeline(ctx: click.Context) -> bool:
    sources = ctx.params.get("sources") or ()
    return len(sources) == 1 and is_timeline(sources[0])


def _checkpoint_only(name: str, what: str) -> Excludes:
    return Excludes(name, _reads_timeline, f"{what} applies to checkpoints; a timeline file holds its records already")


TRACK_RULES = [
    *(_checkpoint_only(name, f"{flag} gives the input of the checkpoints:") for name, flag in
      (("token_ids_text", "--token-ids"), ("token_types_text", "--token-type-ids"), ("text", "--text"),
       ("text_file", "--text-file"), ("token_ids_file", "--token-ids-file"))),
    *IDS_FILE_RULES,
    Needs("seed", is_set("windows"), "--seed fixes where the --windows are drawn: add --windows N"),
    _checkpoint_only("steps", "--steps names the checkpoints' steps:"),
    _checkpoint_only("grad", "--grad computes the checkpoints' gradients:"),
    _checkpoint_only("out", "--out writes the checkpoints' records:"),
    _checkpoint_only("dtype", "--dtype:"),
    _checkpoint_only("device", "--device:"),
    *beside_documents("fmt", "--format shapes the tables"),
    *beside_documents("brief", "--brief shortens the tables", "prints every record whole"),
    force_needs("out", "plot_path", "html_path"),
    PAGE_LANG_RULE,
]


def _sources(ctx: click.Context, sources: tuple[Path, ...]) -> None:
    if not sources:
        raise click.UsageError("give the checkpoints to follow (directories, files or a quoted glob such as "
                               "'run/step_*'), or one timeline file written by Watch (run.jsonl)")
    timelines = [path for path in sources if is_timeline(path)]
    if timelines and len(sources) > 1:
        raise click.UsageError(f"{timelines[0]} is a timeline: track reads one timeline, or checkpoints, not both")
    neither = next((path for path in sources if not timelines and not may_hold_weights(path)), None)
    if neither is not None:
        raise click.UsageError(f"{neither} is neither a timeline (a Watch's {', '.join(TIMELINE_SUFFIXES)} file) nor a "
                               f"checkpoint (a directory, or safetensors or torch.save's file: "
                               f"{', '.join(WEIGHT_SUFFIXES)})")
    if not timelines and not any(given(ctx, name) for name in INPUT_PARAMS):
        raise click.UsageError("checkpoints are compared on one input: give --token-ids, --token-ids-file, --text or "
                               "--text-file")


def _request(params: dict) -> TrackRequest:
    inputs = InputSpec(token_ids=params["token_ids_text"], token_types=params["token_types_text"],
                       text=params["text"], text_file=params["text_file"], **ids_file_fields(params))
    run = RunRequest(config_fields={}, inputs=inputs, dtype=DType(params["dtype"]), device=Device(params["device"]))
    steps = tuple(params["steps"]) if params["steps"] is not None else None
    return TrackRequest(sources=tuple(params["sources"]), run=run, steps=steps, grad=params["grad"],
                        log=params["log_path"], against=params["against"], fail_on=Level(params["fail_on"]))


def _write_outputs(params: dict, report: dict) -> None:
    records, first = report["records"], report["first_sign"]
    if params["out"] is not None:
        _write_records(records, params["out"], params["force"])
    if params["plot_path"] is not None:
        from blocktrace.render.plot import require_pyplot, save_figure, track_figure

        plt = require_pyplot()
        save_figure(plt, track_figure(plt, records, first), params["plot_path"], params["force"])
    if params["html_path"] is not None:
        from blocktrace.render.html import write_html

        write_html(params["html_path"], report, "track", Lang(params["lang"]), params["force"])


def _write_records(records: list[dict], path: Path, force: bool) -> None:
    from blocktrace.files import write_atomically
    from blocktrace.training.timeline import dumps

    keep = [{k: v for k, v in entry.items() if k not in ("new_flags", "log")} for entry in records]
    text = "".join(dumps(entry) + "\n" for entry in keep)
    write_atomically(path, lambda handle: handle.write(text.encode("utf-8")), force)


@cli.command()
@click.argument("sources", nargs=-1, type=click.Path(path_type=Path))
@click.option("--steps", type=IntegerList("training step", 0, "0,100,200"), default=None, help="The training step of each checkpoint, in the order given (a glob expands in name order; default: from trainer_state.json or the name: step_400, checkpoint-400, …).")
@TOKEN_IDS_OPTION
@TOKEN_TYPES_OPTION
@TEXT_OPTION
@TEXT_FILE_OPTION
@IDS_FILE_OPTIONS
@SEED_OPTION
@click.option("--grad", is_flag=True, help="Each checkpoint's gradients of its own loss on the input: a block gradient norm per layer.")
@DTYPE_OPTION
@DEVICE_OPTION
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="A training log of JSON lines with a \"step\" key: its loss, lr and grad_norm beside each row.")
@click.option("--against", type=click.Path(path_type=Path), default=None, help="A healthy run to compare with, step by step: a timeline (when RUN is one), or its checkpoints (a directory of step_* checkpoints or a quoted glob) traced on the same input. Reports where the runs part beyond what a different seed explains; exit 1 when they do.")
@click.option("--out", type=OutputFile(), default=None, help="Write the checkpoints' records as a timeline (JSON lines, the format Watch writes).")
@click.option("--plot", "plot_path", type=OutputFile(), default=None, help="Write a PNG of curves over steps, marking the first sign of trouble (needs the [plot] extra).")
@HTML_OPTION
@PAGE_LANG_OPTION
@force_option("--out / --plot / --html")
@DOCUMENT_OPTIONS
@click.option("--brief", is_flag=True, help="Print only the one-row-per-step table and the first sign of trouble.")
@FORMAT_OPTION
@FAIL_ON_OPTION
@QUIET_OPTION
@click.pass_context
def track(ctx, **params):
    """Follow a model over training: the same input through every checkpoint (directories, files or a
    quoted glob, ordered by step), or the records of a Watch's timeline (run.jsonl). One row per
    step: the loss, each layer's residual rms, largest attention logit and lowest head entropy,
    ‖ΔW‖/‖W‖ against the previous checkpoint by tensor kind, the findings first raised; then the
    first sign of trouble. Exit 1 when a finding reaches --fail-on."""
    from blocktrace.pipeline.track import track_request
    from blocktrace.render.track import render_against, render_track

    enforce(ctx, TRACK_RULES)
    _sources(ctx, params["sources"])
    prepare_outputs(params)
    request = _request(params)
    with shown(progress_wanted(chosen(params) is not None, params["quiet"])):
        report, torn = track_request(request)
    for number in torn:
        click.echo(f"note: line {number} of {params['sources'][0]} is cut short (a run stopped while writing it): "
                   "left out", err=True)
    records, first, comparison = report["records"], report["first_sign"], report.get("against")
    with all_or_none():  # written once every input is read and matched, each or none: an error leaves no file
        _write_outputs(params, report)
    show(report, params, lambda: render_track(
        records, first, report["last_flags"], request.fail_on, "timeline" if request.timeline else "checkpoints",
        params["fmt"], brief=params["brief"], rollback=report["rollback"], thinning=report.get("thinning"))
        + ("" if comparison is None else "\n" + render_against(comparison, params["against"], params["fmt"])))
    parted = comparison is not None and comparison["first_parted"] is not None
    ctx.exit(FINDINGS_EXIT if first is not None or parted else 0)
