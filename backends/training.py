"""The training contract: :class:`Program` and :class:`Replicas`, what a trainer steps through.

A backend's ``training.py`` builds a :class:`Program` from the framework's own models, and its
``replication.py`` builds :class:`Replicas` from its engine; the trainer
(``xdevice.training``) uses nothing else. Both live here, beside ``base.py``, so that backends
build on them without importing the training package.

A *program* is the one shape every model takes inside the trainer: trainable ``params`` and
``buffers`` (dicts of the backend's arrays on the training device), a pure
``forward(params, buffers, x, train) -> (outputs, buffers)``, and ``write_back`` to put trained
values into the user's own object. ``precision="bfloat16"`` casts params and inputs to bfloat16
inside ``forward`` and the outputs back to float32, so gradients reach the float32 master
weights; ``precision="float16"`` does the same in float16 (the trainer then scales the loss).

A *replicas* object is what the step (and a custom loop) asks about placement and agreement;
the step stays the same on one device, several, or several processes:

- ``place_params(arrays)``: the arrays on every replica (copies of the first one's);
- ``place_batch(x, y)``: the global batch split along axis 0 across the replicas;
- inside the step, ``weight(x)``: this replica's share of the global rows; ``sum(tree)``: the
  sum over replicas; ``value_and_grad(objective, params)``: ``((loss, aux), grads)`` where
  ``grads`` is the gradient of the global batch (the replicas' weighted gradients summed);
- ``compile(step)``: ``step`` compiled and run on every replica, the first one's results back;
  ``compile_donating(step, argnums)`` (a backend whose ``donates`` is True: JAX) also gives
  those arguments' buffers to the outputs (see :func:`donating` for when a trainer asks);
- ``sharded()``: the same devices with parameters, gradients and optimizer state sharded
  across them instead of copied (``strategy="fsdp"``); ``shards`` says which a replicas object
  does. An engine that cannot shard refuses here, by name, with the reason and the way that works;
- ``tensor_parallel(data, model)``: the same devices as a ``data x model`` mesh, the zoo
  transformers' attention and MLP weights and token embedding split over ``model`` (:func:`tensor_parallel_axis`)
  and the batch over ``data`` (``mesh={"data": 2, "model": 2}``); a backend whose ``Replication``
  sets ``supports_tensor_parallel`` overrides it (JAX; PyTorch across launched processes), the rest refuse.
  For a program whose forward takes them so (``Program.fused_by_parts``: the zoo's), the fused
  ``attn.qkv`` is held by its parts, ``(in, 3, out)`` (:func:`tensor_parallel_shape`), so that
  each device holds whole heads of q, k and v; ``whole`` and ``saved`` give the saved shapes back.

:class:`Replicas` itself is the one-device case and the defaults the engines build on.
Importing this module imports no framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from xdevice import _registry
from xdevice._device import Device
from xdevice._errors import ConfigurationError, message

__all__ = [
    "COLUMN_SPLIT",
    "FUSED",
    "MESH_AXES",
    "PRECISIONS",
    "ROW_SPLIT",
    "STRATEGIES",
    "VOCAB_SPLIT",
    "Program",
    "Replicas",
    "donating",
    "saved_shape",
    "shard_axis",
    "shard_bytes",
    "tensor_parallel_axis",
    "tensor_parallel_shape",
]

PRECISIONS = ("float32", "bfloat16", "float16")

#: how data parallelism holds the weights: a full copy per device, or a shard per device
STRATEGIES = ("replicate", "fsdp")


def shard_axis(shape: tuple[int, ...], count: int) -> int | None:
    """The axis an array of ``shape`` is split along over ``count`` devices under
    ``strategy="fsdp"``: its largest axis that ``count`` divides (the first of equals), or
    None (the array is copied whole to every device: a scalar, or no axis divides).
    One rule, read by the engine that shards and by the memory estimate.

    >>> shard_axis((6, 16), 4), shard_axis((2,), 4), shard_axis((8, 8), 2), shard_axis((), 2)
    (1, None, 0, None)
    """
    axes = [i for i, size in enumerate(shape) if size % count == 0 and size >= count]
    return max(axes, key=lambda i: (shape[i], -i)) if count > 1 and axes else None


def shard_bytes(shape: tuple[int, ...], nbytes: int, count: int, first_axis: bool = False) -> int:
    """The bytes of the largest shard (rank 0's) of an array of ``shape`` and ``nbytes`` split
    ``count`` ways under ``strategy="fsdp"``: along :func:`shard_axis` (JAX; whole where no
    axis divides), or, ``first_axis`` (a backend's ``fsdp_first_axis``: FSDP2), in
    ``torch.chunk`` pieces of the first axis, ``ceil(rows / count)`` rows each.

    >>> shard_bytes((6, 16), 384, 4), shard_bytes((6, 16), 384, 4, first_axis=True)
    (96, 128)
    >>> shard_bytes((3,), 12, 2), shard_bytes((3,), 12, 2, first_axis=True)
    (12, 8)
    """
    if count <= 1 or not shape:
        return nbytes
    if first_axis:
        return nbytes // max(shape[0], 1) * -(-shape[0] // count)
    return nbytes if shard_axis(shape, count) is None else nbytes // count


#: the axes a device mesh may name: the batch is split over ``data``, the layers over ``model``
MESH_AXES = ("data", "model")

#: the tensor-parallel layout of the zoo transformers (Megatron-LM's), by the layer a parameter
#: belongs to, the two parts of its name before ``weight`` / ``bias``: the layers that open an
#: attention or MLP are split by output columns (whole heads of q, k, v; MLP units), the layers
#: that close it by input rows, so each device computes its heads and units with no exchange
#: between the two and one sum after. Every zoo transformer names its layers this way
#: (``bert``, ``gpt2``, ``llama``, ``transformer``, ``vit``); any other parameter is copied whole.
COLUMN_SPLIT = ("attn.qkv", "attn.q", "attn.k", "attn.v", "mlp.fc1", "mlp.up", "mlp.gate")
ROW_SPLIT = ("attn.out", "mlp.fc2", "mlp.down")

#: the token embedding, ``(vocab, width)``, split by vocabulary (Megatron-LM's
#: ``VocabParallelEmbedding``): each device holds ``vocab / count`` rows and looks up the ids in
#: its range, the others giving zeros, and one sum makes every row whole; where the head is tied
#: to it (gpt2, llama), the head's ``(width, vocab)`` is split by columns with it and the logits
#: come out split by vocabulary. A vocabulary the count does not divide (gpt2's 50,257) is kept
#: whole, as any axis the layout cannot split evenly is.
VOCAB_SPLIT = ("tokens",)

#: the fused projections: one layer whose output columns are several projections side by side,
#: each a whole number of heads (``attn.qkv``: ``[q | k | v]``), by how many
FUSED = {"attn.qkv": 3}

#: how many axes a column layer's ``weight`` and ``bias`` have as saved, ``(in, out)`` and ``(out,)``
_SAVED_RANK = {"weight": 2, "bias": 1}


def _layer(name: str) -> tuple[str, str]:
    """``(layer, leaf)`` of the parameter ``name`` or its optimizer slot (``m/<name>``):
    ``("attn.qkv", "weight")`` for ``block0.attn.qkv.weight``."""
    parts = name.rsplit("/", 1)[-1].split(".")  # an optimizer slot follows its parameter
    return ".".join(parts[-3:-1]), parts[-1]


def tensor_parallel_axis(name: str, shape: tuple[int, ...], count: int) -> int | None:
    """The axis the parameter ``name`` (or its optimizer slot, ``m/<name>``) of ``shape`` is
    split along over a ``model`` mesh axis of ``count`` devices, or None (copied whole).
    A :data:`COLUMN_SPLIT` layer's weight ``(in, out)`` and bias split along ``out``; a
    :data:`ROW_SPLIT` layer's weight along ``in``, its bias whole (added once, after the sum);
    the :data:`VOCAB_SPLIT` token embedding ``(vocab, width)`` along ``vocab``.
    A fused projection held by its parts (:func:`tensor_parallel_shape`) splits along its last
    axis too. An axis that ``count`` does not divide is not split. One rule, read by the engine
    that splits and by the memory estimate.

    >>> split = tensor_parallel_axis
    >>> split("block0.attn.qkv.weight", (32, 96), 2), split("m/block0.attn.qkv.bias", (96,), 2)
    (1, 0)
    >>> split("block0.attn.qkv.weight", (32, 3, 32), 2), split("block0.attn.qkv.bias", (3, 32), 2)
    (2, 1)
    >>> split("block0.mlp.down.weight", (64, 32), 4), split("block0.attn.out.bias", (32,), 2)
    (0, None)
    >>> split("tokens.weight", (96, 32), 2), split("m/tokens.weight", (50257, 768), 2)
    (0, None)
    >>> split("positions.weight", (32, 32), 2), split("block0.mlp.up.weight", (32, 6), 4)
    (None, None)
    """
    if count <= 1 or not shape:
        return None
    layer, leaf = _layer(name)
    if layer in COLUMN_SPLIT:
        axis = len(shape) - 1
    elif layer in ROW_SPLIT + VOCAB_SPLIT and leaf == "weight":
        axis = 0
    else:
        return None
    return axis if shape[axis] % count == 0 else None


def tensor_parallel_shape(name: str, shape: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The shape a model whose forward takes its fused projections by parts (``Program.fused_by_parts``:
    the zoo's transformers) holds the parameter ``name`` (or its slot) of the saved ``shape`` in,
    over a ``model`` mesh axis of ``count`` devices.

    A :data:`FUSED` layer's weight ``(in, parts * out)`` is held as ``(in, parts, out)``, its
    bias ``(parts * out,)`` as ``(parts, out)``: a reshape, not a copy, after which the split
    along the last axis (:func:`tensor_parallel_axis`) gives device ``i`` the same columns
    ``i * out / count ..`` of every part. For ``attn.qkv`` those are heads
    ``i * heads / count ..`` of q, k AND v (Megatron-LM's layout, where ``count`` divides the
    heads), so each device computes attention for its own heads, with no exchange before it.
    Split as saved, in contiguous column blocks, device 0 would hold q and part of k, device 1
    the rest of k and v, and the engine would move activations between them to line heads up.
    Any other parameter, or a fused one whose parts ``count`` does not split, keeps ``shape``;
    :func:`saved_shape` undoes it.

    >>> held = tensor_parallel_shape
    >>> held("block0.attn.qkv.weight", (32, 96), 2), held("v/block0.attn.qkv.bias", (96,), 4)
    ((32, 3, 32), (3, 32))
    >>> held("block0.attn.qkv.weight", (32, 96), 3), held("block0.mlp.fc1.weight", (32, 64), 2)
    ((32, 96), (32, 64))
    """
    layer, leaf = _layer(name)
    parts = FUSED.get(layer)
    if parts is None or count <= 1 or len(shape) != _SAVED_RANK.get(leaf) or shape[-1] % parts:
        return shape
    held = (*shape[:-1], parts, shape[-1] // parts)
    return held if tensor_parallel_axis(name, held, count) is not None else shape


def saved_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The saved shape of the parameter ``name`` (or its slot) held in ``shape``: a
    :data:`FUSED` layer held by its parts (:func:`tensor_parallel_shape`) side by side again;
    any other shape as it is.

    >>> saved_shape("block0.attn.qkv.weight", (32, 3, 32)), saved_shape("m/block0.attn.qkv.bias", (3, 32))
    ((32, 96), (96,))
    >>> saved_shape("block0.attn.qkv.weight", (32, 96)), saved_shape("block0.mlp.fc1.weight", (32, 64))
    ((32, 96), (32, 64))
    """
    layer, leaf = _layer(name)
    parts = FUSED.get(layer)
    if parts is None or len(shape) != _SAVED_RANK.get(leaf, -1) + 1 or shape[-2] != parts:
        return shape
    return (*shape[:-2], parts * shape[-1])


def donating(kinds: Iterable[str]) -> bool:
    """Whether a compiled training step should donate its params and optimizer state, for
    arrays on devices of these ``kinds`` (``"cpu"``, ``"gpu"``, ``"tpu"``): on a GPU or TPU,
    where the step would otherwise hold two copies of each in device memory; not on the CPU,
    where the memory is the host's and XLA may refuse some buffers (a warning).

    >>> donating(["gpu"]), donating(["cpu"]), donating(["gpu", "cpu"]), donating([])
    (True, False, False, False)
    """
    kinds = set(kinds)
    return bool(kinds) and "cpu" not in kinds


class Program:
    """Base: a zoo-style forward over ``backend``'s op set."""

    compiles_whole = True  # the whole training step compiles as one program (jax.jit, tf.function)
    #: whether ``forward`` also takes each :data:`FUSED` projection held by its parts
    #: (:func:`tensor_parallel_shape`): the zoo's transformers do, and tensor parallel then holds
    #: them so; any other program keeps its saved shapes (its code may read them)
    fused_by_parts = False

    def __init__(self, backend: str, device: Device, params: dict, buffers: dict):
        self.backend = _registry.backend(backend)
        self.ops = self.backend.ops
        self.device, self.params, self.buffers = device, params, buffers
        self.precision = "float32"

    def forward(self, params: dict, buffers: dict, x: Any, train: bool) -> tuple[Any, dict]:
        half = self.precision != "float32"
        if half:
            params = {k: self._low(v) for k, v in params.items()}
            x = self._low(x)
        with self.ops.new_tensors_on(self.backend.native_device(self.device)):
            out, buffers = self.run(params, buffers, x, train)
        if half:
            out = self.ops.cast(out, "float32")
        return out, buffers

    def _low(self, value: Any) -> Any:
        """A float32 value in the half precision computed in."""
        return self.ops.cast(value, self.precision) if self.ops.dtype(value) == "float32" else value

    def run(self, params: dict, buffers: dict, x: Any, train: bool) -> tuple[Any, dict]:
        raise NotImplementedError

    def write_back(self) -> None:
        """Put ``self.params`` and ``self.buffers`` into the user's object."""

    def device_for(self, name: str) -> Device | None:
        """Where the array called ``name`` (a param, buffer or optimizer slot ``slot/param``)
        lives; None: where it was made (an uncommitted scalar such as the step count)."""
        return self.device

    def result(self) -> Any:
        """The trained object to hand back (the user's own, or a new JAX pair)."""
        raise NotImplementedError

    def set_precision(self, precision: str) -> None:
        if precision not in PRECISIONS:
            raise ConfigurationError(message("Unknown precision", received=precision, choices=PRECISIONS))
        if precision == "bfloat16" and not self.backend.supports_bfloat16:
            able = [name for name in _registry.backends() if name != self.backend.name]
            raise ConfigurationError(
                message(
                    f"The {self.backend.title} backend has no bfloat16 compute",
                    received="precision='bfloat16'",
                    choices=able,
                    fix="train on another backend, or use float32",
                )
            )
        self.precision = precision


class Replicas:
    """One device: nothing to split, sum or weigh. The defaults backends build on."""

    rank, count = 0, 1  # this replica's index (processes); how many replicas
    shards = False  # params, gradients and optimizer state split across the replicas (fsdp)
    model = 1  # how many ways the layers are split (a mesh's "model" axis: tensor parallel)
    #: whether the fused projections are held by their parts (:func:`tensor_parallel_shape`)
    #: where the layers are split; the trainer sets it from its program's ``fused_by_parts``
    fused_by_parts = False

    def __init__(self, backend: Any):
        self.backend = backend

    @property
    def reshapes(self) -> bool:
        """Whether some arrays are held here in another shape than saved (:meth:`held_shape`)."""
        return self.fused_by_parts and self.model > 1

    def held_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape the array ``name`` of saved ``shape`` is held in here: a fused
        projection by its parts where the layers are split and the program takes it so
        (:func:`tensor_parallel_shape`); anything else as saved."""
        return tensor_parallel_shape(name, shape, self.model) if self.fused_by_parts else shape

    def saved_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape the array ``name``, held here in ``shape``, is saved and handed back in
        (the inverse of :meth:`held_shape`)."""
        return saved_shape(name, shape) if self.reshapes else shape

    def saved(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` in the shapes they are saved in (:meth:`saved_shape`), left where they
        are, split arrays still split: what the trainer hands back in the user's model. An
        engine that holds fused projections by their parts reshapes them here; :meth:`whole`
        gives the saved shapes too."""
        return arrays

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

    def compile_donating(self, step: Callable, donate: tuple[int, ...]) -> Callable:
        """:meth:`compile`, the arguments at positions ``donate`` donated to the outputs where
        the backend's ``jit`` can (``donates``: JAX); elsewhere plain :meth:`compile`."""
        if getattr(self.backend, "donates", False):
            return self.backend.jit(step, donate=donate)
        return self.compile(step)

    def sharded(self) -> Replicas:
        """These replicas with parameters, gradients and optimizer state sharded across the
        devices (``strategy="fsdp"``). One device has nothing to shard; an engine that shards
        overrides this, and the rest refuse with the way that works."""
        if self.count == 1:
            return self
        raise ConfigurationError(
            message(
                f"{self.backend.title} cannot shard parameters across these {self.count} replicas (strategy='fsdp')",
                received="strategy='fsdp'",
                choices=STRATEGIES,
                fix="train with strategy='replicate' (every replica holds the whole model), or build the model "
                "with JAX, which shards in one process over devices=[...]",
            )
        )

    def whole(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` as code outside the step reads them (evaluation, numpy copies,
        checkpoints). An engine whose shards are not arrays of the whole (PyTorch's DTensors
        under FSDP2) all-gathers here, every rank calling it; JAX's sharded arrays read as whole
        arrays in one process, and across processes JAX all-gathers them here too. Arrays held
        in another shape than saved (:meth:`held_shape`) come back in the saved one."""
        return arrays

    def tensor_parallel(self, data: int, model: int) -> Replicas:
        """These devices as a ``data x model`` mesh: the batch split over ``data``, the layers
        named in :data:`COLUMN_SPLIT` / :data:`ROW_SPLIT` over ``model``. The core checks the
        mesh and asks only an engine whose ``supports_tensor_parallel`` is set; one that sets it
        overrides this."""
        raise ConfigurationError(
            message(
                f"{self.backend.title} has no tensor-parallel layout (a mesh with a 'model' axis)",
                received=f"mesh={{'data': {data}, 'model': {model}}}",
                fix="drop the 'model' axis (mesh={'data': N} is data parallel), or build the model with JAX",
            )
        )
