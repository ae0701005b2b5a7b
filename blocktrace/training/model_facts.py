"""What the Watch reads of the model's own modules and parameters, at its construction and at each record: the
dropout and batch-norm modules in eval mode, the largest dropout rate, whether a tied head is one tensor with the
embedding, which parameters are the embedding and the head, which embedding tables the forward renormalises, the
frozen matrices that hold only zeros, modules given a `requires_grad` attribute their parameters contradict, and
whether a forward computes in float16."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from blocktrace.training.distributed import is_shard
from blocktrace.vocab import Exterior

DROPOUTS = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
EVAL_SENSITIVE = (*DROPOUTS, nn.modules.batchnorm._BatchNorm)  # what model.eval() switches


def eval_mode_modules(model: nn.Module) -> int:
    """Dropout (p > 0) and batch-norm modules in eval mode: what model.eval() switches."""
    return sum(1 for m in model.modules() if isinstance(m, EVAL_SENSITIVE) and not m.training
               and getattr(m, "p", 1.0) > 0)


def largest_dropout(model: nn.Module) -> Optional[dict]:
    """The model's largest dropout rate and the module holding it (None without a dropout module): the setting the
    audit reads (diagnose/audit.py); a rate a forward passes to F.dropout itself is not seen."""
    rates = [(float(m.p), name) for name, m in model.named_modules() if isinstance(m, DROPOUTS)]
    if not rates:
        return None
    rate, name = max(rates)
    return {"p": rate, "module": name or "the model"}


NAMED_MODULES = 3  # modules a record names where a finding lists several


def requires_grad_attributes(model: nn.Module) -> Optional[list[dict]]:
    """The modules holding a `requires_grad` attribute of their own (an nn.Module has none: torch reads the flag on
    each parameter, which requires_grad_() sets) that some of their parameters contradict: the module, the value set
    and how many of its parameters differ; None where none does. One dictionary lookup a module."""
    found = []
    for name, module in model.named_modules():
        value = vars(module).get("requires_grad")
        if not isinstance(value, bool):
            continue
        parameters = list(module.parameters())
        differing = sum(1 for p in parameters if p.requires_grad != value)
        if differing:
            found.append({"module": name or "the model", "value": value, "differing": differing,
                          "parameters": len(parameters)})
    return found[:NAMED_MODULES] or None


def embeddings_untied(model: nn.Module) -> Optional[dict]:
    """An HF model whose config ties the output embedding to the input one (`tie_word_embeddings`): whether they are
    one tensor, as HF makes them; None for a model that says nothing of it (a hand-written one) or has no head."""
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(text, "tie_word_embeddings", None) is not True:
        return None
    try:
        head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return None
    weights = [getattr(module, "weight", None) for module in (head, embedding)]
    if not all(isinstance(weight, torch.Tensor) for weight in weights):
        return None
    return {"tied": weights[0] is weights[1] or weights[0].data_ptr() == weights[1].data_ptr()}


def exterior_parameters(model: nn.Module) -> dict[int, set]:
    """id(parameter) → its roles among the model's input and output layers: every nn.Embedding's weight (tokens and
    learned positions: the input layer) and HF's input embedding, the output head (HF's output embedding; without
    one, the last nn.Linear whose width is the largest embedding table's, i.e. the vocabulary). A tied head is both."""
    roles: dict[int, set] = {}

    def mark(weight, role: Exterior) -> None:
        if isinstance(weight, torch.Tensor):
            roles.setdefault(id(weight), set()).add(role)

    embeddings = [m for m in model.modules() if isinstance(m, nn.Embedding)]
    for module in embeddings:
        mark(module.weight, Exterior.EMBEDDING)
    try:  # an HF model says which are its layers (a base model has no head)
        mark(getattr(model.get_input_embeddings(), "weight", None), Exterior.EMBEDDING)
        head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        head = _hand_written_head(model, embeddings)
    mark(getattr(head, "weight", None), Exterior.HEAD)
    return roles


def renormed_by_forward(model: nn.Module) -> frozenset:
    """ids of the embedding tables whose forward rescales the rows it looks up, in place (`max_norm`): weights the
    forward writes by definition, each row at its first look-up by as much as it exceeds the norm."""
    return frozenset(id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding) and m.max_norm is not None)


def _hand_written_head(model: nn.Module, embeddings: list[nn.Embedding]) -> Optional[nn.Module]:
    """The last nn.Linear as wide as the largest embedding table (the vocabulary); without one, that table itself:
    logits made with its own weight (nanoGPT's tied `x @ wte.weight.T`)."""
    if not embeddings:
        return None
    table = max(embeddings, key=lambda m: m.num_embeddings)
    linear = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == table.num_embeddings]
    return linear[-1] if linear else table


def token_embedding(model: nn.Module) -> Optional[tuple[str, torch.Tensor]]:
    """The model's token embedding table, named: HF's input embedding, else the nn.Embedding with the most rows (the
    vocabulary; learned positions have fewer); None without one."""
    try:
        table = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        table = None
    embeddings = {m: name for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
    if not isinstance(table, nn.Embedding):
        table = max(embeddings, key=lambda m: m.num_embeddings) if embeddings else None
    return None if table is None else (embeddings.get(table, "the token embedding"), table.weight)


class ZeroTokenEmbedding:
    """Whether the token embedding holds only zeros, read once, at the first record (a shard's zeros say nothing of
    the table)."""

    def __init__(self):
        self.read = False

    def evidence(self, model: nn.Module) -> Optional[dict]:
        if self.read:
            return None
        self.read = True
        found = token_embedding(model)
        if found is None or is_shard(found[1]):
            return None
        name, weight = found
        return {"name": name, "zero": weight.detach().count_nonzero().eq(0)}

    @staticmethod
    def settle(read: Optional[dict]) -> Optional[str]:
        """On the host: the table's name where it is all zeros, else None."""
        return read["name"] if read and read["zero"] else None


class FrozenAtZero:
    """The model's frozen matrices — floating parameters of two or more axes that require no gradient, each rank's
    whole (a shard's zeros say nothing of the tensor) — that hold only zeros. Every frozen matrix is read at the
    first record; from then on only those found at 0 (a frozen tensor moves only by a write outside the optimizer),
    so a large frozen base model is read once."""

    def __init__(self):
        self.watched: Optional[dict[str, torch.Tensor]] = None  # name → parameter; None before the first record

    def evidence(self, model: nn.Module) -> Optional[dict]:
        """The names read and, on the device, whether each holds only zeros (None: no frozen matrix to read)."""
        if self.watched is None:
            self.watched = {name: p for name, p in model.named_parameters()
                            if p.is_floating_point() and p.dim() >= 2 and not p.requires_grad and not is_shard(p)}
        if not self.watched:
            return None
        device = next(iter(self.watched.values())).device
        return {"names": list(self.watched),
                "zero": torch.stack([p.detach().count_nonzero().eq(0).to(device) for p in self.watched.values()])}

    def settle(self, read: Optional[dict]) -> Optional[list[str]]:
        """On the host: the names of the matrices at 0, which alone are read from then on."""
        if read is None:
            return None
        at_zero = [name for name, is_zero in zip(read["names"], read["zero"]) if is_zero]  # to_host: a list
        self.watched = {name: self.watched[name] for name in at_zero}
        return at_zero


def causal_model(model: nn.Module) -> bool:
    """An HF model class for next-token prediction (its name says so)."""
    name = type(model).__name__
    return type(model).__module__.startswith("transformers.") and name.endswith(("ForCausalLM", "LMHeadModel"))


def computes_in_float16(model: nn.Module) -> bool:
    """Whether a forward running now computes in float16: under autocast to float16 on the device of the model's
    parameters, or with float16 parameters of its own."""
    parameter = next((p for p in model.parameters() if p.is_floating_point()), None)
    if parameter is None:
        return False
    return parameter.dtype is torch.float16 or _autocast_dtype(parameter.device.type) is torch.float16


def _autocast_dtype(device_type: str) -> Optional[torch.dtype]:
    """The dtype autocast computes in on this kind of device (None: autocast is off there)."""
    try:
        return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    except (TypeError, AttributeError, RuntimeError):  # torch < 2.4: one function per kind of device
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if device_type == "cuda" and torch.is_autocast_enabled() else None


AUTOCAST_PROBED_ROWS = 64  # rows of one weight whose autocast copy is probed: a few thousand elements


def stale_autocast_casts(model: nn.Module) -> Optional[dict]:
    """Under an autocast context still open at the record, with its cast cache on: the share of the first
    nn.Linear's (or HF Conv1D's) float32 weight rows whose low-precision copy, as that autocast serves it to a
    matmul, differs from the weight's values now — a device scalar with the weight's name; None elsewhere.

    Why it must be 0: autocast caches the cast of each leaf weight that requires a gradient until its outermost
    context exits (torch.autocast's documentation), so within one forward every use of a weight shares one cast of
    its current values. A context held across optimizer.step() serves the casts made before the step ever after:
    the forward computes with the weights of the step the context opened at. The probe is an identity matmul
    (exact: each output is 1·w + 0·…), so a fresh cast reproduces w's own rounding."""
    found = _first_linear_weight(model)
    if found is None:
        return None
    name, weight = found
    dtype = _autocast_dtype(weight.device.type)
    if dtype is None or dtype is torch.float32 or not torch.is_autocast_cache_enabled():
        return None
    rows = min(AUTOCAST_PROBED_ROWS, weight.shape[0])
    with torch.no_grad():
        served = torch.mm(torch.eye(rows, weight.shape[0], device=weight.device), weight)
        fresh = weight[:rows].to(served.dtype)
        finite = fresh.isfinite()
        differing = ((served != fresh) & finite).sum() / finite.sum().clamp_min(1)
    return {"name": name, "share": differing}


def _first_linear_weight(model: nn.Module) -> Optional[tuple[str, torch.Tensor]]:
    """The first float32 leaf weight, requiring a gradient and whole on this rank, of an nn.Linear or an HF Conv1D
    (the modules whose matmuls autocast casts; an embedding's lookup it does not)."""
    for name, module in model.named_modules():
        weight = module.weight if isinstance(module, nn.Linear) or type(module).__name__ == "Conv1D" else None
        if (isinstance(weight, torch.Tensor) and weight.dtype is torch.float32 and weight.requires_grad
                and weight.is_leaf and weight.dim() == 2 and not is_shard(weight)):
            return f"{name}.weight", weight
    return None
