"""`blocktrace inspect` as text: the checkpoint's layout and config, then one row per tensor."""

from __future__ import annotations

import dataclasses

from tabulate import tabulate

from blocktrace.config import BlockConfig

# Always shown; every other field only where it differs from BlockConfig's default.
CORE_FIELDS = ("d_model", "n_heads", "d_ff", "norm", "ffn", "placement", "causal", "eps", "bias", "n_layers")
DEFAULTS = {field.name: field.default for field in dataclasses.fields(BlockConfig)}


def _settings(config: dict) -> str:
    return " ".join(f"{key}={value}" for key, value in config.items()
                    if key in CORE_FIELDS or (value is not None and value != DEFAULTS.get(key)))


def _header(report: dict) -> list[str]:
    if report["family"] is None:  # the file as it is stored: why no layout reads it
        return [f"{report['path']}: read as no family, {report['n_layers']} numbered layers "
                f"(key prefix {report['key_prefix']!r}): listed as stored", f"why: {report['layout_note']}"]
    config = report["config"]
    settings = _settings(config) if config else "no config.json: pass --heads to run it"
    return [f"{report['path']}: family {report['family']} (key prefix {report['key_prefix']!r}), "
            f"{report['n_layers']} layers, vocab {report['vocab_size']}, positions {report['n_positions']}",
            f"block config: {settings}"]


def render_inspection(report: dict, fmt: str) -> str:
    header = _header(report)
    rows = [[layer["layer"], t["name"], str(t["shape"]), t["dtype"], t["norm"]]
            for layer in report["layers"] for t in layer["tensors"]]
    rows += [["-", t["name"], str(t["shape"]), t["dtype"], t["norm"]] for t in report["other_tensors"]]
    table = tabulate(rows, headers=["layer", "tensor", "shape", "dtype", "norm"], tablefmt=fmt, floatfmt=".4f")
    return "\n".join(header) + "\n\n" + table + "\n"
