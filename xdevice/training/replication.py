"""``replicate``: where a training step runs, and how replicas agree.

A replicas object (``xdevice.backends.training.Replicas``, where its hooks are listed) is
what the trainer's step and a custom loop ask about placement and agreement; the step itself
stays the same on one device, several, or several processes. Each backend supplies the engine
(``Backend.replicas`` / ``Backend.process_replicas``): JAX a ``Mesh``, TensorFlow
``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``, PyTorch ``DistributedDataParallel``.

``strategy="fsdp"`` shards the parameters, gradients and optimizer state across the devices
instead of copying them (``Replicas.sharded``): JAX in one process over ``devices=[...]``;
TensorFlow and PyTorch in one process refuse it by name, with the way that works.

>>> r = replicate(backend="numpy")
>>> r.place_batch([1, 2], [3, 4]), r.weight(None)
(([1, 2], [3, 4]), 1.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from xdevice import _registry
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice._processes import launched
from xdevice.backends.training import STRATEGIES, Replicas

__all__ = ["Replicas", "replicate"]


def replicate(devices: Sequence[Any] | None = None, *, backend: str, strategy: str = "replicate") -> Replicas:
    """The replicas a step runs on: this process's ``devices`` (data-parallel with the
    framework's engine), or one device per process when ``xdevice launch`` started this one
    (joining the processes' group first).

    Args:
        devices: two or more devices of ``backend`` (``["cpu:0", "cpu:1"]``, ``["gpu:0", "gpu:1"]``);
            None or one device: no replication (unless launched: then one per process).
        backend: the framework whose engine replicates (``"torch"``, ``"jax"``, ``"tensorflow"``).
        strategy: ``"replicate"`` (every device holds the whole model) or ``"fsdp"`` (each holds
            a shard of the parameters, gradients and optimizer state).

    Raises:
        ConfigurationError: an unknown strategy, or the backend cannot replicate or shard that
            way (the error names the way that works).
    """
    if strategy not in STRATEGIES:
        raise ConfigurationError(
            message(
                "Unknown data-parallel strategy",
                received=strategy,
                choices=STRATEGIES,
                fix="strategy='replicate' copies the model to every device; 'fsdp' shards it across them",
            )
        )
    engine = _registry.backend(backend)  # its hooks refuse what it cannot do, naming who can
    if launched():
        replicas = engine.process_replicas()
    elif devices is not None and len(devices) > 1:
        # before the devices are looked up: "torch cannot", not "there is no cpu:1"
        if not engine.supports_replication:
            raise ConfigurationError(_no_replication(engine, list(devices), strategy))
        replicas = engine.replicas([find(d, backend=backend) for d in devices])
    else:
        replicas = Replicas(engine)
    return replicas.sharded() if strategy == "fsdp" else replicas


def _no_replication(engine: Any, devices: list[Any], strategy: str = "replicate") -> str:
    """Why ``engine`` cannot take several devices in one process, and the way that works."""
    if strategy == "fsdp":  # only JAX shards in one process
        able = [b.title for b in _registry.loaded_backends() if b.name == "jax"]
        elsewhere = f", or build the model with {' or '.join(able)}, which shards in one process" if able else ""
        return message(
            f"{engine.title} cannot do sharded data parallel in one process (strategy='fsdp' with several devices)",
            received=[str(d) for d in devices],
            fix="leave devices= out and run the same script under "
            f"`xdevice launch --nproc-per-node {len(devices)} your_script.py` (each process one device){elsewhere}",
        )
    able = [b.title for b in _registry.loaded_backends() if b.supports_replication]
    elsewhere = f", or build the model with {' or '.join(able)}, which replicate in one process" if able else ""
    if engine.supports_processes:  # PyTorch: one replica per process, started by the launcher
        fix = (
            f"leave devices= out and run the same script under "
            f"`xdevice launch --nproc-per-node {len(devices)} your_script.py` (each process one replica){elsewhere}"
        )
    else:
        fix = f"train on one device (leave devices= out){elsewhere}"
    return message(
        f"{engine.title} cannot do data-parallel replication in one process (devices=[...] with several devices)",
        received=[str(d) for d in devices],
        fix=fix,
    )
