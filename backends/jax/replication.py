"""JAX data parallelism: a ``Mesh`` over the devices, params replicated, the batch sharded.

JAX sees the global batch as one array split across the mesh, so the step is the
one-device step under ``jax.jit``: XLA inserts the all-reduce of the gradients. The
loss is already the global mean, so ``weight`` is 1 and ``sum`` is the identity.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message


class Replicas:
    def __init__(self, devices: list[Any]):
        import numpy as np

        self.mesh = Mesh(np.array(devices), ("data",))
        self.count = len(devices)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.split = NamedSharding(self.mesh, PartitionSpec("data"))

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return {k: jax.device_put(v, self.replicated) for k, v in arrays.items()}

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        rows = x.shape[0]
        if rows % self.count:
            raise ConfigurationError(message(
                f"A batch of {rows} rows cannot be split evenly over {self.count} devices",
                expected=f"a multiple of {self.count}", received=rows,
                fix="choose batch_size as a multiple of the device count, and drop_last for the remainder"))
        return jax.device_put(x, self.split), jax.device_put(y, self.split)

    def weight(self, x: Any) -> float:
        return 1.0

    def sum(self, tree: Any) -> Any:
        return tree

    def compile(self, step):
        return jax.jit(step)


class Replication:
    def replicas(self, devices: list[Device]) -> Replicas:
        return Replicas([self.native_device(d) for d in devices])
