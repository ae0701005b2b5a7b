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

import torch
import torch.distributed as dist

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

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of a device scalar (the loss), still on the device."""
        if not self.active:
            return value
        return self._all_reduce(value.clone(), self.dist.ReduceOp.SUM) / self.world_size
