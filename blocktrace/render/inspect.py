"""`blocktrace inspect` as text: the checkpoint's layout and config, then one row per tensor."""

from __future__ import annotations

from tabulate import tabulate


def render_inspection(report: dict, fmt: str) -> str:
    config = report["config"]
    settings = (" ".join(f"{k}={v}" for k, v in config.items() if v is not None) if config
                else "no config.json: pass --heads to run it")
    header = [
        f"{report['path']}: layout {report['layout']} (key prefix {report['key_prefix']!r}), "
        f"{report['n_layers']} layers, vocab {report['vocab_size']}, positions {report['n_positions']}",
        f"block config: {settings}",
    ]
    rows = [[layer["layer"], t["name"], str(t["shape"]), t["dtype"], t["norm"]]
            for layer in report["layers"] for t in layer["tensors"]]
    rows += [["-", t["name"], str(t["shape"]), t["dtype"], t["norm"]] for t in report["other_tensors"]]
    table = tabulate(rows, headers=["layer", "tensor", "shape", "dtype", "norm"], tablefmt=fmt, floatfmt=".4f")
    return "\n".join(header) + "\n\n" + table + "\n"
