"""Attention written by hand, seen: the softmax an attention module computes, and the scores it is computed from.

The tutorials' attention is `softmax(q·kᵀ/√d + mask)` in plain torch calls, with no fused kernel to wrap and no
weights returned. While the attention module of a traced block runs, `SoftmaxSeen` — a TorchFunctionMode, as
torch's FlopCounterMode and DebugMode intercept calls — keeps each softmax over the last dimension of a tensor of
two or more dimensions: its input is the scores as masked (a bool mask's masked_fill, an additive mask or bias such
as ALiBi already applied), its output the weights. A softmax elsewhere in the block (a router, the output layer)
is outside the module, so it is never taken for the attention. Nothing is intercepted outside that module's call,
and the mode's calls go to the same kernels: what training computes is unchanged.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

SOFTMAXES = frozenset({torch.softmax, F.softmax, torch.Tensor.softmax, torch.special.softmax})
PRODUCTS = frozenset({torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm})
DIVISIONS = frozenset({torch.div, torch.true_divide, torch.Tensor.div, torch.Tensor.__truediv__})
SCALINGS = DIVISIONS | {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__}
# what weights pass through between their softmax and the product with v, each keeping their shape and axes
KEEPING_AXES = frozenset({F.dropout, torch.dropout, torch.Tensor.masked_fill, torch.masked_fill, torch.Tensor.type_as,
                          torch.Tensor.to, torch.Tensor.float, torch.Tensor.contiguous})


def _dim(args: tuple, kwargs: dict) -> Optional[int]:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim if isinstance(dim, int) else None


class SoftmaxSeen(TorchFunctionMode):
    """Every softmax over the last dimension computed while active, as (scores, weights), detached; and the scale
    the code multiplied a matrix product by (q·kᵀ × c, or ÷ 1/c), with that product's contracted width (the head
    dimension), when it did so by a plain number — None where the scale was folded in elsewhere (into q)."""

    def __init__(self):
        super().__init__()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.products: list[tuple[torch.Tensor, int]] = []  # matrix products made, with their contracted width
        self.scale: Optional[tuple[float, int]] = None
        self.normalised: list[tuple[torch.Tensor, int]] = []  # every softmax's output, with the axis it normalised
        # (the axis a softmax normalised, the axis a product then summed its output over) where the two differ
        self.contracted_elsewhere: Optional[tuple[int, int]] = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        if func in SOFTMAXES and isinstance(output, torch.Tensor) and output.dim() >= 2 and _dim(args, kwargs) is not None:
            axis = _dim(args, kwargs) % output.dim()
            self.normalised.append((output, axis))
            if axis == output.dim() - 1 and isinstance(args[0], torch.Tensor):
                self.seen.append((args[0].detach(), output.detach()))
        elif func in KEEPING_AXES and args and isinstance(output, torch.Tensor):
            axis = self._axis_of(args[0])
            if axis is not None and output.shape == args[0].shape:
                self.normalised.append((output, axis))
        if func in PRODUCTS and len(args) == 2:
            self._contracted(*args)
        if func in PRODUCTS and isinstance(output, torch.Tensor) and output.dim() >= 2 and not self.seen:
            self.products.append((output, args[0].shape[-1]))
        elif func in SCALINGS and self.scale is None and len(args) == 2:
            self._scaled(func, *args)
        return output

    def _axis_of(self, tensor) -> Optional[int]:
        """The axis `tensor` was normalised over by a softmax seen (through dropout, masking or a cast), if any."""
        return next((axis for output, axis in self.normalised if output is tensor), None)

    def _contracted(self, left, right) -> None:
        """A product summing a softmax's output over an axis other than the one it normalised: the weights it
        applies are no distribution over what it sums (left @ right sums left's last axis, right's second last)."""
        for operand, summed in ((left, -1), (right, -2)):
            axis = self._axis_of(operand) if isinstance(operand, torch.Tensor) and operand.dim() >= 2 else None
            if axis is not None and axis != summed % operand.dim() and self.contracted_elsewhere is None:
                self.contracted_elsewhere = (axis - operand.dim(), summed)

    def _scaled(self, func, left, right) -> None:
        tensor, number = (left, right) if isinstance(right, (int, float)) else (right, left)
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number == 0:
            return
        width = next((width for product, width in self.products if product is tensor), None)
        if width is not None:
            self.scale = (1 / number if func in DIVISIONS else float(number), width)


def as_heads(scores: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores and weights as `[B, H, rows, keys]` in float32 (one head, one sequence where the code has none), the
    scores' masked entries (−inf) at float32's lowest finite value, as sdpa's measurement writes them: p·s is then
    0 where p is 0, never NaN."""
    if weights.dim() == 2:  # [rows, keys]: one sequence
        scores, weights = scores.unsqueeze(0), weights.unsqueeze(0)
    if weights.dim() == 3:  # [B, rows, keys]: one head
        scores, weights = scores.unsqueeze(1), weights.unsqueeze(1)
    scores = scores.float().clamp_min(torch.finfo(torch.float32).min)
    return scores, weights.float()
