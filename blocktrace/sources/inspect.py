"""`blocktrace inspect`: what a checkpoint holds, layer by layer, before anything is traced."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from blocktrace.errors import UsageError, WeightsError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.sources.families.layouts import numbered_layers
from blocktrace.vocab import SCHEMA_VERSION, ReportKind


def _tensor_entry(checkpoint: Checkpoint, key: str, name: str) -> dict:
    tensor = checkpoint.get(key).float()  # as stored (integers too: inspect lists all); one tensor at a time
    return {"name": name, "shape": list(checkpoint.shape(key)), "dtype": checkpoint.dtype(key),
            "norm": torch.linalg.vector_norm(tensor).item()}


def inspect_checkpoint(path: Path) -> dict:
    """The file as a family reads it; a file that fits no layout (or not its tensors) is listed as it is, with why
    it does not fit (`layout_note`): inspect always shows the file."""
    checkpoint = Checkpoint(path)
    try:
        info = model_info(checkpoint)
        try:
            config = checkpoint_config(checkpoint, info, {}).to_dict()
        except UsageError:
            config = None  # no config.json: the head count cannot be read from the shapes
    except WeightsError as error:
        return _as_stored(checkpoint, str(path), str(error))
    layers, others = _by_layer(checkpoint, f"{info.prefix}{info.family.layers_path}", info.n_layers)
    return _report(layers, others, path=str(path), family=info.family_name, key_prefix=info.prefix,
                   vocab_size=info.vocab_size, n_positions=info.n_positions, config_file=info.has_config_file,
                   config=config, layout_note=None)


def _as_stored(checkpoint: Checkpoint, path: str, why: str) -> dict:
    """Every tensor, grouped by the numbered layers the keys show, with no family."""
    found = numbered_layers(checkpoint)
    layers, others = _by_layer(checkpoint, found.prefix, found.count) if found else _by_layer(checkpoint, "", 0)
    return _report(layers, others, path=path, family=None, key_prefix=f"{found.prefix}." if found else None,
                   vocab_size=None, n_positions=None, config_file=checkpoint.read_json("config.json") is not None,
                   config=None, layout_note=why)


def _by_layer(checkpoint: Checkpoint, layers_path: str, n_layers: int) -> tuple[list, list]:
    layer_key = re.compile(rf"^{re.escape(layers_path)}\.(\d+)\.(.+)$")
    layers = [[] for _ in range(n_layers)]
    others = []
    for key in sorted(checkpoint.keys):
        match = layer_key.match(key) if layers_path else None
        if match and int(match.group(1)) < n_layers:  # a tensor of a layer past the last: listed with the rest
            layers[int(match.group(1))].append(_tensor_entry(checkpoint, key, match.group(2)))
        else:
            others.append(_tensor_entry(checkpoint, key, key))
    return layers, others


def _report(layers: list, others: list, **fields) -> dict:
    return {"schema": SCHEMA_VERSION, "kind": ReportKind.INSPECT.value, "path": fields["path"],
            "family": fields["family"], "key_prefix": fields["key_prefix"], "n_layers": len(layers),
            "vocab_size": fields["vocab_size"], "n_positions": fields["n_positions"],
            "config_file": fields["config_file"], "config": fields["config"], "layout_note": fields["layout_note"],
            "layers": [{"layer": index, "tensors": tensors} for index, tensors in enumerate(layers)],
            "other_tensors": others}
