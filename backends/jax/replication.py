"""JAX data parallelism: a ``Mesh`` over the devices, params replicated, the batch sharded.

JAX sees the global batch as one array split across the mesh, so the step is the
one-device step under ``jax.jit`` (the defaults of ``xdevice.training.replication.Replicas``):
XLA inserts the all-reduce of the gradients. The loss is already the global mean, so
``weight`` is 1 and ``sum`` is the identity.

Across processes (``jax.distributed``, joined when ``xdevice launch`` started this one) the
mesh spans every process's devices and the same jitted step runs in each (SPMD). Every
process holds the same global batch (the order depends on the seed only) and gives JAX
host copies, from which each keeps the rows of its own devices; params start as process
0's (``broadcast_one_to_all``), as DDP starts from rank 0's.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message
from xdevice.training import replication


class Replicas(replication.Replicas):
    def __init__(self, backend: Any, devices: list[Any]):
        super().__init__(backend)
        self.mesh = Mesh(np.array(devices), ("data",))
        self.count = len(devices)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.split = NamedSharding(self.mesh, PartitionSpec("data"))
        self.rank = jax.process_index()
        self.processes = jax.process_count() > 1

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        if self.processes:  # a mesh over other processes' devices takes host values
            from jax.experimental import multihost_utils

            arrays = multihost_utils.broadcast_one_to_all({k: np.asarray(v) for k, v in arrays.items()})
        return {k: jax.device_put(v, self.replicated) for k, v in arrays.items()}

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        rows = x.shape[0]
        if rows % self.count:
            raise ConfigurationError(message(
                f"A batch of {rows} rows cannot be split evenly over {self.count} devices",
                expected=f"a multiple of {self.count}", received=rows,
                fix="choose batch_size as a multiple of the device count, and drop_last for the remainder"))
        if self.processes:
            x, y = np.asarray(x), np.asarray(y)
        return jax.device_put(x, self.split), jax.device_put(y, self.split)


class Replication:
    def replicas(self, devices: list[Device]) -> Replicas:
        return Replicas(self, [self.native_device(d) for d in devices])

    def process_replicas(self) -> Replicas:
        from xdevice.training.launch import initialize

        initialize("jax")  # already joined when the backend loaded; a no-op then
        # the mesh spans every process's devices
        return Replicas(self, jax.devices())
