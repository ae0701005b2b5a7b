"""The memory guard: before any block is built, refuse a request whose blocks and activations would not fit the
device's free memory (sizing estimates them), naming what would not fit."""

from __future__ import annotations

import torch

from blocktrace.config import BlockConfig
from blocktrace.model.layers import attention_chunk_bytes
from blocktrace.request import Analysis, RunRequest
from blocktrace.sizing import Shape, estimate_bytes, require_fit
from blocktrace.sources.source import resolve_device, torch_dtype


def memory_guard(request: RunRequest, analysis: Analysis, n_layers: int, kept_streams: int = 0):
    """The memory guard for `n_layers` blocks of whatever config and input shape the source settles on, and
    `kept_streams` copies of the residual stream held besides (each layer's input, for a layer-by-layer backward)."""
    element = torch.empty((), dtype=torch_dtype(request.dtype)).element_size()

    device = resolve_device(request.device)

    def fits(config: BlockConfig, shape: Shape) -> None:
        needed = estimate_bytes(config, n_layers, shape, element, grad=analysis.grad,
                                keep_tensors=analysis.keep_tensors, chunk_bytes=attention_chunk_bytes(device),
                                attn_chunk=request.attn_chunk, kept_streams=kept_streams)
        what = (f"{n_layers} block{'s' if n_layers > 1 else ''} of d_model {config.d_model}, d_ff {config.d_ff} "
                f"on {shape.batch}×{shape.tokens} tokens{', with gradients' if analysis.grad else ''}")
        require_fit(needed, device, what)
    return fits
