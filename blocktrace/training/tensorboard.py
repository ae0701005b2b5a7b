"""The Watch's records as TensorBoard scalars, where one is asked for."""

from __future__ import annotations

from blocktrace.errors import UsageError


def open_tensorboard(target):
    """A TensorBoard writer: an object with add_scalar, or a log directory (needs the tensorboard package)."""
    if target is None or hasattr(target, "add_scalar"):
        return target
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise UsageError("tensorboard= needs the tensorboard package: pip install tensorboard") from None
    return SummaryWriter(str(target))


def write_scalars(writer, entry: dict) -> None:
    """A record's loss, lr and gradient norm, and each layer's RMS, largest logit, lowest entropy and gradient norm."""
    step = entry["step"]
    for key in ("loss", "lr", "grad_norm"):
        if entry[key] is not None:
            writer.add_scalar(f"blocktrace/{key}", entry[key], step)
    for layer in entry["layers"]:
        for key in ("rms", "max_logit", "min_entropy", "grad_norm"):
            if layer[key] is not None:
                writer.add_scalar(f"blocktrace/layer{layer['layer']}/{key}", layer[key], step)
