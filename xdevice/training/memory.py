"""``estimate_memory``: what training a zoo model takes in memory per device, before you run out.

Two figures side by side, as Accelerate's ``estimate-memory`` gives the first:

- **the arithmetic**: float32 parameters and buffers, their gradients, the optimizer's state
  (Adam: two slots per parameter; momentum: one), a half-precision copy of the parameters in
  bfloat16/float16, and the activations: every intermediate array of one training forward,
  counted on the numpy reference at 1 and 2 rows and extrapolated to the batch (a framework
  frees or fuses some of them; the backward pass's temporaries come on top, which the
  measurement shows). A model built with ``remat=True`` keeps only its blocks' outputs and
  recomputes one block at a time: every block's output, plus the largest block's
  intermediates, instead of every block's;
- **a measurement** by the framework itself where it offers one (``Backend.measure_step``):
  XLA's ``memory_analysis()`` of the compiled step (JAX, any device); what autograd saves for
  the backward pass, or CUDA's peak on a GPU (PyTorch); TensorFlow's peak on a GPU.

It then says whether the larger of them fits the device's memory, or the limit set with
``xdevice.configure(memory_limit=...)``. Under data parallelism (``strategy="replicate"``)
each device holds all the weights and state and its own rows: pass the rows per device as
``batch``. Under ``strategy="fsdp"`` over ``devices=N`` each device holds its shard of every
parameter, gradient and optimizer slot: the arrays split along the axis the engine splits
them along (``shard_axis``) count 1/N, the others (no axis N divides) whole. Under a mesh
with a ``model`` axis of M devices (tensor parallel, ``mesh={"data": 2, "model": 2}``) the
attention and MLP weights and the token embedding (by vocabulary, where M divides it) the
layout splits (``tensor_parallel_axis``), their gradients and optimizer slots count 1/M, the
rest (position embeddings, norms, the closing layers' biases) whole; the
activations stay the one-device count for ``batch`` rows. The measurement stays the
one-device step's.

>>> estimate = estimate_memory("mlp", batch=32, optimizer="sgd", measure=False, hidden=[64])
>>> estimate.parts["optimizer state"], estimate.parts["parameters"] == estimate.parts["gradients"]
(0, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from xdevice import _registry
from xdevice._discovery import devices, find
from xdevice._errors import ConfigurationError, DeviceNotFound, message
from xdevice._types import format_bytes

__all__ = ["MemoryEstimate", "estimate_memory"]


def _device(device: Any, backend: str) -> Any:
    """``device`` as ``backend`` sees it. A missing GPU gets a fix in words that fit the Python
    call and ``xdevice estimate-memory --device`` alike: on a machine without one, "no GPU
    here; use cpu:0"; where ``backend`` alone does not see it, another backend."""
    try:
        return find(device, backend=backend)
    except DeviceNotFound as error:
        from xdevice._device import device as parse_device

        wanted = parse_device(device)  # it parsed in find: only its absence is left
        if wanted.kind != "gpu":
            raise
        present = [str(d) for d in devices(backend=backend)]
        if not devices(kind="gpu"):
            what, fix = f"No GPU here to estimate {wanted} for", "no GPU here; use cpu:0"
        else:
            what = f"No device {wanted} on backend {backend!r}"
            fix = f"use one of those, or measure with a backend whose build sees the GPU ({backend}'s does not)"
        raise DeviceNotFound(message(what, received=str(device), choices=present, fix=fix)) from error


@dataclasses.dataclass
class MemoryEstimate:
    """The estimate: ``parts`` (bytes per device, arithmetic), ``measured`` (``how`` and the
    framework's own parts, or None), and what it is compared with."""

    model: str
    backend: str
    device: str
    batch: int
    optimizer: str
    precision: str
    strategy: str
    devices: int
    parts: dict[str, int]
    measured: dict[str, int] | None
    how: str | None
    available: int | None
    available_from: str
    mesh: Mapping[str, int] | None = None

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def needed(self) -> int:
        """The larger of the arithmetic and the measurement."""
        return max(self.total, (self.measured or {}).get("total", 0))

    @property
    def fits(self) -> bool | None:
        return None if self.available is None else self.needed <= self.available

    def __str__(self) -> str:
        spread = "" if self.devices == 1 else f", {self.strategy} over {self.devices} devices"
        if self.mesh:
            spread += f", mesh {self.mesh}"
        lines = [
            f"{self.model}: batch {self.batch} per device, {self.optimizer}, {self.precision}, "
            f"{self.backend} on {self.device}{spread}",
            "",
        ]
        lines += [f"  {name:<22}{format_bytes(size):>12}" for name, size in self.parts.items()]
        lines.append(f"  {'total (arithmetic)':<22}{format_bytes(self.total):>12}")
        if self.measured:
            lines += ["", f"  measured: {self.how}"]
            lines += [f"  {name:<22}{format_bytes(size):>12}" for name, size in self.measured.items()]
        else:
            lines += [
                "",
                f"  measured: nothing ({self.backend} offers no count on {self.device}; the arithmetic stands alone)",
            ]
        verdict = "unknown" if self.fits is None else "fits" if self.fits else "does NOT fit"
        lines += [
            "",
            f"  {format_bytes(self.needed)} needed; {self.available_from}: {format_bytes(self.available)} -> {verdict}",
        ]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total": self.total, "needed": self.needed, "fits": self.fits}


def estimate_memory(
    model: Any,
    *,
    batch: int,
    optimizer: str = "adam",
    precision: str = "float32",
    backend: str | None = None,
    device: Any = "cpu",
    measure: bool = True,
    strategy: str = "replicate",
    devices: int = 1,
    mesh: Mapping[str, int] | None = None,
    **spec: Any,
) -> MemoryEstimate:
    """Per-device memory for training ``model`` (a zoo name such as ``"cnn"``, with ``spec``, or
    a zoo model) at ``batch`` rows per device with ``optimizer`` in ``precision``.

    Args:
        backend: the framework to measure with (default: the model's, or numpy for a name);
            numpy measures nothing. Under ``strategy="fsdp"`` it also picks how the arrays
            split: torch's FSDP2 in first-axis chunks, the others along ``shard_axis`` (an
            mlp's 10-class bias over 4 devices: 3 rows on torch's rank 0, whole on JAX), so
            name the engine that trains.
        measure: compile (JAX) or run (PyTorch, TensorFlow on a GPU) one step to measure it.
        strategy: ``"replicate"`` (each device holds every weight) or ``"fsdp"`` (each holds
            its shard of the parameters, gradients and optimizer state).
        devices: how many devices the data parallelism spans (with ``mesh``: left out, or
            the product of its sizes).
        mesh: ``{"data": d, "model": m}``: the devices as a grid, the transformers' attention and
            MLP layers and token embedding split ``m`` ways (tensor parallel; ``strategy`` stays
            ``"replicate"``).
        **spec: the zoo model's hyper-parameters; ``remat=True`` (real-scale models) counts the
            activations that recomputing each block in the backward pass keeps.

    Raises:
        ConfigurationError: an unknown optimizer, precision or strategy, or a batch or device
            count below 1.
        DeviceNotFound: ``backend`` has no such device (on a machine without a GPU: use the CPU).
    """
    from xdevice import models
    from xdevice.backends.training import PRECISIONS, STRATEGIES, shard_bytes, tensor_parallel_axis
    from xdevice.training.optimizers import optimizer as make_optimizer
    from xdevice.training.replication import mesh_shape

    slots = len(make_optimizer(optimizer).slots)  # per-parameter state arrays (an unknown name: the choices)
    if precision not in PRECISIONS:
        raise ConfigurationError(message("Unknown precision", received=precision, choices=PRECISIONS))
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigurationError(
            message("batch is the rows per device", expected="an int of 1 or more", received=batch)
        )
    if strategy not in STRATEGIES:
        raise ConfigurationError(message("Unknown data-parallel strategy", received=strategy, choices=STRATEGIES))
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise ConfigurationError(
            message("devices is how many devices the training spans", expected="an int of 1 or more", received=devices)
        )
    layers = 1  # how many ways the mesh's "model" axis splits the layers
    if mesh is not None:
        if devices == 1 and isinstance(mesh, Mapping):
            devices = math.prod(n for n in mesh.values() if isinstance(n, int))
        layers = mesh_shape(mesh, devices)[1]  # refuses a mesh that does not fit the devices
        if layers > 1 and strategy != "replicate":
            raise ConfigurationError(
                message(
                    "A mesh with a 'model' axis splits the layers; strategy='fsdp' on top is not done here",
                    received=f"strategy={strategy!r}, mesh={mesh}",
                    fix="leave strategy out with the mesh, or drop the 'model' axis for fsdp",
                )
            )
    reference = models.build(model, **spec) if isinstance(model, str) else model.to("numpy")
    backend = backend or (reference.backend if isinstance(model, str) else model.backend)
    where = _device(device, backend)

    split = devices if strategy == "fsdp" else 1
    first_axis = split > 1 and _registry.backend(backend).fsdp_first_axis

    def per_device(name: str, value: Any) -> int:  # this device's shard of the array (the largest, rank 0's)
        if tensor_parallel_axis(name, value.shape, layers) is not None:
            return value.nbytes // layers
        return shard_bytes(value.shape, value.nbytes, split, first_axis)

    sizes = {k: per_device(k, v) for k, v in reference.numpy_params().items()}
    weights = sum(sizes.values())
    trained = sum(sizes[k] for k in reference.trainable)
    parts = {"parameters": weights, "gradients": trained, "optimizer state": slots * trained}
    if precision != "float32":
        parts["half copy of params"] = weights // 2
    parts["activations (forward)"] = _activations(reference, batch, 2 if precision != "float32" else 4)
    parts["batch"] = _rows_bytes(reference, batch)

    measured = how = None
    if measure and backend != "numpy":
        how, measured = _measure(reference, backend, where, batch, optimizer, precision) or (None, None)
    available, available_from = _available(backend, where)
    return MemoryEstimate(
        reference.name,
        backend,
        str(where),
        batch,
        optimizer,
        precision,
        strategy,
        devices,
        parts,
        measured,
        how,
        available,
        available_from,
        mesh,
    )


def _activations(model: Any, batch: int, item_bytes: int) -> int:
    """Bytes of every intermediate of one training forward, at ``batch`` rows: counted at 1
    and 2 rows on the numpy reference (float intermediates at ``item_bytes`` each) and
    extrapolated (a part per row, a part that is not)."""
    one, two = (_intermediates(model, rows, item_bytes) for rows in (1, 2))
    per_row = max(two - one, 0)
    return max(one - per_row, 0) + per_row * batch


def _intermediates(model: Any, rows: int, item_bytes: int) -> int:
    """Bytes kept for the backward pass: every op's result, except inside a recomputed block
    (``ops.checkpoint``), where only its outputs are kept and the largest block's inside counts
    once (the one being recomputed)."""
    ops = model.ops
    counted, recomputed = [0], [0]

    def size(result: Any) -> int:
        values = result if isinstance(result, (tuple, list)) else (result,)
        return sum(
            value.size * item_bytes if value.dtype.kind == "f" else value.nbytes
            for value in values
            if hasattr(value, "nbytes") and hasattr(value, "dtype")
        )

    class Counting:  # the op set, counting the size of what each op the model calls returns
        def __getattr__(self, name):
            attribute = getattr(ops, name)
            if not callable(attribute):
                return attribute

            def call(*args, **kwargs):
                before = counted[0]
                result = attribute(*args, **kwargs)  # a checkpoint counts its block's ops here
                if name == "checkpoint":
                    recomputed[0] = max(recomputed[0], counted[0] - before)
                    counted[0] = before
                counted[0] += size(result)
                return result

            return call

    model.apply(Counting(), model.params, ops.asarray(model.example_input(rows)), train=True)
    return counted[0] + recomputed[0]


def _rows_bytes(model: Any, batch: int) -> int:
    return int(model.example_input(1).nbytes) * batch


def _measure(
    reference: Any, backend: str, where: Any, rows: int, optimizer: str, precision: str
) -> tuple[str, dict[str, int]] | None:
    """The framework's own count of one training step, on a copy of the model (zoo models
    end in class scores: the labels are class indices, one per row, or per token for a
    language model)."""
    import numpy as np

    from xdevice.training.trainer import Trainer

    trainer = Trainer(reference.to(backend, where), optimizer=optimizer, precision=precision)
    x = reference.example_input(rows)
    *inner, classes = reference(reference.example_input(1)).shape[1:]
    labels = (np.arange(rows * int(np.prod(inner, dtype=int))) % classes).reshape(rows, *inner)
    x, y, _ = trainer._place((x, labels.astype("int64")))
    p = trainer.program
    args = (p.params, p.buffers, trainer.state, x, y, trainer._argument(trainer.schedule(0)))
    return _registry.backend(backend).measure_step(trainer._train, args, where)


def _available(backend: str, where: Any) -> tuple[int | None, str]:
    from xdevice._configure import current_config

    config = current_config(backend)  # memory_limit is per GPU: a CPU has its memory
    limit = config.limit_for(where) if config is not None and where.kind == "gpu" else None
    if limit is not None:
        return limit, f"the memory_limit set for {where}"
    return where.memory_total, f"{where}'s memory" + ("" if where.memory_total is not None else " (unknown)")
