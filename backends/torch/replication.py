"""PyTorch data parallelism across processes: ``DistributedDataParallel`` (gloo on CPU, NCCL on
GPU), one process per device, as ``xdevice launch`` or torchrun start them.

Each process takes its rank's slice of every global batch (all processes draw the same global
batches: the order depends only on the seed) and weighs its loss by its share of the rows.
The gradient comes from DDP: the step's parameters are the ``nn.Parameter``s of a module DDP
wraps, and DDP's reducer all-reduces gradient buckets while ``backward`` is still running.
A communication hook sums the buckets instead of averaging them (the loss is already weighted,
so the sum is the global batch's mean gradient, also with uneven slices). Parameters and
buffers start as rank 0's (``broadcast``), as DDP's own constructor does.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from xdevice._errors import ConfigurationError, message
from xdevice._processes import world
from xdevice.backends import training
from xdevice.backends.torch.autodiff import detached


class _Objective(torch.nn.Module):
    """The module DDP wraps: it owns the parameters and evaluates any objective of them."""

    def __init__(self, params: dict[str, Any]):
        super().__init__()
        self.names = list(params)
        self.weights = torch.nn.ParameterList([torch.nn.Parameter(v.detach().clone()) for v in params.values()])

    def forward(self, objective: Callable) -> Any:
        return objective(dict(zip(self.names, self.weights)))


def _sum_buckets(state, bucket):  # unannotated: DDP checks real annotations, and here they are strings
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda done: done.value()[0])


class ProcessReplicas(training.Replicas):
    def __init__(self, backend: Any):
        super().__init__(backend)
        backend.join_processes()
        self.rank, self.count = dist.get_rank(), dist.get_world_size()
        self.ddp: torch.nn.parallel.DistributedDataParallel | None = None

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

    def value_and_grad(self, objective: Callable, params: dict[str, Any]) -> tuple[tuple[Any, Any], dict[str, Any]]:
        trained = {k: v for k, v in params.items() if v.is_floating_point()}
        if self.ddp is None or self.ddp.module.names != list(trained):
            self.ddp = torch.nn.parallel.DistributedDataParallel(_Objective(trained))
            self.ddp.register_comm_hook(None, _sum_buckets)
        weights = self.ddp.module.weights
        with torch.no_grad():  # this step's values (the optimizer's update is pure)
            for weight, value in zip(weights, trained.values()):
                weight.copy_(value)
                weight.grad = None
        with torch.enable_grad():
            value, aux = self.ddp(lambda p: objective({**params, **p}))
            value.backward()
        found = {k: w.grad for k, w in zip(trained, weights)}  # none for ints and unused params: zeros
        grads = {k: torch.zeros_like(v) if found.get(k) is None else found[k] for k, v in params.items()}
        return (value.detach(), detached(aux)), grads

    def compile(self, step: Callable) -> Callable:
        return step


class Replication:
    def join_processes(self) -> None:
        if dist.is_initialized():
            return
        rank, size = world()
        if "MASTER_ADDR" not in os.environ:
            raise ConfigurationError(
                message(
                    "torch.distributed needs the address of rank 0 to join the other processes",
                    expected="MASTER_ADDR and MASTER_PORT (xdevice launch and torchrun set them)",
                    received="unset",
                    fix="start the script with xdevice launch",
                )
            )
        dist.init_process_group(
            "nccl" if torch.cuda.is_available() else "gloo", init_method="env://", rank=rank, world_size=size
        )
        # left to interpreter exit, gloo's threads can abort the process ("terminate called
        # without an active exception"): leave the group in order, after every rank is done
        atexit.register(_leave_group)

    def process_replicas(self) -> ProcessReplicas:
        return ProcessReplicas(self)


def _leave_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
