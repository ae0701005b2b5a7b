"""A trace and a timeline shown where a notebook shows a value: the `--html` page itself, inline.

In IPython or Jupyter (blocktrace/__init__.py registers these when a kernel is running), the last value of a cell
that is a `Trace` (what `blocktrace.trace` returns) or a `Timeline` (what `blocktrace.read_timeline` returns)
displays as the page `run --html` and `track --html` write for it: the same document, the same script, nothing
fetched. The page sits in an iframe of its own (`srcdoc`, scripts allowed, no same-origin access), so the
notebook's styles do not reach it and its script cannot reach the notebook.
"""

from __future__ import annotations

import html

from blocktrace.pipeline.report import block_report
from blocktrace.pipeline.track import track_request
from blocktrace.render.html import html_page
from blocktrace.request import TrackRequest
from blocktrace.sources.source import Source
from blocktrace.tracing.records import Trace
from blocktrace.training.timeline import Timeline

FRAME_HEIGHT = 760  # px: a first screen of the page; it scrolls inside its frame
FRAME = ('<iframe srcdoc="{page}" title="{title}" sandbox="allow-scripts" '
         'style="width: 100%; height: {height}px; border: 1px solid #ddd"></iframe>')
TRACE_NOTE = "traced from Python (blocktrace.trace)"


def trace_report(trace: Trace) -> dict:
    """The report `run --json` holds for a block, of a trace made in Python: no seed, no token labels, no findings
    (the trace's own statistics and attention only)."""
    source = Source(trace.config, trace.output, None, TRACE_NOTE, None)
    return block_report(source, trace)


def trace_page(trace: Trace) -> str:
    return html_page(trace_report(trace), "trace")


def timeline_page(timeline: Timeline) -> str:
    """`track --html`'s page of the timeline file the records were read from."""
    report, _ = track_request(TrackRequest(sources=(timeline.path,)))
    return html_page(report, "track")


def framed(page: str, title: str) -> str:
    """The page as one iframe element: its whole document escaped into the srcdoc attribute."""
    return FRAME.format(page=html.escape(page, quote=True), title=html.escape(title), height=FRAME_HEIGHT)


def trace_frame(trace: Trace) -> str:
    return framed(trace_page(trace), "blocktrace: trace")


def timeline_frame(timeline: Timeline) -> str:
    return framed(timeline_page(timeline), f"blocktrace: {timeline.path}")


def register(formatters) -> None:
    """Show Trace and Timeline values as their pages: `formatters` is IPython's display_formatter.formatters."""
    shown = formatters["text/html"]
    shown.for_type(Trace, trace_frame)
    shown.for_type(Timeline, timeline_frame)
