"""`blocktrace inspect`: what a checkpoint holds, layer by layer, before anything is traced."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from blocktrace.errors import UsageError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.families import checkpoint_config, model_info
from blocktrace.vocab import SCHEMA_VERSION, ReportKind


def _tensor_entry(checkpoint: Checkpoint, key: str, name: str) -> dict:
    tensor = checkpoint.get(key).float()  # as stored (integers too: inspect lists all); one tensor at a time
    return {"name": name, "shape": list(checkpoint.shape(key)), "dtype": checkpoint.dtype(key),
            "norm": torch.linalg.vector_norm(tensor).item()}


def inspect_checkpoint(path: Path) -> dict:
    checkpoint = Checkpoint(path)
    info = model_info(checkpoint)
    try:
        config = checkpoint_config(checkpoint, info, {}).to_dict()
    except UsageError:
        config = None  # no config.json: the head count cannot be read from the shapes
    layer_key = re.compile(rf"^{re.escape(info.prefix)}{re.escape(info.family.layers_path)}\.(\d+)\.(.+)$")
    layers = [[] for _ in range(info.n_layers)]
    others = []
    for key in sorted(checkpoint.keys):
        match = layer_key.match(key)
        if match and int(match.group(1)) < info.n_layers:  # a tensor of a layer past the last: listed with the rest
            layers[int(match.group(1))].append(_tensor_entry(checkpoint, key, match.group(2)))
        else:
            others.append(_tensor_entry(checkpoint, key, key))
    return {
        "schema": SCHEMA_VERSION,
        "kind": ReportKind.INSPECT.value,
        "path": str(path),
        "family": info.family_name,
        "key_prefix": info.prefix,
        "n_layers": info.n_layers,
        "vocab_size": info.vocab_size,
        "n_positions": info.n_positions,
        "config_file": info.has_config_file,
        "config": config,
        "layers": [{"layer": index, "tensors": tensors} for index, tensors in enumerate(layers)],
        "other_tensors": others,
    }
