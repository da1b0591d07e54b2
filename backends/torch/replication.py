"""PyTorch data parallelism across processes: ``torch.distributed`` collectives (gloo on CPU,
NCCL on GPU), one process per device, as ``xdevice launch`` or torchrun start them.

Each process takes its rank's slice of every global batch (all processes draw the same
global batches: the order depends only on the seed), weighs its loss by its share of the
rows, and the gradients are summed with ``all_reduce``: the average over the global batch,
as ``DistributedDataParallel`` computes it. Parameters and buffers start as rank 0's
(``broadcast``), as DDP does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


class ProcessReplicas:
    def __init__(self):
        from xdevice.training.launch import initialize

        initialize("torch")
        self.rank, self.count = dist.get_rank(), dist.get_world_size()

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        for value in arrays.values():
            dist.broadcast(value, src=0)
        return arrays

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        return x.tensor_split(self.count)[self.rank], y.tensor_split(self.count)[self.rank]

    def weight(self, x: Any) -> Any:
        rows = torch.tensor(float(x.shape[0]))
        total = rows.clone()
        dist.all_reduce(total)
        return rows / total

    def sum(self, tree: Any) -> Any:
        if isinstance(tree, dict):
            return {k: self.sum(v) for k, v in tree.items()}
        total = tree.clone()
        dist.all_reduce(total)
        return total

    def compile(self, step):
        return step


class Replication:
    def process_replicas(self) -> ProcessReplicas:
        return ProcessReplicas()
