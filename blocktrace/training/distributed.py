"""Statistics of a watch under torch.distributed (DDP, or FSDP2's fully_shard): reduced across ranks, as
if one process had seen the concatenated batch.

Every statistic blocktrace records is a sum, a count, a minimum or a maximum at heart — the
moments [n, Σx, Σx², min, max], NaN and Inf counts, the attention's entropy sums and row counts,
the largest logit, each FFN unit's largest activation (so the dead-unit fraction is exact) — so an
all-reduce of each by its own operation, on the device, gives exactly the numbers of the whole
batch. Gradients need nothing: DDP has averaged them already. Weights and gradients that FSDP2
shards are DTensors: their norms and sums cover every shard (blocktrace.host gathers the results).
Only rank 0 writes.

What is no sum — the median token size, the median |x| behind a massive activation, the flat
region of a dead FFN, the residual identity — is read from each rank's own share of the batch, and
rank 0's is written: ESTIMATED names them, and each record's layers say so in their notes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

# The columns of a rank's fingerprint (one all_gather per record): what every rank of a data-parallel run must share
# (the replicated weights after a step, the averaged gradients after a synchronised backward, the learning rate,
# the step, the loss scale) and what each must not (its batch); and the local shards of FSDP2's parameters that a
# mesh dimension replicates (HSDP), equal between the ranks of one replica group; and the optimizer's state of the
# replicated weights, equal where every rank holds the state of the same parameters (ZeRO shards it by design)
FINGERPRINT = ("weights_sum", "weights_square", "grads_sum", "grads_square", "batch_sum", "batch_weighted", "lr",
               "step", "loss_scale", "synchronised", "shards_sum", "shards_square", "replica_group", "state_sum",
               "state_square", "state_held")

ESTIMATED = ("median token size", "massive-activation ratio", "dead FFN's flat-region share", "residual identity")
SUMMED_MOMENTS, MIN_MOMENT, MAX_MOMENT = [0, 1, 2], 3, 4  # columns of tensor_moments' output


class Reducer:
    def __init__(self):
        self.dist = dist
        self.active = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self.is_writer = not self.active or dist.get_rank() == 0
        self.world_size = dist.get_world_size() if self.active else 1

    def note(self) -> list[str]:
        """What a layer's record says under more than one rank."""
        if not self.active:
            return []
        return [f"every statistic covers the {self.world_size} ranks' batches, except the {', '.join(ESTIMATED)}: "
                "rank 0's share of the batch (estimates)"]

    def _all_reduce(self, tensor: torch.Tensor, op) -> torch.Tensor:
        self.dist.all_reduce(tensor, op=op)
        return tensor

    def moments(self, stacked: torch.Tensor) -> torch.Tensor:
        """[steps, 5] moments of this rank's batch -> those of every rank's batch together."""
        if not self.active:
            return stacked
        ops = self.dist.ReduceOp
        reduced = stacked.clone()
        reduced[:, SUMMED_MOMENTS] = self._all_reduce(stacked[:, SUMMED_MOMENTS].contiguous(), ops.SUM)
        reduced[:, MIN_MOMENT] = self._all_reduce(stacked[:, MIN_MOMENT].contiguous(), ops.MIN)
        reduced[:, MAX_MOMENT] = self._all_reduce(stacked[:, MAX_MOMENT].contiguous(), ops.MAX)
        return reduced

    def summed(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor.clone(), self.dist.ReduceOp.SUM) if self.active else tensor

    def largest(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._all_reduce(tensor.clone(), self.dist.ReduceOp.MAX) if self.active else tensor

    def gathered(self, row: torch.Tensor) -> Optional[torch.Tensor]:
        """Every rank's row, as a [world, len(row)] device tensor (None in one process): one collective."""
        if not self.active:
            return None
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        self.dist.all_gather(rows, row.contiguous())
        return torch.stack(rows)

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of a device scalar (the loss), still on the device."""
        if not self.active:
            return value
        return self._all_reduce(value.clone(), self.dist.ReduceOp.SUM) / self.world_size


def is_shard(parameter: torch.Tensor) -> bool:
    """Whether FSDP2 shards the parameter (a DTensor: each rank holds its own part)."""
    return type(parameter).__name__ == "DTensor" or type(parameter.data).__name__ == "DTensor"


def _replicated(model: nn.Module) -> list[torch.Tensor]:
    """The trainable parameters every rank holds whole (FSDP2's shards differ by design)."""
    return [p for p in model.parameters() if p.requires_grad and not is_shard(p)]


def _distributed_tensor(parameter: torch.Tensor):
    """The DTensor behind a parameter FSDP2 manages (the parameter itself, or its data), or None."""
    return next((t for t in (parameter, parameter.data) if hasattr(t, "placements") and hasattr(t, "device_mesh")),
                None)


def _replicated_shards(model: nn.Module) -> tuple[list[torch.Tensor], Optional[int]]:
    """The local shards of the trainable DTensors that some mesh dimension replicates (HSDP: Replicate() on the
    replica dimension, Shard on the other), and this rank's replica group: the index of its coordinates on the
    mesh dimensions that shard, so that two ranks of one group must hold equal shards. Only the parameters laid out
    like the first such one are taken (one mesh, the same dimensions replicated); FSDP2 alone (Shard on every
    dimension) gives none."""
    shards, layout, group = [], None, None
    for parameter in model.parameters():
        tensor = _distributed_tensor(parameter) if parameter.requires_grad else None
        if tensor is None:
            continue
        replicated = tuple(i for i, placement in enumerate(tensor.placements) if placement.is_replicate())
        coordinate = tensor.device_mesh.get_coordinate()
        if not replicated or coordinate is None:
            continue
        if layout is None:
            layout = (tensor.device_mesh, replicated)
            sharding = [i for i in range(tensor.device_mesh.ndim) if i not in replicated]
            shape = tensor.device_mesh.shape
            group = 0
            for dimension in sharding:
                group = group * shape[dimension] + coordinate[dimension]
        if (tensor.device_mesh, replicated) == layout:
            shards.append(tensor.to_local())
    return shards, group


def _sums(tensors: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    if not tensors:
        nan = torch.full((), float("nan"), dtype=torch.float64, device=device)
        return nan, nan
    flat = [t.detach().reshape(-1).double() for t in tensors]
    return torch.stack([f.sum() for f in flat]).sum(), torch.stack([f.dot(f) for f in flat]).sum()


def _optimizer_state(parameters: list[torch.Tensor], optimizer) -> tuple[list[torch.Tensor], float]:
    """The floating-point state tensors the optimizer holds for these parameters (Adam's moments, SGD's momentum),
    and which parameters hold state, as one number: the sum of (index + 1)² over them (two ranks holding the state of
    different parameters, as ZeroRedundancyOptimizer's shards, give different numbers)."""
    state = getattr(optimizer, "state", None)
    if not isinstance(state, dict):
        return [], 0.0
    tensors, held = [], 0.0
    for index, parameter in enumerate(parameters):
        values = state.get(parameter)
        if not values:
            continue
        held += float((index + 1) ** 2)
        tensors += [v for v in values.values() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0]
    return tensors, held


def fingerprint(model: nn.Module, ids: Optional[torch.Tensor], lr: Optional[float], step: int,
                loss_scale: Optional[torch.Tensor], synchronised: Optional[bool], device,
                optimizer=None) -> torch.Tensor:
    """This rank's row of FINGERPRINT, float64 on the device: sums of the replicated weights and of their gradients,
    two sums of the batch's ids (plain and weighted by position, so a reordering shows), the settings, and the sums
    of the replicated shards with their replica group, and those of the optimizer's state of the replicated weights."""
    parameters = _replicated(model)
    weights = _sums(parameters, device)
    shards, group = _replicated_shards(model)
    shard_sums = _sums(shards, device)
    state, held = _optimizer_state(parameters, optimizer)
    state_sums = _sums(state, device)
    grads = _sums([p.grad for p in parameters if p.grad is not None], device)
    nan = torch.full((), float("nan"), dtype=torch.float64, device=device)
    if ids is not None:
        flat = ids.detach().reshape(-1).double().to(device)
        batch = (flat.sum(), (flat * torch.arange(1, flat.numel() + 1, dtype=torch.float64, device=device)).sum())
    else:
        batch = (nan, nan)
    settings = [float("nan") if lr is None else float(lr), float(step),
                float("nan") if synchronised is None else float(synchronised)]
    scale = loss_scale.to(device).double() if loss_scale is not None else nan
    values = [*weights, *grads, *batch, torch.tensor(settings[0], dtype=torch.float64, device=device),
              torch.tensor(settings[1], dtype=torch.float64, device=device), scale,
              torch.tensor(settings[2], dtype=torch.float64, device=device), *shard_sums,
              torch.tensor(float("nan") if group is None else float(group), dtype=torch.float64, device=device),
              *state_sums, torch.tensor(held, dtype=torch.float64, device=device)]
    return torch.stack([v.reshape(()) for v in values])


def synchronised(model: nn.Module) -> Optional[bool]:
    """Whether DDP all-reduces the gradients of this backward (False inside no_sync); None for other models."""
    flag = getattr(model, "require_backward_grad_sync", None)
    return flag if isinstance(flag, bool) else None


def replica_rows(gathered) -> Optional[list[dict]]:
    """The gathered fingerprints as the record holds them: one {column: value} per rank, in rank order."""
    if gathered is None:
        return None
    return [dict(zip(FINGERPRINT, row)) for row in gathered]
