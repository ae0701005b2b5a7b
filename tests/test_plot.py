"""render/plot.py: --plot's figures — a PNG with content for run, a stack, compare and a sweep; track's curves (no
empty panel, log axes for values spanning decades, layers coloured by depth and none drawn pale, the run named); the
format taken from the suffix or refused; an existing file never replaced without --force; CJK tokens labelled by
position where no font has them; a missing matplotlib named as the extra to install."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import SAMPLES

from blocktrace.cli import cli
from blocktrace.training.timeline import read_timeline

RUN = SAMPLES / "training" / "gpt2-lr-high"
EVAL = SAMPLES / "training" / "eval.txt"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def records_without_grad():
    """The records of `track` over the run's checkpoints without --grad (no gradient panel in its figure)."""
    return json.loads(invoke("track", f"{RUN}/step_*", "--text-file", EVAL, "--json").output)["records"]


@pytest.fixture(scope="module")
def figure_without_grad(records_without_grad):
    from blocktrace.render.plot import require_pyplot, track_figure

    plt = require_pyplot()
    figure = track_figure(plt, records_without_grad, None)
    yield figure
    plt.close(figure)


def _png_pixels(path):
    import matplotlib.image

    return matplotlib.image.imread(str(path))


@pytest.mark.parametrize("args", [["run", "--tokens", "猫", "吃", "鱼"], ["run", "--layers", "4", "--grad"],
                                  ["compare", "--pre-ln", "--post-ln", "--layers", "4", "--grad"],
                                  ["compare", "--pre-ln", "--post-ln", "--layers", "2,3", "--grad"],
                                  ["track", RUN / "watch.jsonl"]])
def test_plot_writes_a_png_with_content(tmp_path, args):
    path = tmp_path / "plot.png"
    result = invoke(*args, "--plot", str(path))
    assert result.exit_code == (1 if args[0] == "track" else 0), result.output  # the run's findings: exit 1
    pixels = _png_pixels(path)
    assert pixels.shape[0] >= 200 and pixels.shape[1] >= 300
    assert float(np.std(pixels[..., :3])) > 0.05  # not blank


@pytest.mark.parametrize("fonts, labels, note", [
    ([], ["t0", "t1", "t2"], "(tokens by position: no CJK font installed)"),
    (["Noto Sans CJK SC"], ["猫", "吃", "鱼"], None)])
def test_a_heatmap_labels_cjk_tokens_by_position_when_no_font_has_them(monkeypatch, fonts, labels, note):
    """matplotlib draws a glyph no font has as a box: with no CJK font installed the axes say t0…t2 and the title
    says why; with one, the tokens themselves (the HTML page always uses the browser's fonts)."""
    from matplotlib import font_manager

    from blocktrace.render import plot

    plt = plot.require_pyplot()
    present = [entry for entry in font_manager.fontManager.ttflist if entry.name not in plot.CJK_FONTS]
    present += [font_manager.FontEntry(fname=f"/nowhere/{name}.ttf", name=name) for name in fonts]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", present)
    report = {"tokens": ["猫", "吃", "鱼"], "notes": [], "weights": None, "config": {}, "kind": "block",
              "attention": {"weights_first_sequence": [[[1.0, 0, 0], [0.5, 0.5, 0], [0.2, 0.3, 0.5]]],
                            "shape": [1, 3, 3]}}
    with plt.rc_context():  # the font it picks goes with the figure
        figure = plot._heatmaps(plt, report)
    axis = figure.axes[0]
    assert [t.get_text() for t in axis.get_xticklabels()] == labels
    assert (note in axis.get_title()) if note else "position" not in axis.get_title()
    plt.close(figure)


def test_plot_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = invoke("run", "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2
    assert result.stderr == "Error: --plot needs matplotlib: pip install -e '.[plot]'\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["run", "--tokens", "a", "b"], ["track", RUN / "watch.jsonl"]])
def test_plot_writes_a_png_and_never_clobbers(tmp_path, command):
    """An existing file is refused before any work; --force replaces it (with a run's plot, which is cheap to draw:
    track's figure takes seconds, and test_plot_writes_a_png_with_content draws it)."""
    plot = tmp_path / "plot.png"
    plot.write_bytes(b"mine")
    refused = invoke(*command, "--plot", plot)
    assert refused.exit_code == 2 and "already exists" in refused.output and plot.read_bytes() == b"mine"
    assert invoke("run", "--tokens", "a", "b", "--plot", plot, "--force").exit_code == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plots_have_no_empty_panel_log_axes_for_decades_and_a_layer_colour_bar(figure_without_grad):
    from blocktrace.render.plot import require_pyplot, track_figure

    plt = require_pyplot()
    figure = figure_without_grad
    titles = [axis.get_title() for axis in figure.axes]
    assert "block gradient norm" not in titles and "layer" in [axis.get_ylabel() for axis in figure.axes]
    rms = next(axis for axis in figure.axes if axis.get_title() == "residual rms after each block")
    assert rms.get_yscale() == "log"  # 0.03 at step 0 to hundreds later
    assert all(axis.lines for axis in figure.axes if axis.get_ylabel() != "layer")
    with_grad = track_figure(plt, read_timeline(RUN / "watch.jsonl"), None)
    assert "block gradient norm" in [axis.get_title() for axis in with_grad.axes]
    plt.close(with_grad)


def test_a_plots_format_follows_its_suffix_or_is_refused(tmp_path):
    assert invoke("run", "--tokens", "a", "b", "--plot", tmp_path / "t.pdf").exit_code == 0
    assert (tmp_path / "t.pdf").read_bytes()[:5] == b"%PDF-"
    refused = invoke("track", RUN / "watch.jsonl", "--plot", tmp_path / "t.jpg")
    assert refused.exit_code == 2 and "the suffix says the format" in refused.output
    assert not (tmp_path / "t.jpg").exists()
    same = invoke("run", "--save", tmp_path / "x.png", "--plot", tmp_path / "x.png")
    assert same.exit_code == 2 and "--save and --plot both name" in same.output and not (tmp_path / "x.png").exists()


def test_plots_say_what_they_show_and_no_layer_is_drawn_pale(records_without_grad, figure_without_grad):
    """Issue 32's PNG stumbles: a figure names its run (or its checkpoint and layer), and no layer's line has the
    pale yellow of viridis's top end (relative luminance above 0.75 is lost on white)."""
    from blocktrace.render.plot import figure_for, require_pyplot

    plt = require_pyplot()
    records, figure = records_without_grad, figure_without_grad
    assert str(RUN) in figure._suptitle.get_text() and f"steps 0–{records[-1]['step']}" in figure._suptitle.get_text()
    rms = next(axis for axis in figure.axes if axis.get_title() == "residual rms after each block")
    for line in rms.lines:
        r, g, b = line.get_color()[:3] if not isinstance(line.get_color(), str) else (0, 0, 0)
        assert 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.75, line.get_color()
    report = json.loads(invoke("run", "--weights", SAMPLES / "gpt2-tiny", "--layer", "1", "--token-ids", "1", "2",
                               "--json").output)
    heatmaps = figure_for(plt, report)
    assert "gpt2-tiny (gpt2) layer 1" in heatmaps._suptitle.get_text()
    plt.close(heatmaps)
