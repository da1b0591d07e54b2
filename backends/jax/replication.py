"""JAX data parallelism: a ``Mesh`` over the devices, params replicated, the batch sharded.

JAX sees the global batch as one array split across the mesh, so the step is the
one-device step under ``jax.jit`` (the defaults of ``xdevice.backends.training.Replicas``):
XLA inserts the all-reduce of the gradients. The loss is already the global mean, so
``weight`` is 1 and ``sum`` is the identity. A batch whose rows do not split evenly is padded
(``place_batch``), its padding left out of the loss and metrics; batch statistics (batch norm)
see the padding rows, repeats of the batch's own. After training, ``gather`` brings the params
back to the model's one device.

``strategy="fsdp"`` (:class:`ShardedReplicas`) shards every array along ``training.shard_axis``;
a mesh with a ``model`` axis (:class:`TensorParallelReplicas`) splits the zoo transformers'
attention and MLP layers and token embedding Megatron-style (``training.tensor_parallel_axis``) and the batch over
``data``. Both only annotate where arrays live (``NamedSharding``, ``with_sharding_constraint``):
XLA's GSPMD partitioner inserts the collectives, so the step is the one-device math.

Across processes (``jax.distributed``, joined from what ``xdevice launch`` set) the
mesh spans every process's devices and the same jitted step runs in each (SPMD). Every
process holds the same global batch (the order depends on the seed only) and gives JAX
host copies, from which each keeps the rows of its own devices; params start as process
0's (``broadcast_one_to_all``), as DDP starts from rank 0's. Under ``strategy="fsdp"`` each
process keeps only its own shards of the params and optimizer state (the same
``NamedSharding`` over the global mesh), and :meth:`Replicas.whole` all-gathers them, every
process calling it, where code outside the step reads them (evaluation, weights, checkpoints).
A ``data x model`` mesh across processes is the same: the grid is laid over every process's
devices in process order (process ``r`` of ``d * m``, one device each, at row ``r // m``,
column ``r % m``), so each process holds its part of each split weight and of its slots.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message
from xdevice._processes import world
from xdevice.backends import training
from xdevice.backends.jax.launch import COORDINATOR


class Replicas(training.Replicas):
    def __init__(self, backend: Any, devices: list[Any]):
        super().__init__(backend)
        self.mesh = Mesh(np.array(devices), ("data",))
        self.count = len(devices)
        self.rows = self.count  # how many ways the batch splits (the mesh's data axis)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.split = NamedSharding(self.mesh, PartitionSpec("data"))
        self.rank = jax.process_index()
        self.processes = jax.process_count() > 1

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return {k: self._put(v, self.replicated) for k, v in self._shared(arrays).items()}

    def _shared(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` as JAX takes them for a mesh: across processes, process 0's host values
        (every process then keeps the pieces of its own devices); in one process, as they are.

        Only the arrays whose bytes differ somewhere are sent: the processes first compare a
        digest of each (an all-gather of 8 bytes an array), since each process usually built
        the same model from the same seed. ``broadcast_one_to_all`` holds several whole copies
        of what it sends at once (process 0's values, the others' zeros, their sum, the host
        copy): for a model that is the memory of several models in every process."""
        if not self.processes or not arrays:
            return arrays
        from jax.experimental import multihost_utils

        host = {k: np.asarray(v) for k, v in arrays.items()}
        digests = np.array([_digest(v) for v in host.values()], np.int32).reshape(len(host), 2)
        every = np.asarray(multihost_utils.process_allgather(digests)).reshape(-1, len(host), 2)
        differ = [k for k, same in zip(host, (every == every[0]).all(axis=(0, 2))) if not same]
        if differ:
            host.update(multihost_utils.broadcast_one_to_all({k: host[k] for k in differ}))
        return host

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        # JAX splits one array into equal shards: a short batch's x is padded with repeats of
        # its first rows up to a multiple of the device count, and y keeps the real rows, whole
        # on every device; the step scores only the outputs of those rows (the trainer cuts the
        # outputs to the targets' rows), so every row counts once, as on one device.
        if self.processes:
            x, y = np.asarray(x), np.asarray(y)
        rows = x.shape[0]
        short = -rows % self.rows
        if not short:
            return self._put(x, self.split), self._put(y, self.split)
        xp = np if self.processes else jnp
        padded = xp.concatenate([x, xp.take(x, xp.arange(short) % rows, axis=0)])
        return self._put(padded, self.split), self._put(y, self.replicated)

    def _put(self, value: Any, sharding: NamedSharding) -> jax.Array:
        """``value`` placed as ``sharding`` says. Across processes each process keeps the
        pieces of its own devices from its host copy, with no exchange: ``jax.device_put``
        would first check that every process holds the same value (a collective), and the
        trainer may place batches on a prefetching thread, whose collectives would then meet
        the step's in a different order in each process."""
        if not self.processes:
            return jax.device_put(value, sharding)
        host = np.asarray(value)
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    def gather(self, arrays: dict[str, Any], device: Device) -> dict[str, Any]:
        """``arrays`` (copies over the mesh) on ``device`` alone, for use outside the step."""
        where = self.backend.native_device(device)
        return {k: jax.device_put(v.addressable_data(0), where) for k, v in arrays.items()}

    def sharded(self) -> ShardedReplicas:
        return ShardedReplicas(self.backend, list(self.mesh.devices.flat))

    def tensor_parallel(self, data: int, model: int) -> TensorParallelReplicas:
        devices = list(self.mesh.devices.flat)  # across processes: every process's, in process order
        if data * model != len(devices):  # launched processes with several devices each
            raise ConfigurationError(
                message(
                    "A mesh with a 'model' axis lays out every device the processes hold, one grid cell each",
                    expected=f"data * model == {len(devices)} (the devices of {jax.process_count()} processes)",
                    received=f"mesh={{'data': {data}, 'model': {model}}}",
                    fix=f"a mesh whose sizes multiply to {len(devices)}, or give each launched process one device",
                )
            )
        return TensorParallelReplicas(self.backend, devices, data, model)


class ShardedReplicas(Replicas):
    """Data parallel with the params, gradients and optimizer state sharded over the mesh."""

    shards = True

    def sharding(self, name: str, value: Any) -> NamedSharding:
        """Where the pieces of ``value`` (the array called ``name``) go: split along
        ``training.shard_axis``, or whole everywhere."""
        return self._split(training.shard_axis(tuple(getattr(value, "shape", ())), self.count), "data")

    def _split(self, axis: int | None, over: str) -> NamedSharding:
        """Split along ``axis`` over the mesh axis ``over``; None: whole on every device."""
        return self.replicated if axis is None else NamedSharding(self.mesh, PartitionSpec(*[None] * axis, over))

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return {k: self._put(v, self.sharding(k, v)) for k, v in self._shared(arrays).items()}

    def _constrain(self, name: str, value: Any) -> Any:
        if not getattr(value, "shape", ()):  # a scalar (or not an array): left to XLA
            return value
        # a result with no name (the step's loss and metrics, one vector) is whole in every
        # process, so each reads it; a named one (param, buffer, slot) keeps its shards
        where = self.sharding(name, value) if name else self.replicated
        return jax.lax.with_sharding_constraint(value, where)

    def value_and_grad(self, objective: Callable, params: dict[str, Any]) -> tuple[tuple[Any, Any], dict[str, Any]]:
        (value, aux), grads = super().value_and_grad(objective, params)
        return (value, aux), {k: self._constrain(k, g) for k, g in grads.items()}  # reduce-scattered, not whole

    def _keeping_shards(self, step: Callable) -> Callable:
        def run(*args):
            return jax.tree_util.tree_map_with_path(lambda path, v: self._constrain(_name(path), v), step(*args))

        return run

    def compile(self, step: Callable) -> Callable:
        return super().compile(self._keeping_shards(step))

    def compile_donating(self, step: Callable, donate: tuple[int, ...]) -> Callable:
        return super().compile_donating(self._keeping_shards(step), donate)

    def gather(self, arrays: dict[str, Any], device: Device) -> dict[str, Any]:
        """``arrays`` (sharded over the mesh) whole on ``device``: the explicit gather (across
        processes every process calls it, and each gets the whole arrays on its own device)."""
        where = self.backend.native_device(device)
        whole = self.whole(arrays)  # across processes all-gathered; in the saved shapes
        if self.processes:
            return {k: jax.device_put(v.addressable_data(0), where) for k, v in whole.items()}
        return {k: jax.device_put(v, where) for k, v in whole.items()}

    def whole(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` as code outside the step reads them. In one process a sharded array
        already reads as the whole array; across processes each holds only its shards, so the
        shards are all-gathered into a copy whole on every device of the mesh (readable with
        ``np.asarray`` in each process, and computed with beside the mesh's other arrays).
        Every process calls it, as for any collective."""
        split = {k: v for k, v in arrays.items() if _split_across_processes(v)} if self.processes else {}
        return {**arrays, **self._all_gather(split)} if split else arrays

    @functools.cached_property
    def _all_gather(self) -> Callable[[dict[str, Any]], dict[str, Any]]:
        # a jitted identity whose results are whole on every device: XLA inserts the
        # all-gathers (multihost_utils.process_allgather does the same, then copies to the host)
        return jax.jit(lambda tree: tree, out_shardings=self.replicated)


class TensorParallelReplicas(ShardedReplicas):
    """A ``data x model`` mesh: the zoo transformers' attention and MLP layers split over
    ``model`` as ``training.tensor_parallel_axis`` says (their gradients and optimizer slots
    alike), everything else whole on every device, and the batch split over ``data``.

    A fused ``attn.qkv`` is held by its parts where the program takes it so
    (``fused_by_parts``): ``(width, 3, width)``, split along the last axis, so each device
    holds the same heads of q, k and v (``training.tensor_parallel_shape``) and XLA's
    partitioner finds every op up to the attention output local to it. The token embedding is
    split by vocabulary where ``model`` divides it (``training.VOCAB_SPLIT``): XLA's partitioner
    looks the ids up in each device's rows, masks the rest and all-reduces (the gradient is a
    masked scatter into the device's rows, no exchange), and a head tied to it gives logits
    split by vocabulary, whose softmax all-reduces its maximum and sum. :meth:`whole` and
    :meth:`saved` reshape it back to ``(width, 3 * width)``: there a ``NamedSharding`` can only
    split in contiguous column blocks, so the reshape moves columns between devices, once, where
    the arrays leave the trainer, instead of activations in every step."""

    def __init__(self, backend: Any, devices: list[Any], data: int, model: int):
        super().__init__(backend, devices)
        self.mesh = Mesh(np.array(devices).reshape(data, model), training.MESH_AXES)
        self.replicated = NamedSharding(self.mesh, PartitionSpec())
        self.split = NamedSharding(self.mesh, PartitionSpec("data"))  # whole over "model"
        self.rows, self.model = data, model

    def sharding(self, name: str, value: Any) -> NamedSharding:
        """Split along ``training.tensor_parallel_axis`` over ``model``, or whole everywhere."""
        return self._split(training.tensor_parallel_axis(name, tuple(getattr(value, "shape", ())), self.model), "model")

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return super().place_params({k: self._held(k, v) for k, v in arrays.items()})

    def _held(self, name: str, value: Any) -> Any:
        """``value`` in the shape it is held in (:meth:`held_shape`): a reshape, on the device it is on."""
        shape = tuple(getattr(value, "shape", ()))
        held = self.held_shape(name, shape)
        return value if held == shape else value.reshape(held)

    def whole(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` as code outside the step reads them, in the saved shapes: in one process
        still split (in column blocks where reshaped back), across processes all-gathered."""
        return {k: self._saved(k, v, whole=self.processes) for k, v in super().whole(arrays).items()}

    def saved(self, arrays: dict[str, Any]) -> dict[str, Any]:
        return {k: self._saved(k, v, whole=False) for k, v in arrays.items()}

    def _saved(self, name: str, value: Any, whole: bool) -> Any:
        """``value`` in its saved shape (:meth:`saved_shape`): whole on every device, or split
        as :meth:`sharding` splits that shape."""
        shape = tuple(getattr(value, "shape", ()))
        saved = self.saved_shape(name, shape)
        if saved == shape:
            return value
        where = self.replicated if whole else self.sharding(name, jax.ShapeDtypeStruct(saved, value.dtype))
        return _reshaping(saved, where)(value)


@functools.cache
def _reshaping(shape: tuple[int, ...], where: NamedSharding) -> Callable[[Any], Any]:
    """A compiled reshape to ``shape`` whose result lies as ``where`` says (an eager reshape of
    a split array would put the whole result on every device)."""
    return jax.jit(lambda value: jnp.reshape(value, shape), out_shardings=where)


def _digest(value: np.ndarray) -> tuple[int, int]:
    """8 bytes of a BLAKE2b digest of ``value``'s dtype, shape and bytes, as two int32s (JAX
    exchanges 32-bit ints unless 64-bit mode is on)."""
    digest = hashlib.blake2b(f"{value.dtype}{value.shape}".encode(), digest_size=8)
    digest.update(np.ascontiguousarray(value).view(np.uint8).ravel().data)
    first, second = np.frombuffer(digest.digest(), np.int32)
    return int(first), int(second)


def _split_across_processes(value: Any) -> bool:
    """Whether ``value`` is a JAX array of which this process holds only some pieces."""
    return isinstance(value, jax.Array) and not value.is_fully_addressable and not value.is_fully_replicated


def _name(path: tuple) -> str:
    """The name of the array at ``path`` in a step's results: its innermost dict key ("" if none)."""
    keys = [entry.key for entry in path if isinstance(entry, jax.tree_util.DictKey)]
    return str(keys[-1]) if keys else ""


class Replication:
    native_device: Callable[[Device], jax.Device]  # devices.py's, in the assembled backend

    def replicas(self, devices: list[Device]) -> Replicas:
        return Replicas(self, [self.native_device(d) for d in devices])

    def join_processes(self) -> None:
        if jax.distributed.is_initialized():
            return
        if COORDINATOR not in os.environ:
            raise ConfigurationError(
                message(
                    "JAX needs a coordinator address to join the other processes",
                    expected=f"{COORDINATOR}=host:port (xdevice launch sets it)",
                    received="unset",
                    fix="start the script with xdevice launch, or call jax.distributed.initialize(...) yourself",
                )
            )
        rank, size = world()
        try:
            jax.distributed.initialize(os.environ[COORDINATOR], num_processes=size, process_id=rank)
        except RuntimeError as error:
            raise ConfigurationError(
                message(
                    "JAX could not join the launched processes",
                    received=str(error),
                    fix="call xdevice.join_processes('jax') at the top of the script, before anything computes "
                    "with JAX (building a model does)",
                )
            ) from error

    def process_replicas(self) -> Replicas:
        self.join_processes()
        return Replicas(self, jax.devices())  # the mesh spans every process's devices
