"""`blocktrace inspect` (what a checkpoint holds) and `blocktrace diff` (two trace files)."""

from __future__ import annotations

from pathlib import Path

import click

from blocktrace.cli.app import cli, show
from blocktrace.cli.options import FORMAT_OPTION, DOCUMENT_OPTIONS, FiniteNumber
from blocktrace.cli.rules import beside_documents, enforce

OUTPUT_RULES = beside_documents("fmt", "--format shapes the tables")


@cli.command()
@click.argument("trace_a", type=click.Path(path_type=Path))
@click.argument("trace_b", type=click.Path(path_type=Path))
@click.option("--atol", type=FiniteNumber(positive=False), default=1e-5, show_default=True, help="Absolute tolerance (a finite number ≥ 0).")
@click.option("--rtol", type=FiniteNumber(positive=False), default=1e-4, show_default=True, help="Relative tolerance (a finite number ≥ 0).")
@FORMAT_OPTION
@DOCUMENT_OPTIONS
@click.pass_context
def diff(ctx, trace_a, trace_b, atol, rtol, fmt, **document):
    """Compare two trace files (from --save) step by step: max |Δ|, relative error, cosine
    similarity, and the first step beyond --atol/--rtol; exit 1 when they diverge."""
    from blocktrace.diagnose.diff import diff_traces

    enforce(ctx, OUTPUT_RULES)
    report = diff_traces(trace_a, trace_b, atol, rtol)
    from blocktrace.render.diff import render_diff

    show(report, document, lambda: render_diff(report, fmt))
    ctx.exit(1 if report["diverged"] else 0)


@cli.command()
@click.argument("path", type=click.Path(path_type=Path))
@FORMAT_OPTION
@DOCUMENT_OPTIONS
@click.pass_context
def inspect(ctx, path, fmt, **document):
    """Show a checkpoint's layout, config and per-layer tensors (names, shapes, dtypes, norms)."""
    from blocktrace.sources.inspect import inspect_checkpoint

    enforce(ctx, OUTPUT_RULES)
    report = inspect_checkpoint(path)
    from blocktrace.render.inspect import render_inspection

    show(report, document, lambda: render_inspection(report, fmt))
