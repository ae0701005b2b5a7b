"""Checkpoint families: which one a checkpoint is, and its block config.

A checkpoint's family is what its config.json says (`model_type`): keys alone are a trap,
since many families share Llama's key names while computing something else. Only without a
config.json is the family guessed from the keys, and only among the layouts whose keys are
their own. A model_type blocktrace does not implement is refused by name.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
import re
from pathlib import Path
from typing import Optional

from blocktrace.config import BlockConfig, gathered, gathered_attention
from blocktrace.errors import ConfigError, UsageError, WeightsError
from blocktrace.sources.checkpoint import Checkpoint
from blocktrace.sources.configfile import ConfigFile
from blocktrace.sources.families.base import Family, HFLayer, ModelInfo, refuse_quantised
from blocktrace.sources.families.gpt2 import GPT2
from blocktrace.sources.families.layouts import describe_file
from blocktrace.sources.families.traced_only import TRACED_ONLY

__all__ = ["FAMILIES", "HF_LAYERS", "Family", "HFLayer", "ModelInfo", "SIZE_FIELDS", "checkpoint_config", "model_info",
           "reading_as"]


def _declared_families() -> list[Family]:
    """One of each Family class that names itself, from every module of this package: a family added in a file of
    its own is found without a line anywhere else."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    found, pending = [], [Family]
    while pending:
        cls = pending.pop()
        pending += cls.__subclasses__()
        if "name" in vars(cls) and cls.__module__.startswith(f"{__name__}."):
            found.append(cls())
    return sorted(found, key=lambda family: family.name)


FAMILIES = {family.name: family for family in _declared_families()}
# HF's decoder layer class name -> how it names its steps, as each family declares it, and the layers traced only
HF_LAYERS = {**TRACED_ONLY, **{name: family.hf_layers.get(name, family.hf_layer) for family in FAMILIES.values()
                               for name in family.hf_classes}}
# Without config.json only these are told apart by their keys (Llama's keys are shared: see llama.py).
KEYED_FAMILIES = ("gpt2", "bert", "llama", "gpt_neox")
BY_MODEL_TYPE = {model_type: family for family in FAMILIES.values() for model_type in family.model_types}
SUPPORTED_LAYOUTS = tuple(FAMILIES[name].described for name in KEYED_FAMILIES + ("nanogpt",))
# A training framework's wrapper module (Lightning's `self.model`) puts this before every key.
MODULE_PREFIX = "model."
# Sizes come from the checkpoint; a user option may only repeat them.
SIZE_FIELDS = ("d_model", "n_heads", "d_ff")
SIZE_OPTIONS = {"d_model": "--d-model", "n_heads": "--heads", "d_ff": "--d-ff"}


def _layers_by_prefix(checkpoint: Checkpoint, family: Family) -> dict[str, set[int]]:
    layers: dict[str, set[int]] = {}
    for key in checkpoint.keys:
        match = family.pattern.match(key)
        if match:
            layers.setdefault(match.group(1) or "", set()).add(int(match.group(2)))
    return layers


def _keyed_family(checkpoint: Checkpoint) -> Optional[Family]:
    for name in KEYED_FAMILIES:
        if _layers_by_prefix(checkpoint, FAMILIES[name]):
            return FAMILIES[name]
    return None


def _family_of(checkpoint: Checkpoint, config: Optional[ConfigFile]) -> Family:
    model_type = config.string("model_type") if config is not None else None
    if model_type is not None:
        if model_type not in BY_MODEL_TYPE:
            raise WeightsError(f"{config.path}: model_type {model_type!r} is not supported "
                               f"(supported: {', '.join(sorted(BY_MODEL_TYPE))}); blocktrace refuses rather than "
                               "trace it as another family")
        return BY_MODEL_TYPE[model_type]
    family = _keyed_family(checkpoint)
    if family is None and _strip_module_prefix(checkpoint):
        family = _keyed_family(checkpoint)
    if family is None:
        raise WeightsError(f"{checkpoint.path}: unknown checkpoint layout; tried {'; '.join(SUPPORTED_LAYOUTS)}; "
                           f"{describe_file(checkpoint, _keyed_layouts())}{_WAYS_ON.format(path=checkpoint.path)}")
    return family


# What a user whose file fits no layout can do next (check --model runs the model's own code on the file).
_WAYS_ON = ("; `blocktrace inspect {path}` lists every tensor, and `blocktrace check --model FILE.py:FACTORY "
            "--weights {path}` runs your model's own code on it")


def _keyed_layouts() -> list[Family]:
    return [FAMILIES[name] for name in KEYED_FAMILIES + ("nanogpt",)]


@contextlib.contextmanager
def reading_as(checkpoint: Checkpoint, info: "ModelInfo"):
    """A tensor the family's layout reads and the file lacks (or holds in another shape): the error says which
    layout the file was read as and why, what the file holds, and what to do."""
    try:
        yield
    except WeightsError as error:
        model_type = info.config.string("model_type") if info.config is not None else None
        why = f"{info.config.path.name} says model_type {model_type!r}" if model_type is not None else \
            f"guessed from its keys {info.prefix}{info.family.layers_path}.{{k}}.{info.family.marker}"
        layouts = [info.family] + [family for family in _keyed_layouts() if family.name != info.family_name]
        raise WeightsError(f"{error}: the file was read as the {info.family_name} layout ({why}); "
                           f"{describe_file(checkpoint, layouts)}{_WAYS_ON.format(path=checkpoint.path)}") from None


def _guessed(family: Family, config: Optional[ConfigFile]) -> list[str]:
    """A layout named by no model_type is an assumption about the code that trained the weights: said."""
    if config is not None and config.string("model_type") is not None:
        return []
    return [f"no model_type: the layout was guessed from the keys, so blocktrace's {family.name} block computes "
            "them (its attention, mask and norms), not the code that trained them (`check --model FILE.py:FACTORY` "
            "runs that code)"]


def _strip_module_prefix(checkpoint: Checkpoint) -> bool:
    """Lightning's `model.` before every key (its LightningModule holds the model as self.model): removed, whether
    or not a config.json says the family. Whether it was there."""
    if not checkpoint.keys or not all(key.startswith(MODULE_PREFIX) for key in checkpoint.keys):
        return False
    checkpoint.strip_prefix(MODULE_PREFIX, "a wrapper module, as Lightning's self.model")
    return True


def _one_copy_of_the_layers(checkpoint: Checkpoint, family: Family, prefix: str, layers: dict) -> None:
    """Layers under two prefixes (`h.*` and `transformer.h.*`): one model's tensors twice. Read once where every
    pair is equal; refused naming the first pair that differs."""
    for other in layers:
        if other == prefix:
            continue
        for key in [k for k in checkpoint.keys if k.startswith(other)]:
            twin = prefix + key[len(other):]
            if twin in checkpoint:
                checkpoint.same_tensor(twin, key)


def _config(checkpoint: Checkpoint) -> tuple[Optional[ConfigFile], list[str]]:
    """config.json beside the weights, else the model's arguments a training script stored in the file; and a
    note saying so when they came from the file."""
    config = checkpoint.read_json("config.json")
    if config is not None or not checkpoint.arguments:
        return config, []
    shown = ", ".join(f"{k}={v}" for k, v in sorted(checkpoint.arguments.items())[:8])
    return (ConfigFile(Path(f"{checkpoint.path}[model arguments]"), checkpoint.arguments),
            [f"the model's arguments read from the checkpoint file ({shown})"])


def _tie_embedding(checkpoint: Checkpoint, family: Family, prefix: str, config: Optional[ConfigFile]) -> None:
    """A tied model saved with its head only (safetensors' save_model keeps one name of a shared tensor)."""
    embedding = f"{prefix}{family.embedding_key}"
    if embedding in checkpoint or family.head_key not in checkpoint or not family.ties(config):
        return
    checkpoint.alias(embedding, family.head_key, f"the input embedding read from {family.head_key} (tied weights "
                                                 "saved once)")


def _contiguous(checkpoint: Checkpoint, family: Family, prefix: str, found: set[int]) -> int:
    """The number of layers, when the layers found are 0..N-1; a gap (a missing layer, or a stray index such as
    h.999999999) is refused: nothing would be sized from an index no layer fills."""
    n_layers = len(found)
    if max(found) != n_layers - 1:
        missing = min(set(range(n_layers + 1)) - found)
        raise WeightsError(f"{checkpoint.path}: the layers {prefix}{family.layers_path}.{{k}} must be numbered from 0 "
                           f"without a gap: layer {missing} is missing but layer {max(found)} is there")
    return n_layers


def model_info(checkpoint: Checkpoint) -> ModelInfo:
    config, config_notes = _config(checkpoint)
    if config is not None:
        refuse_quantised(config)
    family = _family_of(checkpoint, config)
    layers = _layers_by_prefix(checkpoint, family)
    if not layers and _strip_module_prefix(checkpoint):
        layers = _layers_by_prefix(checkpoint, family)
    if not layers:
        said = "config.json" if config is not None and config.path.name == "config.json" else \
            "the model arguments stored in the file"
        raise WeightsError(f"{checkpoint.path}: {said} say{'s' if said == 'config.json' else ''} model_type "
                           f"{family.name!r} but no tensor is named "
                           f"like its layers ({family.layers_path}.{{k}}.{family.marker})")
    prefix, found = max(layers.items(), key=lambda item: len(item[1]))
    _one_copy_of_the_layers(checkpoint, family, prefix, layers)
    family = family.variant(checkpoint, prefix)
    n_layers = _contiguous(checkpoint, family, prefix, found)
    _declared_layers_fit(config, n_layers)
    _tie_embedding(checkpoint, family, prefix, config)
    embedding = f"{prefix}{family.embedding_key}"
    vocab = checkpoint.shape(embedding)[0] if embedding in checkpoint else None
    notes = (*checkpoint.notes, *config_notes, *family.notes(config), *_guessed(family, config))
    return ModelInfo(family, prefix, n_layers, _positions(checkpoint, family, prefix, config), vocab, config, notes)


def _declared_layers_fit(config: Optional[ConfigFile], n_layers: int) -> None:
    if config is None:
        return
    declared = config.integer("n_layer") if "n_layer" in config else config.integer("num_hidden_layers")
    if declared not in (None, n_layers):
        raise WeightsError(f"{config.path} says {declared} layers but the weights hold {n_layers}")


def _positions(checkpoint: Checkpoint, family: Family, prefix: str, config: Optional[ConfigFile]) -> Optional[int]:
    """The positions the model was built for: GPT-2's position table, else what its config says."""
    if f"{prefix}wpe.weight" in checkpoint and isinstance(family, GPT2):
        return checkpoint.shape(f"{prefix}wpe.weight")[0]
    if config is None:
        return None
    for key in ("n_positions", "max_position_embeddings"):
        if key in config:
            return config.integer(key)
    return config.integer("block_size")


def _check_conflict(name: str, from_file, given) -> None:
    if given is not None and from_file is not None and given != from_file:
        option = SIZE_OPTIONS[name]
        raise UsageError(f"{option} {given} conflicts with the checkpoint's {name} = {from_file}: drop {option}")


def _native_config(fields: dict, from_file: set, info: ModelInfo) -> BlockConfig:
    """The checkpoint's own config; a value from config.json that is invalid names the file's key."""
    try:
        return BlockConfig(**gathered_attention(gathered(fields)))
    except ConfigError as error:
        if error.field not in from_file:
            raise
        key = info.family.config_keys.get(error.field, error.field)
        raise WeightsError(f"{info.config.path}: {key} = {fields.get(error.field)!r} does not fit: "
                           f"{in_file_terms(str(error), info.family)}") from None


def in_file_terms(message: str, family: Family) -> str:
    """A config error's message in the config.json's own keys (n_group, not expert_groups): what the user edits.
    Only snake_case field names are translated: a plain word (DeepSeek's "latent") is English in a sentence too."""
    for field, key in {**family.config_keys, **family.nested_keys}.items():
        if "_" in field:
            message = re.sub(rf"\b{re.escape(field)}\b", key, message)
    return message


def _file_fields(family: Family, config: ConfigFile) -> dict:
    """The block settings config.json gives; a value a nested spec refuses (DeepSeek's latent sizes) is said with
    the file and its key."""
    try:
        return {key: value for key, value in family.config_fields(config).items() if value is not None}
    except ConfigError as error:
        raise WeightsError(f"{config.path}: {in_file_terms(str(error), family)}") from None


def checkpoint_config(checkpoint: Checkpoint, info: ModelInfo, overrides: dict) -> BlockConfig:
    """The block config from config.json (or from the shapes), with the user's overrides.

    Sizes come from the file; an explicit size that disagrees is an error. Wiring options
    (placement, causal, eps, ffn) may override the file: that is how `compare` rewires a
    real block.
    """
    family = info.family
    base = info.layer_prefix(0)
    if info.config is None and family.needs_config:
        raise WeightsError(f"{checkpoint.directory} has no config.json, and {family.name}'s keys do not say what its "
                           "blocks compute (other families share them; norm eps, RoPE theta and wiring are not in the "
                           "weights): add the checkpoint's config.json")
    from_config = {} if info.config is None else _file_fields(family, info.config)
    with reading_as(checkpoint, info):
        shapes = family.shape_fields(checkpoint, base)
    _config_fits_tensors(info, shapes, from_config)
    fields = {**shapes, **from_config}
    for name in SIZE_FIELDS:
        _check_conflict(name, fields.get(name), overrides.get(name))
    fields["n_heads"] = _heads(checkpoint, info, fields, overrides)
    fields["n_layers"] = info.n_layers
    native = _native_config(fields, set(from_config), info)
    _embedding_fits(checkpoint, info, native.d_model)
    return native.replace(**{key: value for key, value in overrides.items() if key not in SIZE_FIELDS})


def _heads(checkpoint: Checkpoint, info: ModelInfo, fields: dict, overrides: dict) -> int:
    """The heads the file says, else --heads (the weights' shapes cannot say how d_model splits)."""
    if fields.get("n_heads") is not None:
        return fields["n_heads"]
    if overrides.get("n_heads") is None:
        where = (f"{info.config.path} does not say the number of heads "
                 f"({info.family.config_keys.get('n_heads', 'n_heads')})" if info.config is not None
                 else f"{checkpoint.directory} has no config.json")
        raise UsageError(f"{where}: pass --heads (d_model {fields['d_model']} read from the weights)")
    return overrides["n_heads"]


def _config_fits_tensors(info: ModelInfo, shapes: dict, from_config: dict) -> None:
    """config.json's widths must be the tensors' (else the memory estimate and every shape after are fiction)."""
    for name in ("d_model", "d_ff"):
        if shapes.get(name) is not None and from_config.get(name) is not None and shapes[name] != from_config[name]:
            key = info.family.config_keys.get(name, name)
            raise WeightsError(f"{info.config.path}: {key} = {from_config[name]!r:.30} but the weights' {name} is "
                               f"{shapes[name]}: this config.json does not belong to these weights")


def _embedding_fits(checkpoint: Checkpoint, info: ModelInfo, d_model: int) -> None:
    embedding = f"{info.prefix}{info.family.embedding_key}"
    if embedding in checkpoint and tuple(checkpoint.shape(embedding))[1:] != (d_model,):
        raise WeightsError(f"{checkpoint.path}: the embedding {embedding} has shape {list(checkpoint.shape(embedding))} "
                           f"but the blocks are {d_model} wide: expected [vocabulary, {d_model}]")
