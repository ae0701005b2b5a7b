"""`--plot PATH.png`: attention heatmaps of one block, or per-layer curves of a stack or a compare.

matplotlib is an optional extra (`pip install "transformer-blocktrace[plot]"`): the CLI asks
for it (`require_pyplot`) before any computation. The PNG is written like every file
blocktrace writes (blocktrace.files: atomic, no clobbering).
"""

from __future__ import annotations

import io
from pathlib import Path

from blocktrace.errors import UsageError
from blocktrace.files import write_atomically
from blocktrace.vocab import ReportKind


def require_pyplot():
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


def _not_visible(plt, report: dict):
    figure, axis = plt.subplots(figsize=(5.5, 1.6))
    axis.axis("off")
    note = next((n for n in report.get("notes") or [] if "not visible" in n), "attention weights are not visible")
    axis.text(0.0, 0.5, f"attention heatmap: n/a\n{note}", fontsize=8, va="center", wrap=True)
    return figure


def _heatmaps(plt, report: dict):
    attention = report["attention"]
    if attention is None:
        return _not_visible(plt, report)
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
    comparing = ReportKind(report["kind"]) is ReportKind.COMPARE
    if comparing:
        series = [(entry["value"], entry["report"]) for entry in report["variants"]]
    else:
        series = [(report["config"]["placement"], report)]
    kind = ReportKind(series[0][1]["kind"])
    if kind is ReportKind.BLOCK:
        return _heatmaps(plt, report)
    return _sweep(plt, series) if kind is ReportKind.SWEEP else _curves(plt, series)


def write_plot(report: dict, path: Path, force: bool) -> None:
    plt = require_pyplot()
    figure = figure_for(plt, report)
    try:
        buffer = io.BytesIO()
        figure.savefig(buffer, dpi=100, format="png")
    finally:
        plt.close(figure)
    write_atomically(Path(path), lambda handle: handle.write(buffer.getvalue()), force)
