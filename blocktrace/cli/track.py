"""`blocktrace track`: a model over training — checkpoints in step order, or a Watch's timeline."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from blocktrace.cli.app import cli, prepare_outputs, show
from blocktrace.cli.options import (
    DEVICE_OPTION,
    DTYPE_OPTION,
    FAIL_ON_OPTION,
    FORMAT_OPTION,
    HTML_OPTION,
    PAGE_LANG_OPTION,
    IDS_FILE_OPTIONS,
    DOCUMENT_OPTIONS,
    QUIET_OPTION,
    SEED_OPTION,
    TEXT_FILE_OPTION,
    TEXT_OPTION,
    TOKEN_IDS_OPTION,
    TOKEN_TYPES_OPTION,
    IntegerList,
    force_option,
    given,
    ids_file_fields,
)
from blocktrace.cli.progress import progress_wanted
from blocktrace.cli.rules import (
    IDS_FILE_RULES,
    PAGE_LANG_RULE,
    Excludes,
    Needs,
    beside_documents,
    enforce,
    force_needs,
    is_set,
)
from blocktrace.errors import FINDINGS_EXIT
from blocktrace.render.documents import chosen
from blocktrace.vocab import SCHEMA_VERSION, Lang, Level, ReportKind

TIMELINE_SUFFIXES = (".jsonl", ".ndjson")
INPUT_PARAMS = ("token_ids_text", "text", "text_file", "token_ids_file")


def _is_timeline(path: Path) -> bool:
    return path.suffix.lower() in TIMELINE_SUFFIXES


def _reads_timeline(ctx: click.Context) -> bool:
    sources = ctx.params.get("sources") or ()
    return len(sources) == 1 and _is_timeline(sources[0])


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
    timelines = [path for path in sources if _is_timeline(path)]
    if timelines and len(sources) > 1:
        raise click.UsageError(f"{timelines[0]} is a timeline: track reads one timeline, or checkpoints, not both")
    if not timelines and not any(given(ctx, name) for name in INPUT_PARAMS):
        raise click.UsageError("checkpoints are compared on one input: give --token-ids, --token-ids-file, --text or "
                               "--text-file")


def _checkpoint_records(params: dict, show_progress: bool) -> list[dict]:
    from blocktrace.request import Analysis, InputSpec, RunRequest
    from blocktrace.pipeline.track import track_checkpoints
    from blocktrace.training.track import expand, order
    from blocktrace.vocab import Device, DType

    points = order(expand(list(params["sources"])), params["steps"])
    inputs = InputSpec(token_ids=params["token_ids_text"], token_types=params["token_types_text"],
                       text=params["text"], text_file=params["text_file"], **ids_file_fields(params))
    request = RunRequest(config_fields={}, inputs=inputs, dtype=DType(params["dtype"]), device=Device(params["device"]))
    records = track_checkpoints(points, request, Analysis(checks=True, grad=params["grad"]))
    if not show_progress:
        return list(records)
    with click.progressbar(records, length=len(points), label="tracking", file=sys.stderr,
                           item_show_func=lambda entry: f"step {entry['step']}" if entry else "") as bar:
        return list(bar)


def _reference_records(params: dict, show_progress: bool) -> list[dict]:
    """The healthy run --against names: a timeline when the run is one, else checkpoints traced on the same input."""
    from blocktrace.errors import InputError
    from blocktrace.training.timeline import read_timeline

    path = params["against"]
    reads_timeline = _is_timeline(params["sources"][0])
    if reads_timeline != _is_timeline(path):
        raise click.UsageError(f"--against {path}: compare like with like — a timeline against a timeline, checkpoints "
                               "against checkpoints (traced on the same input)")
    if reads_timeline:
        return read_timeline(path)
    records = _checkpoint_records({**params, "sources": (path,), "steps": None}, show_progress)
    if not records:
        raise InputError(f"--against {path} holds no checkpoint")
    return records


def _compared(records: list[dict], reference: list[dict], name) -> dict:
    """The run against its reference, refused when they are runs of different models or share no step."""
    from blocktrace.errors import InputError
    from blocktrace.training.against import compare_runs, require_comparable

    require_comparable(records, reference, name)
    comparison = compare_runs(records, reference)
    if not comparison["matched"]:
        raise InputError(f"--against {name}: no step in common with the run (the run's steps "
                         f"{records[0]['step']}–{records[-1]['step']}, the reference's {reference[0]['step']}–"
                         f"{reference[-1]['step']}): record both at the same steps")
    return comparison


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
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write the checkpoints' records as a timeline (JSON lines, the format Watch writes).")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write a PNG of curves over steps, marking the first sign of trouble (needs the [plot] extra).")
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
    from blocktrace.training.timeline import read_timeline
    from blocktrace.training.rollback import rollback_point
    from blocktrace.training.track import attach_log, first_sign, judged, last_sign, mark_new_flags, read_log

    enforce(ctx, TRACK_RULES)
    _sources(ctx, params["sources"])
    prepare_outputs(params)
    log = read_log(params["log_path"]) if params["log_path"] is not None else None
    timeline = _reads_timeline(ctx)
    show_progress = progress_wanted(chosen(params) is not None, params["quiet"])
    torn: list[int] = []
    records = judged(read_timeline(params["sources"][0], torn) if timeline else
                     _checkpoint_records(params, show_progress))
    for number in torn:
        click.echo(f"note: line {number} of {params['sources'][0]} is cut short (a run stopped while writing it): "
                   "left out", err=True)
    reference = _reference_records(params, show_progress) if params["against"] is not None else None
    comparison = _compared(records, reference, params["against"]) if reference is not None else None
    if params["out"] is not None:  # written once every input is read and matched: an error leaves no file
        _write_records(records, params["out"], params["force"])
    mark_new_flags(records)
    if log is not None:
        attach_log(records, log)
    level = Level(params["fail_on"])
    first, last = first_sign(records, level), last_sign(records, level)
    rollback = rollback_point(records, first["step"] if first else None)
    if params["plot_path"] is not None:
        from blocktrace.render.plot import require_pyplot, save_figure, track_figure

        plt = require_pyplot()
        save_figure(plt, track_figure(plt, records, first), params["plot_path"], params["force"])
    from blocktrace.render.track import render_against, render_track

    report = {"schema": SCHEMA_VERSION, "kind": ReportKind.TRACK.value, "records": records, "first_sign": first,
              "last_flags": last, "rollback": rollback,
              **({"against": comparison} if comparison is not None else {})}
    if params["html_path"] is not None:
        from blocktrace.render.html import write_html

        write_html(params["html_path"], report, "track", Lang(params["lang"]), params["force"])
    show(report, params, lambda: render_track(
        records, first, last, level, "timeline" if timeline else "checkpoints", params["fmt"], brief=params["brief"],
        rollback=rollback)
        + ("" if comparison is None else "\n" + render_against(comparison, params["against"], params["fmt"])))
    parted = comparison is not None and comparison["first_parted"] is not None
    ctx.exit(FINDINGS_EXIT if first is not None or parted else 0)
