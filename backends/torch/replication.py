"""PyTorch data parallelism across processes: ``DistributedDataParallel`` (gloo on CPU, NCCL on
GPU), one process per device, as ``xdevice launch`` or torchrun start them.

The collective backend follows the devices the rank computes on (:func:`collective`), not
whether the machine has a GPU: NCCL cannot reduce CPU tensors, and a CPU run on a GPU machine
must not join NCCL (nor run FSDP2 on gloo with GPUs visible, pytorch#132471). So the group is
joined on the first hook that sees tensors (``place_params`` in the trainer), with their
devices; ``xdevice.join_processes("torch")`` at a script's top, before any tensor, joins
``cpu:gloo,cuda:nccl`` where CUDA is usable, which routes each collective by its tensors.

Each process takes its rank's slice of every global batch (all processes draw the same global
batches: the order depends only on the seed) and weighs its loss by its share of the rows.
The gradient comes from DDP: the step's parameters are the ``nn.Parameter``s of a module DDP
wraps, and DDP's reducer all-reduces gradient buckets while ``backward`` is still running.
A communication hook sums the buckets instead of averaging them (the loss is already weighted,
so the sum is the global batch's mean gradient, also with uneven slices). Parameters and
buffers start as rank 0's (``broadcast``), as DDP's own constructor does.

``strategy="fsdp"`` (:class:`ShardedProcessReplicas`) shards the weights instead of copying
them, with FSDP2's ``fully_shard``; one process has nothing to shard and replicates.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication, register_sharding
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.overrides import TorchFunctionMode

from xdevice._errors import ConfigurationError, message
from xdevice._processes import world
from xdevice.backends import training
from xdevice.backends._model_io import map_leaves
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


def collective(devices: Iterable[torch.device] | None, *, cuda_available: bool) -> tuple[str, torch.device | None]:
    """The process group's backend, and its ``device_id``, for a rank computing on ``devices``.

    - CPU tensors only (also on a GPU machine): ``gloo``.
    - a CUDA device among them: ``cpu:gloo,cuda:nccl``, NCCL for the CUDA tensors and gloo
      for the CPU ones a step still reduces (each rank's row count, a split model's CPU
      stage); bound to the GPU (``device_id``) when the rank has exactly one, as
      ``init_process_group`` asks of a GPU rank (NCCL then sets up eagerly, on that GPU).
    - unknown (None: joined before any tensor): ``cpu:gloo,cuda:nccl`` where CUDA is usable,
      else ``gloo``; no ``device_id``, so NCCL starts only if a CUDA tensor is reduced.

    >>> collective([torch.device("cpu")], cuda_available=True)
    ('gloo', None)
    >>> collective([torch.device("cuda", 0)], cuda_available=True)
    ('cpu:gloo,cuda:nccl', device(type='cuda', index=0))
    """
    if devices is None:
        return ("cpu:gloo,cuda:nccl" if cuda_available else "gloo"), None
    gpus = list(dict.fromkeys(torch.device(d.type, d.index or 0) for d in devices if d.type == "cuda"))
    if not gpus:
        return "gloo", None
    return "cpu:gloo,cuda:nccl", gpus[0] if len(gpus) == 1 else None


def _devices(tree: Any) -> list[torch.device]:
    if isinstance(tree, dict):
        return [d for value in tree.values() for d in _devices(value)]
    return [tree.device] if isinstance(tree, torch.Tensor) else []


class ProcessReplicas(training.Replicas):
    def __init__(self, backend: Any):
        super().__init__(backend)
        # the group is joined by the first hook that sees tensors, on their devices
        self.rank, self.count = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else world()
        self.ddp: torch.nn.parallel.DistributedDataParallel | None = None

    def _join(self, *trees: Any) -> None:
        if not dist.is_initialized():
            join([d for tree in trees for d in _devices(tree)])

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        self._join(arrays)
        for value in arrays.values():
            dist.broadcast(value, src=0)
        return arrays

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        self._join(x, y)
        return x.tensor_split(self.count)[self.rank], y.tensor_split(self.count)[self.rank]

    def weight(self, x: Any) -> Any:
        self._join(x)
        rows = torch.tensor(float(x.shape[0]))
        total = rows.clone()
        dist.all_reduce(total)
        return rows / total

    def sum(self, tree: Any) -> Any:
        if isinstance(tree, dict):
            return {k: self.sum(v) for k, v in tree.items()}
        self._join(tree)
        total = tree.clone()
        dist.all_reduce(total)
        return total

    def value_and_grad(self, objective: Callable, params: dict[str, Any]) -> tuple[tuple[Any, Any], dict[str, Any]]:
        self._join(params)
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

    def sharded(self) -> training.Replicas:
        return self if self.count == 1 else ShardedProcessReplicas(self.backend)

    def tensor_parallel(self, data: int, model: int) -> training.Replicas:
        return TensorParallelProcessReplicas(self.backend, data, model)


class _Shards(torch.nn.Module):
    """The module ``fully_shard`` wraps: the trained parameters as ``nn.Parameter``s (``p0``,
    ``p1``, ... in the trainer's order), and a forward that evaluates any objective of them, so
    that FSDP2's hooks run around it: the all-gather before, the reduce-scatter of the
    gradients after ``backward``."""

    def __init__(self, params: dict[str, Any]):
        super().__init__()
        self.names = list(params)
        for i, value in enumerate(params.values()):
            self.register_parameter(f"p{i}", torch.nn.Parameter(value.detach().clone()))

    def weights(self) -> list[Any]:
        """The parameters as the module holds them now: shards (DTensors) outside the forward,
        whole tensors inside it."""
        return [getattr(self, f"p{i}") for i in range(len(self.names))]

    def forward(self, objective: Callable) -> Any:
        return objective(dict(zip(self.names, self.weights())))


class ShardedProcessReplicas(ProcessReplicas):
    """``strategy="fsdp"`` across launched processes: FSDP2 (``fully_shard``) shards each
    trained parameter along its first axis over the processes (``torch.chunk``'s pieces, the
    last ones shorter or empty), its gradient and its optimizer slots alike.

    The trainer's params are then DTensors holding this rank's shard; the optimizer (the op
    set's, on DTensors) updates the shards only. Each step copies the shards into the FSDP2
    module's parameters, whose forward all-gathers the whole weights for the objective and
    whose ``backward`` reduce-scatters the gradients (summed, not averaged: the loss is
    already weighted by the rank's rows). The first arrays placed are the parameters (the
    trainer places them first); later arrays named like one (``m/<name>``: an optimizer slot)
    and shaped like it are sharded like it, the rest (buffers, the step count) copied whole.
    :meth:`gather` is the explicit all-gather of the whole values.
    """

    shards = True

    def __init__(self, backend: Any):
        super().__init__(backend)
        self.fsdp: _Shards | None = None
        self.layout: dict[str, Any] = {}  # each trained parameter's shards, as FSDP2 made them

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        whole = super().place_params({k: v for k, v in arrays.items() if not isinstance(v, DTensor)})
        if self.fsdp is None:  # the parameters: the module's own shards, no copy
            self._shard({k: v for k, v in whole.items() if v.is_floating_point()})
            return {k: self.layout[k].detach() if k in self.layout else v for k, v in whole.items()}
        return {k: arrays[k] if isinstance(arrays[k], DTensor) else self._placed(k, whole[k]) for k in arrays}

    def _shard(self, params: dict[str, Any]) -> None:
        """FSDP2 over ``params``: the module, the mesh of the processes, each one's layout."""
        mesh = init_device_mesh(next(iter(params.values())).device.type if params else "cpu", (self.count,))
        self.fsdp = _Shards(params)
        fully_shard(self.fsdp, mesh=mesh)
        # a plain SUM: each rank's loss is weighted already (gloo has no AVG nor PREMUL_SUM)
        self.fsdp.set_gradient_divide_factor(1.0)
        self.fsdp.set_force_sum_reduction_for_comms(True)
        self.layout = dict(zip(self.fsdp.names, self.fsdp.weights()))

    def _placed(self, name: str, value: Any) -> Any:
        """``value`` sharded like the parameter it belongs to (``name`` or ``slot/name``), or whole."""
        owner = self.layout.get(name, self.layout.get(name.split("/", 1)[-1]))
        if owner is None or tuple(value.shape) != tuple(owner.shape) or not value.is_floating_point():
            return value
        return distribute_tensor(value.detach(), owner.device_mesh, owner.placements)

    def value_and_grad(self, objective: Callable, params: dict[str, Any]) -> tuple[tuple[Any, Any], dict[str, Any]]:
        module = self.fsdp
        assert module is not None  # the params were placed first
        with torch.no_grad():  # this step's shards (a no-op where they are the module's own)
            for weight, name in zip(module.weights(), module.names):
                weight.to_local().copy_(params[name].to_local())
                weight.grad = None
        with torch.enable_grad():
            value, aux = module(lambda p: objective({**params, **p}))
            value.backward()
        found = dict(zip(module.names, (w.grad for w in module.weights())))  # shards (DTensors)
        grads = {k: torch.zeros_like(v) if found.get(k) is None else found[k] for k, v in params.items()}
        return (value.detach(), detached(aux)), grads

    def gather(self, arrays: dict[str, Any], device: Any) -> dict[str, Any]:
        """``arrays`` whole on every rank, on the shards' device (an all-gather, so every rank
        calls it): the explicit gather."""
        return self.whole(arrays)

    def whole(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` as plain tensors of the whole values, for code outside the step (evaluation,
        numpy copies, checkpoints): shards (DTensors) all-gathered, every rank calling it."""
        return {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in arrays.items()}


class TensorParallelProcessReplicas(ProcessReplicas):
    """A ``data x model`` mesh of the launched processes (``mesh={"data": d, "model": m}``,
    ``d * m`` processes, rank ``r`` at row ``r // m``, column ``r % m``): the zoo transformers'
    attention and MLP layers split over ``model`` as ``training.tensor_parallel_axis`` says, the
    batch over ``data``.

    Every floating parameter becomes a DTensor on the mesh's ``model`` axis through this rank
    (a 1-D ``DeviceMesh`` of the ranks that share its slice of the batch): ``Shard(axis)`` where
    the layout splits it (this rank holds ``1/m`` of it), ``Replicate()`` elsewhere; its
    optimizer slots (``m/<name>``) alike. The step's forward runs the op set's torch ops on them
    as they are: DTensor's sharding propagation picks each op's layout and inserts the
    collectives over ``model``, and :meth:`computing` has them be Megatron's: a row-split layer's
    output summed at once (and, in the backward pass, a column-split layer's input gradient), so
    nothing else moves. The batch stays a plain tensor, the same on every rank of that axis, which
    ``implicit_replication`` lets DTensor take as a copy. The gradients come back in the
    parameters' layouts; across ``data`` they are summed (``all_reduce`` over the ranks of one
    column), each rank's loss being weighted by its rows, as under DDP. :meth:`whole`
    all-gathers the whole arrays, every rank calling it, in their saved shapes.

    A zoo transformer's fused ``attn.qkv`` is held by its parts, ``(width, 3, width)`` split
    along the last axis (``training.tensor_parallel_shape``): this rank holds the same heads of
    q, k and v, and its projection, attention and output projection run with no collective
    before the sum after ``attn.out`` (split as saved, in column blocks, DTensor would all-gather
    the projection's output to split it into q, k and v, and attend with every head on every rank).

    The token embedding is split by vocabulary where ``m`` divides it (``training.VOCAB_SPLIT``):
    this rank holds ``vocab / m`` rows, the lookup sums each rank's rows (:func:`_vocab_lookup`,
    one all-reduce) and its gradient stays split. A head tied to it (gpt2, llama) is its
    transpose, split by columns: the logits come out split by vocabulary (``Shard(-1)``), and
    DTensor all-gathers them where the loss's softmax reads the whole vocabulary (``log_softmax``
    takes its axis whole), and again where the step hands its outputs to the metrics.
    """

    shards = True

    def __init__(self, backend: Any, data: int, model: int):
        super().__init__(backend)
        self.data, self.model = data, model
        self.row = self.rank // model  # this rank's place on the data axis: its slice of the batch
        self.mesh: Any = None  # the DeviceMesh, made once the group is joined (place_params)
        self.layers: Any = None  # its "model" axis through this rank, where the DTensors live
        self.layout: dict[str, Any] = {}  # the floating parameters' shapes: what becomes a DTensor
        _index_add_by_replicas()

    def place_params(self, arrays: dict[str, Any]) -> dict[str, Any]:
        whole = super().place_params({k: v for k, v in arrays.items() if not isinstance(v, DTensor)})
        if self.mesh is None:  # the first arrays placed are the parameters (the trainer places them first)
            device = next((v.device.type for v in whole.values()), "cpu")
            self.mesh = init_device_mesh(device, (self.data, self.model), mesh_dim_names=training.MESH_AXES)
            self.layers = self.mesh["model"]  # this rank's row: the ranks that split its layers
            self.layout = {k: v.shape for k, v in whole.items() if v.is_floating_point()}
        return {k: arrays[k] if isinstance(arrays[k], DTensor) else self._placed(k, whole[k]) for k in arrays}

    def _placed(self, name: str, value: Any) -> Any:
        """``value`` as a DTensor split along ``training.tensor_parallel_axis`` over ``model``
        (or whole on each rank) where it is a floating parameter ``name`` or an optimizer slot
        (``m/<name>``) shaped like one, as saved or as held (:meth:`held_shape`: a fused
        ``attn.qkv`` by its parts, reshaped here); anything else (buffers, a batch, the step
        count) plain."""
        saved = self.layout.get(name, self.layout.get(name.split("/", 1)[-1]))
        if saved is None or not value.is_floating_point():
            return value
        held = self.held_shape(name, tuple(saved))
        if value.shape == saved:
            value = value.reshape(held)
        elif tuple(value.shape) != held:
            return value
        axis = training.tensor_parallel_axis(name, held, self.model)
        return distribute_tensor(value.detach(), self.layers, [Replicate() if axis is None else Shard(axis)])

    def place_batch(self, x: Any, y: Any) -> tuple[Any, Any]:
        return x.tensor_split(self.data)[self.row], y.tensor_split(self.data)[self.row]

    def weight(self, x: Any) -> Any:
        rows = torch.tensor(float(x.shape[0]))
        return rows / self._over_data(rows.clone())

    def sum(self, tree: Any) -> Any:
        if isinstance(tree, dict):
            return {k: self.sum(v) for k, v in tree.items()}
        return self._over_data(_plain(tree).clone())

    def _over_data(self, value: Any) -> Any:
        """``value`` summed over the ranks of this rank's column of the mesh (its data axis)."""
        if self.data > 1:
            dist.all_reduce(value, group=self.mesh.get_group("data"))
        return value

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """The block the step computes on the split layers in, its forward and backward passes
        alike: plain tensors (the batch) taken as copies on every rank of the ``model`` axis
        (``implicit_replication``); attention by its math (matmul, softmax), which DTensor splits
        by heads, since the fused CPU kernel's backward has no sharding rule in torch (its forward
        does); and Megatron's exchanges (:class:`_Megatron`): a row layer's output summed over
        ``model`` at once, and a column layer's input gradient likewise, so that a step
        exchanges nothing else. A test counts a forward pass's collectives in it as the step
        runs them.
        """
        with implicit_replication(), sdpa_kernel(SDPBackend.MATH), _Megatron():
            yield

    def value_and_grad(self, objective: Callable, params: dict[str, Any]) -> tuple[tuple[Any, Any], dict[str, Any]]:
        trained = {k: v.detach().requires_grad_() for k, v in params.items() if isinstance(v, DTensor)}
        with torch.enable_grad(), self.computing():  # the backward too: remat recomputes in it
            value, aux = objective({**params, **trained})
            value.backward()
        grads = {}
        for name, param in params.items():
            grad = trained[name].grad if name in trained else None
            if grad is None:  # an integer array, or a parameter the loss does not use
                grads[name] = torch.zeros_like(param)
                continue
            if grad.placements != param.placements:  # a partial sum left by the last op
                grad = grad.redistribute(placements=param.placements)
            self._over_data(grad.to_local())
            grads[name] = grad
        return (_plain(value.detach()), map_leaves(_plain, detached(aux))), grads

    def gather(self, arrays: dict[str, Any], device: Any) -> dict[str, Any]:
        """``arrays`` whole on every rank (an all-gather, so every rank calls it)."""
        return self.whole(arrays)

    def whole(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` as plain tensors of the whole values, in their saved shapes, every rank
        calling it."""
        return self.saved({k: _plain(v) for k, v in arrays.items()})

    def saved(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """``arrays`` in their saved shapes (:meth:`saved_shape`). A fused projection held by its
        parts, ``(width, 3, width)`` split along the last axis, reshaped back to ``(width, 3 *
        width)``, is a view with no exchange: DTensor calls its placement
        ``_StridedShard(1, split_factor=3)``, each rank's columns of q, k and v."""
        return {k: self._saved(k, v) for k, v in arrays.items()}

    def _saved(self, name: str, value: Any) -> Any:
        shape = tuple(value.shape)
        saved = self.saved_shape(name, shape)
        return value if saved == shape else value.reshape(saved)


class _Megatron(TorchFunctionMode):
    """Megatron-LM's two exchanges around the split layers, as torch's ``RowwiseParallel`` and
    ``ColwiseParallel`` make them, for a forward written over the op set on DTensors:

    - after a layer split by rows (``attn.out``, ``mlp.fc2``, ``mlp.down``; Megatron's *g*,
      ``RowwiseParallel(output_layouts=Replicate())``): a product (``matmul``, ``linear``,
      ``einsum``, ...) whose result DTensor holds as a partial sum (``Partial``: each rank's
      input rows times its rows of the weight) is summed over the ranks at once, one
      all-reduce, before anything reads it;
    - before a layer split by columns (``attn.qkv``, ``attn.q``, ``mlp.fc1``, ``mlp.gate``, ...;
      Megatron's *f*, ``ColwiseParallel(input_layouts=Replicate())``): a whole (``Replicate``)
      operand of a product with a split one is handed to it through ``DTensor.from_local``, so
      that in the backward pass its gradient, a partial sum, is summed at once (one all-reduce),
      once for all the products that read it (llama's ``attn.q``, ``attn.k`` and ``attn.v``).

    Left to itself, DTensor carries a partial sum on while the next ops are linear in it (the
    residual add, RMSNorm's last scaling) and pays later, in another currency: in llama it
    all-gathered the ``mlp.gate`` and ``mlp.up`` weights to multiply them by the sum after
    ``attn.out``, and in the backward pass weights and attention activations as well; in every
    zoo transformer the norms' gradients came out as partial sums, each all-reduced after the
    backward pass. With both exchanges every activation between a row layer and the next column
    layer is whole on each rank, and a step exchanges only these sums: per block, two in the
    forward pass and two in the backward (and, under ``remat``, the forward's again where the
    recomputation needs them). The math is the same sums, done sooner.

    Only products are looked at, and only calls made from Python: autograd's own backward ops
    never pass here, while a block's forward recomputed in the backward pass does (the op set's
    ``checkpoint`` enters the modes marked ``recomputed`` again).

    One more call is mended here: torch's convolution backward under DTensor takes DTensors
    only, so a plain input to a convolution with a DTensor weight (vit's images, taken as a copy
    on every rank by ``implicit_replication`` in the forward) is handed to it as a replicated
    DTensor.

    And a lookup in a table split by rows (the token embedding split by vocabulary,
    ``training.VOCAB_SPLIT``; the op set's ``take`` is ``index_select``) is Megatron's
    ``VocabParallelEmbedding`` (:func:`_vocab_lookup`): each rank looks up the ids in its rows,
    zeros for the rest, and one all-reduce sums them; its gradient stays this rank's rows.
    DTensor's own rule for ``aten.embedding`` does the forward so, but its backward's rules
    (torch 2.13) split the table's gradient by columns or leave it a partial sum of the whole
    table, never by rows; its ``index_select`` rules split no table along the axis picked from,
    so it would all-gather the table.
    """

    PRODUCTS = frozenset(
        {
            torch.matmul,
            torch.mm,
            torch.bmm,
            torch.einsum,
            torch.nn.functional.linear,
            torch.Tensor.matmul,
            torch.Tensor.__matmul__,
        }
    )
    CONVOLUTIONS = frozenset({torch.conv1d, torch.conv2d, torch.conv3d})  # torch.nn.functional's too

    #: in force again when the backward pass recomputes a block (``remat``: the op set's ``checkpoint``)
    recomputed = True

    def __init__(self) -> None:
        super().__init__()
        # each whole operand's handle (Megatron's f), by the operand's id: one per activation,
        # however many column layers read it, kept while the operand lives (a remat block drops
        # both)
        self.handles: dict[int, tuple[weakref.ref, DTensor]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in self.CONVOLUTIONS and isinstance(args[1], DTensor) and not isinstance(args[0], DTensor):
            mesh = args[1].device_mesh
            args = (DTensor.from_local(args[0], mesh, [Replicate()] * mesh.ndim), *args[1:])
        if func is torch.index_select and not kwargs and _split_rows(args):
            return _vocab_lookup(*args)
        if func not in self.PRODUCTS:
            return func(*args, **kwargs)
        if any(isinstance(a, DTensor) and not _whole(a) for a in args):  # whole operands beside split ones
            args = tuple(self._handle(a) if _whole_with_gradient(a) else a for a in args)
        result = func(*args, **kwargs)
        if isinstance(result, DTensor) and any(p.is_partial() for p in result.placements):
            return result.redistribute(placements=[Replicate() if p.is_partial() else p for p in result.placements])
        return result

    def _handle(self, value: DTensor) -> DTensor:
        """``value`` as a column layer reads it: the same whole values, whose gradient
        ``from_local`` redistributes to ``Replicate`` (an all-reduce of the partial sums)."""
        key = id(value)
        held = self.handles.get(key)
        if held is not None and held[0]() is value:
            return held[1]
        handle = DTensor.from_local(value.to_local(), value.device_mesh, value.placements)
        self.handles[key] = (weakref.ref(value, lambda _: self.handles.pop(key, None)), handle)
        return handle


def _split_rows(args: tuple) -> bool:
    """Whether ``index_select(*args)`` picks rows (axis 0) of a table split by rows over a 1-D
    mesh (the token embedding split by vocabulary), in even parts, with ids that are whole."""
    if len(args) != 3 or not isinstance(args[0], DTensor) or args[1] % max(args[0].dim(), 1) != 0:
        return False
    table, ids = args[0], args[2]
    mesh = table.device_mesh
    return (
        mesh.ndim == 1
        and table.placements == (Shard(0),)
        and table.shape[0] % mesh.size() == 0
        and (not isinstance(ids, DTensor) or _whole(ids))
    )


def _vocab_lookup(table: DTensor, axis: int, ids: Any) -> DTensor:
    """``index_select(table, 0, ids)`` for a ``table`` split by rows (:func:`_split_rows`), as
    Megatron-LM's ``VocabParallelEmbedding`` computes it: this rank's rows picked for the ids in
    its range, zeros for the others (torch's ``_MaskPartial`` for ``aten.embedding`` does the
    same), a partial sum made whole by one all-reduce (``Partial`` to ``Replicate``). In the
    backward pass the gradient, whole on every rank, goes back through the mask into this rank's
    rows only (no exchange): the table's gradient is split like the table."""
    mesh = table.device_mesh
    local = table.to_local()
    rows = local.shape[0]
    ids = ids.to_local() if isinstance(ids, DTensor) else ids
    shifted = ids - mesh.get_local_rank() * rows
    outside = (shifted < 0) | (shifted >= rows)
    picked = torch.index_select(local, 0, shifted.masked_fill(outside, 0))
    picked = picked.masked_fill(outside.reshape(-1, *[1] * (picked.dim() - 1)), 0)
    return DTensor.from_local(picked, mesh, [Partial()]).redistribute(mesh, [Replicate()])


def _whole(value: DTensor) -> bool:
    return all(p.is_replicate() for p in value.placements)


def _whole_with_gradient(value: Any) -> bool:
    return isinstance(value, DTensor) and _whole(value) and value.requires_grad


@functools.cache
def _index_add_by_replicas() -> None:
    """Tell DTensor to run ``index_add`` (the backward of the op set's ``take``, an embedding
    lookup) on whole copies, or split along another axis than the one added into. torch has no
    sharding rule for it and falls back to its decomposition, which, given a gradient that is a
    partial sum (from a layer split by rows), gives wrong values (torch 2.13: the lookup's
    gradient off by the size of the gradient itself)."""

    @register_sharding([torch.ops.aten.index_add.default, torch.ops.aten.index_add_.default])
    def _rule(x: Any, dim: int, index: Any, source: Any, alpha: Any = 1) -> list[tuple[list, list]]:
        whole = ([Replicate()], [Replicate(), None, Replicate(), Replicate()])
        axes = [d for d in range(len(x.shape)) if d != dim % len(x.shape)]
        return [whole, *(([Shard(d)], [Shard(d), None, Replicate(), Shard(d)]) for d in axes)]


def _plain(value: Any) -> Any:
    """A DTensor's whole value as a plain tensor (gathered where it is split); else ``value``."""
    return value.full_tensor() if isinstance(value, DTensor) else value


class Replication:
    def join_processes(self) -> None:
        join(None)  # no tensor yet: each collective goes by its tensors' devices

    def process_replicas(self) -> ProcessReplicas:
        return ProcessReplicas(self)


def join(devices: Iterable[torch.device] | None) -> None:
    """Join the launched processes' group (once), its collective backend chosen by
    :func:`collective` for the ``devices`` this rank computes on (None: not known yet)."""
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
    backend, device_id = collective(devices, cuda_available=torch.cuda.is_available())
    if device_id is not None:
        torch.cuda.set_device(device_id)  # NCCL's collectives run on the current device
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=size, device_id=device_id)
    # left to interpreter exit, gloo's threads can abort the process ("terminate called
    # without an active exception"): leave the group in order, after every rank is done
    atexit.register(_leave_group)


def _leave_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
