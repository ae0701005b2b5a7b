"""`--plot PATH.png`: attention heatmaps of one block, per-layer curves of a stack or a compare, or curves
over training steps (`track`).

matplotlib is an optional extra (`pip install "transformer-blocktrace[plot]"`): the CLI asks
for it (`require_pyplot`) before any computation. The PNG is written like every file
blocktrace writes (blocktrace.files: atomic, no clobbering).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Optional

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


def _per_layer(axis, records: list[dict], key: str, title: str) -> None:
    steps = [entry["step"] for entry in records]
    n_layers = max(len(entry["layers"]) for entry in records)
    for layer in range(n_layers):
        values = [entry["layers"][layer].get(key) if layer < len(entry["layers"]) else None for entry in records]
        axis.plot(steps, [float("nan") if v is None else v for v in values], marker=".", label=f"L{layer}")
    axis.set_title(title)


def _largest_updates(axis, records: list[dict]) -> None:
    steps = [entry["step"] for entry in records]
    kinds = sorted({kind for entry in records for layer in entry["layers"] for kind in (layer.get("weights") or {})})
    for kind in kinds:
        values = []
        for entry in records:
            ratios = [layer["weights"][kind]["update_ratio"] for layer in entry["layers"]
                      if (layer.get("weights") or {}).get(kind, {}).get("update_ratio") is not None]
            values.append(max(ratios) if ratios else float("nan"))
        axis.plot(steps, values, marker=".", label=kind)
    axis.set_title("‖ΔW‖/‖W‖ since the previous record (largest layer)")
    axis.legend(fontsize=7)


def track_figure(plt, records: list[dict], first: Optional[dict]):
    """Curves over training steps: the loss, per-layer rms, logits and entropy, weight movement; a marker at the
    first sign of trouble."""
    figure, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    steps = [entry["step"] for entry in records]
    loss_axis = axes[0][0]
    loss_axis.plot(steps, [float("nan") if e.get("loss") is None else e["loss"] for e in records], marker="o",
                   label="loss on the input")
    if any(entry.get("log") for entry in records):
        loss_axis.plot(steps, [(e.get("log") or {}).get("loss", float("nan")) for e in records], marker="x",
                       label="training log")
    loss_axis.set_title("loss")
    loss_axis.legend(fontsize=7)
    _per_layer(axes[0][1], records, "rms", "residual rms after each block")
    _per_layer(axes[0][2], records, "max_logit", "largest attention logit")
    _per_layer(axes[1][0], records, "min_entropy", "lowest head entropy (nats)")
    _per_layer(axes[1][1], records, "grad_norm", "block gradient norm")
    axes[0][1].legend(fontsize=7)
    _largest_updates(axes[1][2], records)
    for axis in (a for row in axes for a in row):
        axis.set_xlabel("training step")
        if first is not None:
            axis.axvline(first["step"], color="red", linestyle="--", linewidth=1)
    if first is not None:
        loss_axis.annotate(f"first sign: {first['name']}", (first["step"], loss_axis.get_ylim()[1]), color="red",
                           fontsize=8, ha="left", va="top")
    figure.tight_layout()
    return figure


def save_figure(plt, figure, path: Path, force: bool) -> None:
    """The figure as a PNG, written atomically (see files.py)."""
    try:
        buffer = io.BytesIO()
        figure.savefig(buffer, dpi=100, format="png")
    finally:
        plt.close(figure)
    write_atomically(Path(path), lambda handle: handle.write(buffer.getvalue()), force)


def write_plot(report: dict, path: Path, force: bool) -> None:
    plt = require_pyplot()
    save_figure(plt, figure_for(plt, report), path, force)

