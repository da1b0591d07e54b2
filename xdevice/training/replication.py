"""``replicate``: where a training step runs, and how replicas agree.

A replicas object (``xdevice.backends.training.Replicas``, where its hooks are listed) is
what the trainer's step and a custom loop ask about placement and agreement; the step itself
stays the same on one device, several, or several processes. Each backend supplies the engine
(``Backend.replicas`` / ``Backend.process_replicas``): JAX a ``Mesh``, TensorFlow
``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``, PyTorch ``DistributedDataParallel``.

``strategy="fsdp"`` shards the parameters, gradients and optimizer state across the devices
instead of copying them (``Replicas.sharded``): JAX over ``devices=[...]`` in one process or
across the processes ``xdevice launch`` started, PyTorch across launched processes (FSDP2
``fully_shard``); TensorFlow,
and PyTorch in one process, refuse it by name, with the way that works.

``mesh={"data": 2, "model": 2}`` lays the devices out as a grid: the batch is split over
``data``, and the zoo transformers' attention and MLP layers and token embedding over ``model`` (tensor
parallelism, Megatron-LM's layout, ``xdevice.backends.training.tensor_parallel_axis``): JAX
over ``devices=[...]`` in one process or across the processes ``xdevice launch`` started (one
global ``Mesh``), PyTorch across launched processes (DTensor; in one process it refuses, with the
launch line), ``d * m`` processes of one device each; TensorFlow refuses a ``model`` axis by name.

>>> r = replicate(backend="numpy")
>>> r.place_batch([1, 2], [3, 4]), r.weight(None)
(([1, 2], [3, 4]), 1.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from xdevice import _registry
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message, nearest
from xdevice._processes import launched, world
from xdevice.backends.training import MESH_AXES, STRATEGIES, Replicas

__all__ = ["Replicas", "mesh_shape", "replicate"]


def mesh_shape(mesh: Mapping[str, int] | None, devices: int) -> tuple[int, int]:
    """``(data, model)``: how many ways ``mesh`` splits the batch and the layers over
    ``devices`` devices; without a mesh, the batch over all of them.

    >>> mesh_shape({"data": 2, "model": 2}, 4), mesh_shape({"model": 4}, 4), mesh_shape(None, 2)
    ((2, 2), (1, 4), (2, 1))

    Raises:
        ConfigurationError: an axis other than ``data`` and ``model``, a size below 1, or
            sizes whose product is not the device count.
    """
    if mesh is None:
        return max(devices, 1), 1
    data, model = _sizes(mesh)
    if data * model != devices:
        raise ConfigurationError(
            message(
                "A mesh's axis sizes multiply to the number of devices it lays out",
                expected=f"positive ints whose product is {devices} (len(devices))",
                received=mesh,
                fix=f"e.g. mesh={{'data': {max(devices // 2, 1)}, 'model': {2 if devices > 1 else 1}}} "
                "with devices=[...] that many",
            )
        )
    return data, model


def _sizes(mesh: Any) -> tuple[int, int]:
    """``(data, model)`` as ``mesh`` names them (an axis left out is 1), before any device is
    counted: refused unless a dict of the axes ``data`` and ``model`` to positive ints."""
    unknown = sorted(map(str, set(mesh) - set(MESH_AXES))) if isinstance(mesh, Mapping) else mesh
    if unknown or not mesh:
        misspelt = nearest(unknown[0], MESH_AXES) if isinstance(mesh, Mapping) and unknown else None
        raise ConfigurationError(
            message(
                "A mesh names its axes and their sizes",
                expected="a dict such as {'data': 2, 'model': 2}",
                received=mesh,
                choices=MESH_AXES,
                suggestion=misspelt,
            )
        )
    sizes = [mesh.get(axis, 1) for axis in MESH_AXES]
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
        raise ConfigurationError(
            message(
                "A mesh's axis sizes are positive ints",
                expected="a dict such as {'data': 2, 'model': 2}",
                received=mesh,
            )
        )
    return sizes[0], sizes[1]


def replicate(
    devices: Sequence[Any] | None = None,
    *,
    backend: str,
    strategy: str = "replicate",
    mesh: dict[str, int] | None = None,
) -> Replicas:
    """The replicas a step runs on: this process's ``devices`` (data-parallel with the
    framework's engine), or one device per process when ``xdevice launch`` started this one
    (joining the processes' group first).

    Args:
        devices: two or more devices of ``backend`` (``["cpu:0", "cpu:1"]``, ``["gpu:0", "gpu:1"]``);
            None or one device: no replication (unless launched: then one per process).
        backend: the framework whose engine replicates (``"torch"``, ``"jax"``, ``"tensorflow"``).
        strategy: ``"replicate"`` (every device holds the whole model) or ``"fsdp"`` (each holds
            a shard of the parameters, gradients and optimizer state).
        mesh: ``{"data": d, "model": m}`` (``d * m == len(devices)``, an axis left out is 1):
            the batch split ``d`` ways and, with ``m > 1``, the transformers' layers ``m`` ways
            (tensor parallel: JAX over ``devices`` in one process, JAX and PyTorch across the
            processes ``xdevice launch`` started, one device each, ``d * m`` of them); None:
            ``{"data": len(devices)}``.

    Raises:
        ConfigurationError: an unknown strategy or a mesh that does not fit the devices, or the
            backend cannot replicate, shard or split that way (the error names the way that works).
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
    sizes = _sizes(mesh) if mesh is not None else None  # the mesh's own form first, before any engine
    engine = _registry.backend(backend)  # its hooks refuse what it cannot do, naming who can
    # under xdevice launch with no devices= a mesh lays out the processes, one device each
    count = len(devices) if devices is not None else (world()[1] if launched() else 1)
    if sizes is not None and sizes[1] > 1 and devices is None and count == 1:
        if not engine.supports_replication and engine.supports_tensor_parallel:  # meant for launched processes
            layout = f"mesh={{'data': {sizes[0]}, 'model': {sizes[1]}}}"
            raise ConfigurationError(_split_across_processes(engine, layout, sizes[0] * sizes[1], None))
    data, model = mesh_shape(mesh, count)
    if model > 1:
        return _tensor_parallel(engine, list(devices or []), strategy, data, model)
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


def _tensor_parallel(engine: Any, devices: list[Any], strategy: str, data: int, model: int) -> Replicas:
    """The replicas of a mesh with a ``model`` axis, refused before any device or process is
    touched where the engine has no tensor-parallel layout or it is combined with fsdp."""
    layout = f"mesh={{'data': {data}, 'model': {model}}}"
    if strategy != "replicate":
        raise ConfigurationError(
            message(
                "A mesh with a 'model' axis splits the layers; sharding the rest as well (strategy='fsdp') "
                "is not done here",
                received=f"strategy={strategy!r} with {layout}",
                fix="leave strategy out with the mesh, or drop the 'model' axis for fsdp",
            )
        )
    if not engine.supports_tensor_parallel:
        able = [b.title for b in _registry.loaded_backends() if b.supports_tensor_parallel]
        elsewhere = f"build the model with {' or '.join(able)}, which splits them over devices=[...], or "
        elsewhere = elsewhere if able else ""
        raise ConfigurationError(
            message(
                f"{engine.title} has no tensor-parallel layout here: xdevice does not split a model's attention "
                "and MLP layers across devices on it (a mesh with a 'model' axis)",
                received=layout,
                fix=f"{elsewhere}drop the 'model' axis (mesh={{'data': N}} is data parallel)",
            )
        )
    if launched():
        return engine.process_replicas().tensor_parallel(data, model)
    if not engine.supports_replication:  # PyTorch: one device per process, started by the launcher
        raise ConfigurationError(_split_across_processes(engine, layout, data * model, devices))
    return engine.replicas([find(d, backend=engine.name) for d in devices]).tensor_parallel(data, model)


def _split_across_processes(engine: Any, layout: str, count: int, devices: list[Any] | None) -> str:
    """Why ``engine`` (PyTorch) cannot split a model over ``count`` devices of one process, and
    the launch that works: it has no virtual CPU devices, and one device per process."""
    return message(
        f"{engine.title} splits a model's layers across processes, one device each, not across the devices "
        "of one process (it has no virtual CPU devices)",
        received=f"{layout} in one process" + (f" over devices={[str(d) for d in devices]}" if devices else ""),
        fix=f"leave devices= out and run the same script under `xdevice launch --nproc-per-node {count} "
        "your_script.py` with the same mesh",
    )
