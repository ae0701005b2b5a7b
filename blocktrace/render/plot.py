"""`--plot PATH.png`: attention heatmaps of one block, or per-layer curves of a stack or a compare.

matplotlib is an optional extra (`pip install "transformer-blocktrace[plot]"`); the PNG is
written under a temporary name and renamed, like every file blocktrace writes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from blocktrace.errors import BlocktraceError, UsageError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'transformer-blocktrace[plot]'") from None
    matplotlib.use("Agg")  # files only: never open a window
    import matplotlib.pyplot as plt

    return plt


CJK_FONTS = ("Noto Sans CJK SC", "Noto Sans CJK JP", "Source Han Sans SC", "WenQuanYi Zen Hei",
             "WenQuanYi Micro Hei", "SimHei", "Microsoft YaHei", "PingFang SC", "Heiti SC")


def _labels(plt, tokens, count: int) -> tuple[list[str], str]:
    """Token labels, and a note when they cannot be drawn (no font has their glyphs)."""
    positional = [f"t{i}" for i in range(count)]
    if not tokens:
        return positional, ""
    if all(ord(ch) < 0x2E80 for token in tokens for ch in token):
        return list(tokens), ""
    from matplotlib import font_manager

    installed = {font.name for font in font_manager.fontManager.ttflist}
    available = [name for name in CJK_FONTS if name in installed]
    if not available:
        return positional, " (tokens by position: no CJK font installed)"
    plt.rcParams["font.sans-serif"] = [*available, *plt.rcParams["font.sans-serif"]]
    plt.rcParams["font.family"] = "sans-serif"
    return list(tokens), ""


def _heatmaps(plt, report: dict):
    attention = report["attention"]
    weights = attention["weights_first_sequence"]
    if weights is None:
        raise UsageError(f"--plot draws heatmaps for up to 16 tokens; this input has {attention['shape'][-1]}")
    labels, note = _labels(plt, report["tokens"], len(weights[0]))
    figure, axes = plt.subplots(1, len(weights), figsize=(3.2 * len(weights), 3.2), squeeze=False)
    for head, (axis, matrix) in enumerate(zip(axes[0], weights)):
        image = axis.imshow(matrix, vmin=0.0, vmax=1.0, cmap="viridis")
        axis.set_title(f"head {head}{note if head == 0 else ''}", fontsize=9)
        axis.set_xticks(range(len(labels)), labels)
        axis.set_yticks(range(len(labels)), labels)
        axis.set_xlabel("key")
    axes[0][0].set_ylabel("query")
    figure.colorbar(image, ax=list(axes[0]), shrink=0.8)
    return figure


def _curves(plt, series: list[tuple[str, dict]]):
    """One panel per quantity, one line per variant, layers on the x axis."""
    panels = [("‖x‖²/d after the block", "sq_norm_per_d"), ("attn share", "attn_share"), ("ffn share", "ffn_share")]
    with_grads = all(report.get("gradients") for _, report in series)
    figure, axes = plt.subplots(1, len(panels) + with_grads, figsize=(4.2 * (len(panels) + with_grads), 3.4))
    for axis, (title, key) in zip(axes, panels):
        for name, report in series:
            axis.plot([l["layer"] for l in report["layers"]], [l[key] for l in report["layers"]], marker="o", label=name)
        axis.set_title(title)
        axis.set_xlabel("layer")
    if with_grads:
        for name, report in series:
            layers = report["gradients"]["layers"]
            axes[-1].plot([l["layer"] for l in layers], [l["weight_grad_norms"]["ffn_w2"] for l in layers],
                          marker="o", label=name)
        axes[-1].set_title("‖∂L/∂W2‖ (FFN)")
        axes[-1].set_xlabel("layer")
    axes[0].legend()
    figure.tight_layout()
    return figure


def _sweep(plt, series: list[tuple[str, dict]]):
    figure, axis = plt.subplots(figsize=(5, 3.6))
    for name, report in series:
        axis.plot(report["depths"], [row["last_layer"]["ffn_w2"] for row in report["sweep"]], marker="o", label=name)
    axis.set_xlabel("depth N")
    axis.set_title("‖∂L/∂W2‖ of the last layer")
    axis.legend()
    figure.tight_layout()
    return figure


def figure_for(plt, report: dict):
    if report["kind"] == "compare":
        series = [(entry["value"], entry["report"]) for entry in report["variants"]]
    else:
        series = [(report["config"]["placement"], report)]
    kind = series[0][1]["kind"]
    if kind == "block":
        if report["kind"] == "compare":
            raise UsageError("--plot with compare draws per-layer curves: add --layers N")
        return _heatmaps(plt, report)
    return _sweep(plt, series) if kind == "sweep" else _curves(plt, series)


def write_plot(report: dict, path: Path) -> None:
    plt = _pyplot()
    figure = figure_for(plt, report)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        figure.savefig(temporary, dpi=100, format="png")
        os.replace(temporary, path)
    except OSError as error:
        raise BlocktraceError(f"cannot write {path}: {error.strerror or error}") from None
    finally:
        plt.close(figure)
        if Path(temporary).exists():
            Path(temporary).unlink()
