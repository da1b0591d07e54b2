"""``replicate``: where a training step runs, and how replicas agree. The hooks in one place.

A *replicas* object is what the trainer's step (and a custom loop) asks about placement and
agreement; the step itself stays the same on one device, several, or several processes:

- ``place_params(arrays)``: the arrays on every replica (copies of the first one's);
- ``place_batch(x, y)``: the global batch split along axis 0 across the replicas;
- inside the step, ``weight(x)``: this replica's share of the global rows; ``sum(tree)``: the
  sum over replicas; ``value_and_grad(objective, params)``: ``((loss, aux), grads)`` where
  ``grads`` is the gradient of the global batch (the replicas' weighted gradients summed);
- ``compile(step)``: ``step`` compiled and run on every replica, the first one's results back.

Each backend supplies the engine (``Backend.replicas`` / ``Backend.process_replicas``):
JAX a ``Mesh``, TensorFlow ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``, PyTorch
``DistributedDataParallel``. :class:`Replicas` is the one-device case and the defaults.

>>> r = replicate(backend="numpy")
>>> r.place_batch([1, 2], [3, 4]), r.weight(None)
(([1, 2], [3, 4]), 1.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from xdevice import _registry
from xdevice._discovery import find
from xdevice.training.launch import world

__all__ = ["Replicas", "replicate"]


class Replicas:
    """One device: nothing to split, sum or weigh. The defaults backends build on."""

    rank, count = 0, 1  # this replica's index (processes); how many replicas

    def __init__(self, backend: Any):
        self.backend = backend

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return arrays

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        return x, y

    def weight(self, x: Any) -> Any:
        return 1.0

    def sum(self, tree: Any) -> Any:
        return tree

    def value_and_grad(self, objective: Callable, params: dict[str, Any]) -> tuple[tuple[Any, Any], dict[str, Any]]:
        (value, aux), grads = self.backend.value_and_grad(objective, params, has_aux=True)
        return (value, aux), self.sum(grads)

    def compile(self, step: Callable) -> Callable:
        return self.backend.jit(step)


def replicate(devices: Sequence[Any] | None = None, *, backend: str) -> Replicas:
    """The replicas a step runs on: this process's ``devices`` (data-parallel with the
    framework's engine), or one device per process when ``xdevice launch`` started this one.

    Args:
        devices: two or more devices of ``backend`` (``["cpu:0", "cpu:1"]``, ``["gpu:0", "gpu:1"]``);
            None or one device: no replication (unless launched: then one per process).
        backend: the framework whose engine replicates (``"torch"``, ``"jax"``, ``"tensorflow"``).

    Raises:
        ConfigurationError: the backend cannot replicate that way (the error names those that can).
    """
    engine = _registry.backend(backend)  # its hooks refuse what it cannot do, naming who can
    if world()[1] > 1:
        return engine.process_replicas()
    if devices is not None and len(devices) > 1:
        # before the devices are looked up: "torch cannot", not "there is no cpu:1"
        engine.require("supports_replication", "data-parallel replication in one process")
        return engine.replicas([find(d, backend=backend) for d in devices])
    return Replicas(engine)
