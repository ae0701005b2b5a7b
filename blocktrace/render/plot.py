"""`--plot PATH.png`: attention heatmaps of one block, per-layer curves of a stack or a compare, or curves
over training steps (`track`).

matplotlib is an optional extra (`pip install -e ".[plot]"` from a checkout): the CLI asks
for it (`require_pyplot`) before any computation. The PNG is written like every file
blocktrace writes (blocktrace.files: atomic, no clobbering).
"""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Optional

import numpy as np

from blocktrace.errors import UsageError
from blocktrace.files import write_atomically
from blocktrace.vocab import ReportKind


# The file formats --plot writes, by suffix.
PLOT_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def plot_format(path: Path) -> str:
    """The format the plot's suffix asks for; any other suffix is refused before work starts."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_FORMATS:
        raise UsageError(f"--plot {path}: the suffix says the format; give one of {', '.join(PLOT_FORMATS)}")
    return PLOT_FORMATS[suffix]


def require_pyplot(path: Optional[Path] = None):
    """matplotlib, ready to write files; with the plot's path, its format is checked first."""
    if path is not None:
        plot_format(path)
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install -e '.[plot]'") from None
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
    from matplotlib import font_manager  # matplotlib is optional (the plot extra): imported where a plot is drawn

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
    figure.suptitle(f"attention weights, {_what(report)}", fontsize=9)
    return figure


def _what(report: dict) -> str:
    """Which block a figure shows: the checkpoint's layer, or the seeded block."""
    weights = report.get("weights")
    if weights:
        return f"{weights['path']} ({weights['family']}) layer {weights['layer']}"
    return f"a seeded block (seed {report.get('seed')})"


def _curves(plt, series: list[tuple[str, dict]]):
    """One panel per quantity, one line per variant, layers on the x axis."""
    panels = [("‖x‖²/d after the block", "sq_norm_per_d"),
              ("attn share: Var[attention's update] / Var[residual1]", "attn_share"),
              ("ffn share: Var[FFN's update] / Var[residual2]", "ffn_share")]
    with_grads = all(report.get("gradients") for _, report in series)
    figure, axes = plt.subplots(1, len(panels) + with_grads, figsize=(4.2 * (len(panels) + with_grads), 3.4))
    for axis, (title, key) in zip(axes, panels):
        for name, report in series:
            axis.plot([l["layer"] for l in report["layers"]], [l[key] for l in report["layers"]], marker="o", label=name)
        axis.set_title(title)
        axis.set_xlabel("layer")
        axis.legend(fontsize=7)
    if with_grads:
        for name, report in series:
            layers = report["gradients"]["layers"]
            axes[-1].plot([l["layer"] for l in layers], [l["weight_grad_norms"]["ffn_w2"] for l in layers],
                          marker="o", label=name)
        axes[-1].set_title("‖∂L/∂W2‖ (FFN)")
        axes[-1].set_xlabel("layer")
        axes[-1].legend(fontsize=7)
        _scale_for(axes[-1], [l["weight_grad_norms"]["ffn_w2"] for _, r in series for l in r["gradients"]["layers"]])
    figure.tight_layout()
    return figure


def _sweep(plt, series: list[tuple[str, dict]]):
    figure, axis = plt.subplots(figsize=(5, 3.6))
    for name, report in series:
        axis.plot(report["depths"], [row["last_layer"]["ffn_w2"] for row in report["sweep"]], marker="o", label=name)
    axis.set_xlabel("depth N")
    axis.set_title("‖∂L/∂W2‖ of the last layer")
    axis.legend()
    _scale_for(axis, [row["last_layer"]["ffn_w2"] for _, report in series for row in report["sweep"]])
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


DECADES_FOR_LOG = 2  # values spanning more than 10² are drawn on a log axis: a linear one squashes them flat


def _finite(values) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v)]


def _scale_for(axis, values) -> None:
    """A log y axis where positive values span decades, said in the axis label."""
    shown = _finite(values)
    if shown and min(shown) > 0 and max(shown) / min(shown) > 10 ** DECADES_FOR_LOG:
        axis.set_yscale("log")
        axis.set_ylabel("log scale", fontsize=7)


def _layer_series(records: list[dict], key: str) -> list[list]:
    n_layers = max(len(entry["layers"]) for entry in records)
    return [[entry["layers"][layer].get(key) if layer < len(entry["layers"]) else None for entry in records]
            for layer in range(n_layers)]


def _per_layer(axis, steps: list, series: list[list], title: str, colours) -> None:
    """One line per layer, coloured by depth (the figure's colour bar says which colour is which layer)."""
    for layer, values in enumerate(series):
        axis.plot(steps, [float("nan") if v is None else v for v in values], marker=".", color=colours(layer),
                  label=f"L{layer}")
    _scale_for(axis, [v for values in series for v in values])
    axis.set_title(title, fontsize=9)


def _largest_updates(axis, records: list[dict]) -> None:
    steps = [entry["step"] for entry in records]
    kinds = sorted({kind for entry in records for layer in entry["layers"] for kind in (layer.get("weights") or {})})
    shown = []
    for kind in kinds:
        values = []
        for entry in records:
            ratios = [layer["weights"][kind]["update_ratio"] for layer in entry["layers"]
                      if (layer.get("weights") or {}).get(kind, {}).get("update_ratio") is not None]
            values.append(max(ratios) if ratios else float("nan"))
        axis.plot(steps, values, marker=".", label=kind)
        shown += values
    _scale_for(axis, shown)
    axis.set_title("‖ΔW‖/‖W‖ since the previous record (largest layer)", fontsize=9)
    axis.legend(fontsize=7)


# Per-layer panels of a track figure: (record key, title). A panel with no value at all is left out.
LAYER_PANELS = (("rms", "residual rms after each block"), ("max_logit", "largest attention logit"),
                ("min_entropy", "lowest head entropy (nats)"), ("grad_norm", "block gradient norm"))


def _loss_panel(axis, records: list[dict]) -> None:
    steps = [entry["step"] for entry in records]
    losses = [e.get("loss") for e in records]
    axis.plot(steps, [float("nan") if v is None else v for v in losses], marker="o", label="loss on the input")
    logged = [(e.get("log") or {}).get("loss") for e in records]
    if any(v is not None for v in logged):
        axis.plot(steps, [float("nan") if v is None else v for v in logged], marker="x", label="training log")
    _scale_for(axis, losses + logged)
    axis.set_title("loss", fontsize=9)
    axis.legend(fontsize=7)


def _run_title(records: list[dict]) -> str:
    """Which run a track figure shows: its checkpoints' common folder (or the first one), or a Watch's timeline."""
    paths = [entry["path"] for entry in records if entry.get("path")]
    where = (os.path.commonpath(paths) if len(paths) > 1 else paths[0]) if paths else "a Watch's timeline"
    return f"{where}: {len(records)} records, steps {records[0]['step']}–{records[-1]['step']}"


def track_figure(plt, records: list[dict], first: Optional[dict]):
    """Curves over training steps: the loss, per-layer rms, logits, entropy and gradient norms (layers coloured by
    depth, with a colour bar), weight movement; a marker at the first sign of trouble. Panels without data are
    left out, and values spanning decades get a log axis."""
    from matplotlib import cm, colors  # optional, as above

    steps = [entry["step"] for entry in records]
    layer_panels = [(title, series) for key, title in LAYER_PANELS
                    for series in [_layer_series(records, key)] if _finite(v for s in series for v in s)]
    has_updates = any((layer.get("weights") or {}).get(kind, {}).get("update_ratio") is not None
                      for entry in records for layer in entry["layers"] for kind in (layer.get("weights") or {}))
    count = 1 + len(layer_panels) + has_updates
    columns = min(3, count)
    rows = math.ceil(count / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4.7 * columns, 3.8 * rows), squeeze=False)
    flat = [a for row in axes for a in row]
    n_layers = max(len(entry["layers"]) for entry in records)
    scale = colors.Normalize(vmin=0, vmax=max(n_layers - 1, 1))
    # One colour per depth, from viridis's dark end to 0.75 of it: beyond, its yellows are pale on white.
    depth_map = colors.ListedColormap(cm.viridis(np.linspace(0.0, 0.75, 256)))
    colours = lambda layer: depth_map(scale(layer))  # noqa: E731
    _loss_panel(flat[0], records)
    for axis, (title, series) in zip(flat[1:], layer_panels):
        _per_layer(axis, steps, series, title, colours)
    if has_updates:
        _largest_updates(flat[1 + len(layer_panels)], records)
    for axis in flat[count:]:
        axis.remove()
    for axis in flat[:count]:
        axis.set_xlabel("training step")
        if first is not None:
            axis.axvline(first["step"], color="red", linestyle="--", linewidth=1)
    if first is not None:
        flat[0].annotate(f"first sign: {first['name']}", (first["step"], flat[0].get_ylim()[1]), color="red",
                         fontsize=8, ha="left", va="top")
    figure.suptitle(_run_title(records), fontsize=9)
    figure.tight_layout()
    if layer_panels:
        bar = figure.colorbar(cm.ScalarMappable(norm=scale, cmap=depth_map), ax=flat[:count], shrink=0.8)
        bar.set_label("layer")
        bar.set_ticks(range(n_layers))
    return figure


def figure_bytes(plt, figure, path: Path) -> bytes:
    """The figure encoded in the format its path's suffix says (then closed)."""
    try:
        buffer = io.BytesIO()
        figure.savefig(buffer, dpi=100, format=plot_format(path))
    finally:
        plt.close(figure)
    return buffer.getvalue()


def save_figure(plt, figure, path: Path, force: bool) -> None:
    """The figure written atomically (see files.py)."""
    write_bytes(Path(path), figure_bytes(plt, figure, path), force)


def plot_bytes(report: dict, path: Path) -> bytes:
    """The plot of a report, drawn (and so checked: a heatmap's token limit) before any output is written."""
    plt = require_pyplot()
    return figure_bytes(plt, figure_for(plt, report), path)


def write_bytes(path: Path, data: bytes, force: bool) -> None:
    write_atomically(Path(path), lambda handle: handle.write(data), force)


def write_plot(report: dict, path: Path, force: bool) -> None:
    write_bytes(path, plot_bytes(report, path), force)
