"""What one optimizer step did to the weights it holds, measured around the step after a record.

Four facts the optimizer's own definition fixes, whatever the model, the data or the learning rate:

- **Each weight's move per unit of learning rate.** The audit bounds it for the optimizers whose update is
  m̂/√v̂ or a sign (diagnose/audit.py: `update_exceeds_its_bound`); here each param group's largest
  |Δw| − lr·λ·|w| (the decay's part, by the triangle inequality) − the rounding of w's own dtype, over lr, is
  measured on a strided sample of each tensor: a few thousand elements per tensor copied before the step, read
  again after it, so no full copy of the weights is made.
- **Adam's two moments agree.** By Cauchy–Schwarz |m_t| ≤ C·√v_t for exact arithmetic (both sum the same
  gradients), so a second moment of exactly 0 where the first is well away from 0 was rounded away: a state kept
  or saved in 16 bits. Counted, as the step begins, over every tensor of the optimizer's state that has both: a
  state loaded from a file is seen before its first step rebuilds v (a resumed run's first record), a state kept
  in 16 bits at every step.
- **A first moment is an average of gradients.** Adam's and Lion's exp_avg is (1 − β1)·Σ β1^(t−s)·g_s, weights
  summing to below 1, so its size is at most the largest gradient's within its memory: its RMS over the current
  gradients' is measured as the step begins.
- **A second moment is an average of squared gradients.** Adam's exp_avg_sq becomes β2·v + (1 − β2)·g² (g + λw
  with an L2 decay): a convex combination of its last value and the new square, for any β2 in [0, 1), so each
  element lands between the two. Sampled (strided) as the step begins and read again after it; an element more
  than twice above the larger or below half the smaller is outside every average (the slack covers a 16-bit
  state's rounding).
- **A momentum carries earlier gradients.** For a group with a momentum above 0, the gradient is sampled at the same
  elements as the step begins; the share of the update Δw that no a·g + b·w explains (beyond the rounding) is near 1
  for a velocity kept across steps and 0 for one re-made from the current gradient at each step.

Everything stays on the device until the record's one copy; nothing here raises into the user's step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from blocktrace.diagnose.audit import AVERAGE_SLACK, FIRST_MOMENT_FLOOR, SECOND_MOMENT_FLOOR
from blocktrace.diagnose.weights import squared_norm
from blocktrace.training.distributed import is_shard

SAMPLED = 4096  # elements of each tensor sampled (strided) for its move: enough for a fault that spans a tensor


@dataclass
class _Sampled:
    parameter: torch.Tensor
    stride: int
    before: torch.Tensor
    grad: Optional[torch.Tensor] = None  # the gradient at the same elements, where the group has a momentum


@dataclass
class _SecondMoment:
    """One parameter's second moment sampled as the step begins, with the squares the step may average into it."""
    parameter: torch.Tensor
    stride: int
    before: torch.Tensor  # v at the sampled elements (0 where the state has none yet), float64
    squares: torch.Tensor  # [2, n]: g², and (g + λw)² (λ the group's decay; g² again without one), float64


@dataclass
class _Group:
    lr: float
    decay: float
    sampled: list[_Sampled]
    momentum: float = 0.0


def _number(value) -> Optional[float]:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _stride(parameter: torch.Tensor) -> int:
    """The step between sampled elements of a tensor: SAMPLED of them, or every one of a smaller tensor."""
    return max(1, parameter.numel() // SAMPLED)


def _sample(parameter: torch.Tensor, with_grad: bool = False) -> _Sampled:
    flat = parameter.detach().reshape(-1)
    stride = _stride(flat)
    grad = parameter.grad.detach().reshape(-1)[::stride].clone() if with_grad else None
    return _Sampled(parameter, stride, flat[::stride].clone(), grad)


class StepSample:
    """The sampled weights of every param group as the optimizer's step begins (taken in its pre-hook)."""

    def __init__(self, optimizer, first_step: bool):
        self.moments_lost = moments_lost(optimizer)
        self.first_moment_ratio = first_moment_over_gradient(optimizer)
        self.step = _step_about_to_run(optimizer, first_step)
        self.state, self.second_moments = optimizer.state, _second_moments(optimizer)
        # a velocity exists only where the optimizer held state before this step (torch's SGD sets it to g at its
        # first step: that update is memoryless by definition)
        carried = not first_step and bool(optimizer.state)
        self.groups: list[Optional[_Group]] = []
        for group in optimizer.param_groups:
            lr, decay = _number(group.get("lr")), _number(group.get("weight_decay")) or 0.0
            momentum = (_number(group.get("momentum")) or 0.0) if carried else 0.0
            held = [p for p in group["params"] if p.grad is not None and p.is_floating_point()]
            usable = lr is not None and lr > 0 and held
            self.groups.append(_Group(lr, abs(decay), [_sample(p, momentum > 0) for p in held], momentum)
                               if usable else None)

    @torch.no_grad()
    def moves(self) -> list[Optional[torch.Tensor]]:
        """Per param group (None where none was sampled), as the step has ended: the largest |Δw| beyond the
        decay's part and the rounding, per unit of learning rate, a device scalar."""
        return [None if group is None else self._largest(group) for group in self.groups]

    @staticmethod
    def _largest(group: _Group) -> torch.Tensor:
        largest = []
        for sampled in group.sampled:
            after = sampled.parameter.detach().reshape(-1)[:: sampled.stride].double()
            before = sampled.before.double()
            rounding = 2 * torch.finfo(sampled.before.dtype).eps * torch.maximum(before.abs(), after.abs())
            beyond = (after - before).abs() - group.lr * group.decay * before.abs() - rounding
            largest.append(beyond.amax().to(largest[0].device if largest else beyond.device))
        return torch.stack(largest).amax().clamp_min(0) / group.lr


    @torch.no_grad()
    def memory(self) -> list[Optional[torch.Tensor]]:
        """Per param group with a momentum (None elsewhere), as the step has ended: the part of its sampled update
        Δw that no a·g + b·w explains (least squares over the sampled elements, g the gradient as the step began),
        beyond the weights' rounding, over ‖Δw‖ — a device scalar, NaN where the rounding alone could explain 1%
        of ‖Δw‖. A momentum carries earlier gradients into the update, so only a velocity re-made from the
        current gradient at each step leaves nothing unexplained."""
        return [None if group is None or group.momentum <= 0 else _unexplained(group) for group in self.groups]

    @torch.no_grad()
    def second_moment_outside(self) -> Optional[dict]:
        """As the step has ended: the share of the judged sampled elements whose exp_avg_sq is outside every average
        of its last value and the new square, and how many were judged — device scalars; None where none was
        sampled."""
        if not self.second_moments:
            return None
        device, outside, judged = self.second_moments[0].before.device, [], []
        for sampled in self.second_moments:
            after = _state_tensor(self.state.get(sampled.parameter), sampled.parameter)
            if after is None:
                continue
            slack = 2 * torch.finfo(after.dtype).smallest_normal  # a 16-bit state's values flushed to 0
            after = after.detach().reshape(-1)[:: sampled.stride].double().to(sampled.before.device)
            hull = torch.cat([sampled.before[None], sampled.squares])
            low, high = hull.amin(0), hull.amax(0)
            counted = high > SECOND_MOMENT_FLOOR
            beyond = (after > AVERAGE_SLACK * high + slack) | (after < low / AVERAGE_SLACK - slack) | after.isnan()
            outside.append((beyond & counted).sum().to(device))
            judged.append(counted.sum().to(device))
        if not judged:
            return None
        outside, judged = torch.stack(outside).sum(), torch.stack(judged).sum()
        return {"share": outside.double() / judged.clamp_min(1), "judged": judged}


def _state_tensor(state, parameter: torch.Tensor) -> Optional[torch.Tensor]:
    """The optimizer state's exp_avg_sq for this parameter where it is a plain floating tensor of its shape."""
    second = state.get("exp_avg_sq") if isinstance(state, dict) else None
    if type(second) is not torch.Tensor or second.shape != parameter.shape or not second.is_floating_point():
        return None  # a factored (Adafactor), projected (GaLore), quantised or sharded state: not this average
    return second


def _second_moments(optimizer) -> list[_SecondMoment]:
    """Every parameter with a gradient whose optimizer state keeps an exp_avg_sq of its shape, or keeps nothing yet
    (its first step: v starts at 0, as Adam's definition has it), sampled where `_sample` samples its weights; a
    state of another kind is not judged."""
    sampled = []
    for group in optimizer.param_groups:
        decay = _number(group.get("weight_decay")) or 0.0
        for parameter in group["params"]:
            grad, state = parameter.grad, optimizer.state.get(parameter)
            second = _state_tensor(state, parameter)
            if (second is None and state) or type(grad) is not torch.Tensor or grad.is_sparse \
                    or not parameter.is_floating_point() or is_shard(parameter):
                continue
            stride = _stride(parameter)
            g = grad.detach().reshape(-1)[::stride].double()
            w = parameter.detach().reshape(-1)[::stride].double().to(g.device)
            before = torch.zeros_like(g) if second is None else second.detach().reshape(-1)[::stride].double()
            sampled.append(_SecondMoment(parameter, stride, before.to(g.device),
                                         torch.stack([g * g, (g + decay * w) ** 2])))
    return sampled


MEMORY_ROUNDING = 0.01  # judged only where 4 × the weights' rounding is below this share of the update


def _unexplained(group: _Group) -> torch.Tensor:
    """StepSample.memory for one group: float64 on the sampled elements' device."""
    device = group.sampled[0].before.device
    before = torch.cat([s.before.double().to(device) for s in group.sampled])
    after = torch.cat([s.parameter.detach().reshape(-1)[:: s.stride].double().to(device) for s in group.sampled])
    grad = torch.cat([s.grad.double().to(device) for s in group.sampled])
    moved = after - before
    rounding = torch.linalg.vector_norm(torch.cat([2 * torch.finfo(s.before.dtype).eps * s.before.double().abs().to(
        device) for s in group.sampled]))
    basis = torch.stack([grad, before], dim=1)
    fit = torch.linalg.pinv(basis.T @ basis) @ (basis.T @ moved)  # pinv: a zero gradient or weight column is fine
    residual = torch.linalg.vector_norm(moved - basis @ fit)
    size = torch.linalg.vector_norm(moved)
    judged = 4 * rounding <= MEMORY_ROUNDING * size
    unexplained = (residual - 4 * rounding).clamp_min(0) / size.clamp_min(1e-300)
    return torch.where(judged, unexplained, torch.full_like(unexplained, float("nan")))


def _step_about_to_run(optimizer, first_step: bool) -> Optional[int]:
    """The step count t the optimizer's bias corrections will use in the step that begins: one past the largest
    "step" its state keeps; 1 at the first step the Watch saw with no state at all; None when it keeps no count."""
    counts = [_number(state.get("step")) for state in optimizer.state.values() if isinstance(state, dict)]
    counts = [count for count in counts if count is not None]
    if counts:
        return int(max(counts)) + 1
    return 1 if first_step and not optimizer.state else None


@torch.no_grad()
def moments_lost(optimizer) -> Optional[torch.Tensor]:
    """Elements of the optimizer's state whose second moment (exp_avg_sq) is exactly 0 while the first (exp_avg)
    is above FIRST_MOMENT_FLOOR, a device count; None where no state holds both."""
    counts = []
    for state in optimizer.state.values():
        if not isinstance(state, dict):
            continue
        first, second = state.get("exp_avg"), state.get("exp_avg_sq")
        if not (isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor)) or first.shape != second.shape:
            continue
        lost = ((second == 0) & (first.abs() > FIRST_MOMENT_FLOOR)).sum()
        counts.append(lost.to(counts[0].device) if counts else lost)
    return torch.stack(counts).sum() if counts else None


@torch.no_grad()
def first_moment_over_gradient(optimizer) -> Optional[torch.Tensor]:
    """RMS of the optimizer's first moments (exp_avg: Adam's, Lion's) over RMS of the gradients they average, as the
    step begins, over the parameters with both and a gradient not all 0 — a device scalar; None where none has."""
    moment_squares, grad_squares = [], []
    for parameter, state in optimizer.state.items():
        first = state.get("exp_avg") if isinstance(state, dict) else None
        grad = getattr(parameter, "grad", None)
        if type(first) is not torch.Tensor or type(grad) is not torch.Tensor or first.shape != grad.shape:
            continue  # a sharded or quantised state, or a parameter without a gradient this step
        moment_squares.append(squared_norm(first))  # (no full-size float64 copy of every state and gradient)
        grad_squares.append(squared_norm(grad))
    if not grad_squares:
        return None
    device = grad_squares[0].device
    moments, grads = torch.stack([m.to(device) for m in moment_squares]), torch.stack(
        [g.to(device) for g in grad_squares])
    reached = grads > 0  # a parameter the loss did not reach this step keeps its average, rightly
    return (torch.where(reached, moments, 0).sum() / torch.where(reached, grads, 0).sum().clamp_min(1e-300)).sqrt()
