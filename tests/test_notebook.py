"""render/notebook.py: in a notebook (an IPython kernel running when blocktrace is imported), a Trace and a Timeline
display as their --html page, in an iframe whose document is that page exactly. IPython is not installed here: the
kernel is a stand-in with IPython's formatter interface (display_formatter.formatters["text/html"].for_type)."""

from __future__ import annotations

import html
import importlib
import json
import re
import sys
import types

import pytest
import torch
from helpers import SAMPLES

import blocktrace
from blocktrace.render.html import html_page
from blocktrace.render.notebook import trace_report

LR_HIGH_WATCH = SAMPLES / "training" / "gpt2-lr-high" / "watch.jsonl"


class HtmlFormatter:
    def __init__(self):
        self.shown = {}

    def for_type(self, kind, function):
        self.shown[kind] = function


def kernel(monkeypatch) -> HtmlFormatter:
    """A running IPython kernel as blocktrace sees one; blocktrace imported again under it."""
    formatter = HtmlFormatter()
    shell = types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters={"text/html": formatter}))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    importlib.reload(blocktrace)
    return formatter


def _document(frame: str) -> str:
    """The page an iframe element's srcdoc holds."""
    assert frame.startswith("<iframe ") and 'sandbox="allow-scripts"' in frame
    return html.unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1))


def _report(page: str) -> dict:
    data = re.search(r'<script type="application/json" id="report">(.*?)</script>', page, re.S).group(1)
    return json.loads(data)


def _trace():
    block = blocktrace.build_block(blocktrace.BlockConfig(d_model=8, n_heads=2), seed=0)
    return blocktrace.trace(block, torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(0)), keep_tensors=True)


def test_a_trace_in_a_notebook_displays_as_its_page(monkeypatch):
    shown = kernel(monkeypatch).shown
    trace = _trace()
    page = _document(shown[type(trace)](trace))
    assert page == html_page(trace_report(trace), "trace")
    report = _report(page)
    assert [step["name"] for step in report["steps"]] == [s.name for s in trace.steps]
    tensors = trace.tensors()
    for drawn in report["steps"]:  # each step's numbers, against torch's on the very tensor the block computed
        tensor = tensors[drawn["name"]].double()
        assert drawn["stats"]["mean"] == pytest.approx(tensor.mean().item(), abs=1e-6)
        assert drawn["stats"]["max"] == pytest.approx(tensor.max().item(), rel=1e-6)
    assert report["attention"]["future_weight_sum"] == trace.attention.future_weight_sum


def test_a_timeline_in_a_notebook_displays_as_tracks_page(monkeypatch, invoke):
    shown = kernel(monkeypatch).shown
    timeline = blocktrace.read_timeline(LR_HIGH_WATCH)
    assert isinstance(timeline, list) and timeline.path == LR_HIGH_WATCH  # still the records, in step order
    page = _document(shown[type(timeline)](timeline))
    assert _report(page) == json.loads(invoke("track", str(LR_HIGH_WATCH), "--json").stdout)


def test_outside_a_notebook_nothing_is_registered_or_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "IPython", raising=False)
    monkeypatch.delitem(sys.modules, "blocktrace.render.notebook", raising=False)
    importlib.reload(blocktrace)
    assert "blocktrace.render.notebook" not in sys.modules
