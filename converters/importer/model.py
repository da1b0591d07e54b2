"""``from_onnx``: an ONNX model bound to a backend and a device, with its weights as parameters."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConversionError, InputError, UnsupportedOp, XDeviceError, message
from xdevice.backends.opset import numpy_dtype
from xdevice.converters.importer.fusion import fuse
from xdevice.converters.importer.inputs import check_inputs, declared_inputs
from xdevice.converters.importer.interpreter import (
    Context,
    Graph,
    Plan,
    is_static,
    prepare_weights,
    prepared_nodes,
    run_graph,
    run_nodes,
    unsupported,
    weight_only,
)
from xdevice.converters.load import load_model

__all__ = ["ImportedModel", "from_onnx"]

_FLOATS = ("float16", "bfloat16", "float32", "float64")
#: ONNX's TensorProto data types of the floats above (FLOAT16, FLOAT, DOUBLE, BFLOAT16)
_FLOAT_NAMES = {10: "float16", 1: "float32", 11: "float64", 16: "bfloat16"}


def _numeric_static(value: Any) -> bool:
    """A static (numpy) output the backend can hold: string tensors stay numpy."""
    return is_static(value) and value is not None and np.asarray(value).dtype.kind not in "OSU"


def from_onnx(model: Any, backend: str = "numpy", device: Any = "cpu", *, check: bool = True) -> ImportedModel:
    """An ONNX model (path, bytes or ModelProto) as a function on ``backend``.

    Every op the model uses must have a handler: all missing ones are listed in one
    ``UnsupportedOp`` before anything runs.

    >>> model = from_onnx("model.onnx", backend="jax")  # doctest: +SKIP
    >>> outputs = model(x)                               # doctest: +SKIP
    """
    return ImportedModel(load_model(model, check=check), backend, device)


class ImportedModel:
    """An ONNX graph as a function of one backend.

    Attributes:
        params: the weights: float initializers, as the backend's arrays on ``device``
            (trainable), except those in ``constants``.
        constants: float initializers that are not weights (numpy, fixed when traced): read
            where a value must be known when the graph is built (shapes, scales), as a
            ``Pow`` exponent, or scalars (epsilons, GELU's coefficients, a mask's fill value).
        shared: ``{name: readers}`` for the weights more than one node reads: tied on purpose
            (an LM head reading the embedding), or merged by the exporter because their values
            were equal (fresh LayerNorm weights are all ones); training updates each as one.
        input_names, output_names: the graph's inputs (initializers excluded) and outputs.
        opset: the default-domain opset the model was written for.
        fused: how many op chains were fused into one op-set call when loading (``fusion``).
    """

    def __init__(self, proto, backend: str, device: Any):
        self.proto = proto
        opsets = {("" if imp.domain == "ai.onnx" else imp.domain): imp.version for imp in proto.opset_import}
        self.opset = opsets.get("")
        self.graph = Graph(proto.graph, opsets)
        missing = unsupported(self.graph)
        if missing:
            raise UnsupportedOp(
                message(
                    f"{len(missing)} ONNX op(s) in this model have no handler",
                    received="; ".join(missing),
                    fix="these ops cannot be imported yet; `xdevice conformance` shows what is covered",
                )
            )
        constants, readers = _constants(self.graph)
        self.fused = fuse(self.graph)
        self.backend = _registry.backend(backend)
        self.device = find(device, backend=backend)
        # Say the device (DESIGN.md): JAX and TensorFlow put new arrays on GPU 0 when there is
        # one, and TensorFlow runs ops on CPU tensors there too, so on them every call computes
        # inside the device's scope, cpu:0 included. PyTorch keeps new tensors on the CPU, and
        # its device context intercepts every torch call: there it is entered only off cpu:0.
        # (where the framework sees one device, cpu:0, there is no other place: no scope needed)
        self._follows_gpu = self.backend.defaults_to_gpu and len(self.backend.list_devices()) > 1
        self._scope = (
            (lambda: self.backend.default_device(self.device))
            if self.backend.defaults_to_gpu or self.device != Device("cpu", 0)
            else contextlib.nullcontext
        )
        floats = {name: value for name, value in self.graph.initializers.items() if value.dtype.name in _FLOATS}
        with self._scope():  # made on the device, not copied there from GPU 0
            self.params = {name: self._place(value) for name, value in floats.items() if name not in constants}
        self.constants = {name: floats[name] for name in floats if name in constants}
        self.shared = {name: readers[name] for name in self.params if readers.get(name, 0) > 1}
        self.input_names = list(self.graph.inputs)
        self.declared = declared_inputs(proto.graph, self.graph.initializers)  # checked once per signature
        self._checked: set[tuple] = set()
        self._holds: dict[str, str] = {}
        self.output_names = list(self.graph.outputs)
        self._plans: dict[tuple, Plan] = {}
        self._programs: dict[tuple, Any] = {}  # input signature -> the captured program
        # (type, shape, dtype) of each input -> its program, once such inputs ran captured: a
        # call with inputs like these skips the checks and conversions (per-call time at batch 1)
        self._known: dict[tuple, Any] = {}
        self._captures = self.backend.capture(_probe) is not _probe  # False: nothing to gain
        # nodes computing on the weights alone run once per state of the weights they read, not
        # in every call: a call's program takes their results (and the weights other nodes read)
        self._prepare = weight_only(self.graph, self.params)
        skipped = set(self._prepare)
        read = {*self.output_names, *_read_by(self.graph, skipped)}
        self._prepared_names = [
            name for i in self._prepare for name in self.graph.nodes[i].outputs if name and name in read
        ]
        # ... and so do handlers' own preparations of their weight inputs (an LSTM's gate order)
        self._preparing = prepared_nodes(self.graph, self.params)
        self._prepare_reads = sorted(
            {name for i in [*self._prepare, *self._preparing] for name in self.graph.nodes[i].inputs} & set(self.params)
        )
        self._still_read = [name for name in self.params if name in read]
        self._prepared: tuple[tuple, dict[str, Any]] | None = None  # (state of the weights, results)
        self._versioned = any(hasattr(v, "_version") for v in self.params.values())  # in-place writes counted
        self._prepared_inputs: dict[int, list[str]] = {}  # node position -> names of its preparation's results

    def apply(self, params: dict[str, Any], *inputs: Any) -> tuple[Any, ...]:
        """The graph's outputs for ``inputs`` with the float initializers taken from
        ``params`` (a pure function of both: differentiate or compile it natively)."""
        if len(inputs) != len(self.input_names):
            raise ConversionError(
                message(
                    "Wrong number of inputs",
                    expected=f"{len(self.input_names)}: {', '.join(self.input_names)}",
                    received=len(inputs),
                )
            )
        return self._run(params, inputs, ())

    def _run(
        self, weights: dict[str, Any], inputs: tuple, skip: Any, prepared: dict[int, list[str]] | None = None
    ) -> tuple[Any, ...]:
        """``apply`` with ``weights`` holding the outputs of the nodes at positions ``skip`` and
        the results of the weight preparations named in ``prepared`` (by node position)."""
        ctx = Context(self.backend)
        with self._scope():
            feeds = [self._input(x) for x in inputs]
        key = _signature(self.backend.ops, feeds)
        plan = self._plans.get(key) if key is not None else None
        fresh = plan is None and key is not None
        if fresh:  # a new signature: its shapes are checked once (dtypes: apply computes in any precision)
            check_inputs(self.declared, feeds, self.backend.ops.shape, None)
            plan = Plan(self.params)  # (a dict: its keys are the names)
        values = {**weights, **dict(zip(self.input_names, feeds))}
        with self._scope():
            outputs = run_graph(self.graph, ctx, values, plan, skip, prepared)
            result = tuple(ctx.array(o) if _numeric_static(o) else o for o in outputs)
        if fresh:
            assert key is not None and plan is not None  # fresh: a new plan for a known signature
            if len(self._plans) >= _PLANS:  # a bound for a stream of ever new shapes
                self._plans.clear()
            self._plans[key] = plan
        return result

    def __call__(self, *inputs: Any) -> Any:
        """The outputs for ``inputs``: one array, or a tuple when the graph has several.

        The call runs captured (``Backend.capture``: ``jax.jit``, ``tf.function``, a
        ``torch.fx`` graph), traced once per input signature; a graph that needs data while it
        is built (a data-dependent shape) or takes sequences runs through the interpreter.
        """
        key = _quick_key(inputs)
        known = self._known.get(key) if key is not None else None
        if known is not None:  # inputs like these ran captured before: checked, nothing to convert
            weights = self._weights() if self._prepare or self._preparing else self.params
            if self._follows_gpu:
                with self._scope():
                    outputs = known(weights, *inputs)
            else:
                outputs = known(weights, *inputs)
            return outputs[0] if len(outputs) == 1 else outputs
        self._check(inputs)
        outputs = None
        if self._captures and all(_is_tensor(x) for x in inputs):
            try:
                weights = self._weights() if self._prepare or self._preparing else self.params
                program, placed = self._program(inputs, weights)
                # a jitted JAX program and a tf.function place what no argument pins on the
                # default device of the call; a torch.fx graph keeps the devices it was traced under
                with self._scope() if self._follows_gpu else contextlib.nullcontext():
                    outputs = program(weights, *placed)
            except Exception:  # noqa: BLE001 - each tracer refuses concrete values its own way
                outputs = self.apply(self.params, *inputs)  # a mistake in the inputs raises here, as it is
                self._captures = False  # the graph needs data while it is built: interpreted from now on
                self._known.clear()
            else:
                if key is not None and all(p is x for p, x in zip(placed, inputs)):
                    if len(self._known) >= _PLANS:
                        self._known.clear()
                    self._known[key] = program
        if outputs is None:
            outputs = self.apply(self.params, *inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def traced(self, *inputs: Any) -> Any:
        """The framework's own program of ``apply`` for inputs like these (their shapes and
        dtypes), called as ``program(params, *inputs)``: a ``torch.fx.GraphModule`` on
        PyTorch (``torch.compile(program)`` and ``torch.export`` take it as it is), the
        ``jax.jit`` / ``tf.function`` of ``apply`` on JAX and TensorFlow.

        Raises:
            ConversionError: the graph needs concrete data while it is built.
        """
        try:
            return self._program(inputs)[0]
        except XDeviceError:
            raise
        except Exception as error:
            raise ConversionError(
                message(
                    "This graph cannot be traced: it needs concrete data while it is built",
                    received=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}",
                    fix="call the model (or apply) eagerly",
                )
            ) from error

    def to_onnx(self) -> Any:
        """The model as an ``onnx.ModelProto`` again: its own graph, with the current weights
        (fine-tuned ones included) as initializers. No framework exporter runs, so this is
        the same on every backend and cannot fail the way a tracer can."""
        import onnx
        from onnx import numpy_helper

        from xdevice._tensors import to_host

        proto = onnx.ModelProto()
        proto.CopyFrom(self.proto)
        for tensor in proto.graph.initializer:
            if tensor.name in self.params:
                value = to_host(self.params[tensor.name]).astype(numpy_dtype(_FLOAT_NAMES[tensor.data_type]))
                tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
        return proto

    def _program(self, inputs: tuple, weights: dict[str, Any] | None = None) -> tuple[Any, list[Any]]:
        """The captured program for inputs like ``inputs``, and the inputs as it takes them: of
        ``apply`` (``weights`` None), or of the graph after the weight-only nodes, whose
        results ``weights`` holds (what a call runs)."""
        with self._scope():
            placed = [self._input(x) for x in inputs]
        signature = _signature(self.backend.ops, placed)
        key = None if signature is None else (weights is not None, signature)
        program = self._programs.get(key) if key is not None else None
        if program is None:
            if weights is None:
                program = self.backend.capture(self.apply, self.params, *placed)
            else:
                skip, prepared = frozenset(self._prepare), dict(self._prepared_inputs)
                # only called, never handed out (PyTorch calls its ops through torch's bindings)
                program = self.backend.capture_for_calls(
                    lambda w, *xs: self._run(w, xs, skip, prepared), weights, *placed
                )
            if key is not None:
                if len(self._programs) >= _PLANS:
                    self._programs.clear()
                self._programs[key] = program
        return program, placed

    def _weights(self) -> dict[str, Any]:
        """What a call's program takes for the weights: the results of the weight-only nodes
        and of the handlers' weight preparations, computed again only when a weight they read
        was replaced or written in place (PyTorch counts a tensor's in-place writes in
        ``_version``), and the weights other nodes read."""
        params = self.params
        # every call computes this state, so it is built with C-level maps (per-call Python
        # at batch 1: ``benchmarks/convert.py --parts calls``); only PyTorch counts writes
        read = list(map(params.__getitem__, self._prepare_reads))
        state: tuple[Any, ...] = tuple(map(id, read))
        if self._versioned:
            state += tuple([getattr(v, "_version", None) for v in read])
        if self._prepared is None or self._prepared[0] != state:
            ctx = Context(self.backend)
            with self._scope():
                values = run_nodes(self.graph, ctx, params, self._prepare)
                made = prepare_weights(self.graph, ctx, values, self._preparing)
            prepared = {name: values[name] for name in self._prepared_names}
            self._prepared_inputs = {}
            for index, results in made.items():
                names = [f"<prepared by node {index}: {k}>" for k in range(len(results))]
                self._prepared_inputs[index] = names
                prepared.update(zip(names, results))
            if not all(_is_tensor(v) and not is_static(v) for v in prepared.values()):
                self._prepare, self._preparing = [], []  # a sequence or a value numpy folded: the graph runs as written
                self._prepared_inputs = {}
                return params
            self._prepared = (state, prepared)
        return {**{name: params[name] for name in self._still_read}, **self._prepared[1]}

    def _check(self, inputs: tuple) -> None:
        """Count, dtypes and shapes of a call's inputs against the graph's declarations, once
        per signature (:class:`InputError` naming the input)."""
        if len(inputs) != len(self.input_names):
            raise InputError(
                message(
                    "Wrong number of inputs",
                    expected=f"{len(self.input_names)}: {', '.join(self.input_names)}",
                    received=len(inputs),
                )
            )
        key = tuple((getattr(x, "shape", None), str(getattr(x, "dtype", type(x)))) for x in inputs)
        if key in self._checked:
            return
        ops = self.backend.ops
        check_inputs(self.declared, inputs, lambda x: tuple(x.shape), lambda x: _dtype_name(ops, x), self._held)
        if len(self._checked) >= _PLANS:
            self._checked.clear()
        self._checked.add(key)

    def _held(self, dtype: str) -> str:
        """The dtype the backend holds ``dtype`` in (JAX without x64 holds int64 as int32)."""
        if dtype not in self._holds:
            try:
                self._holds[dtype] = self.backend.ops.dtype(self.backend.ops.asarray(np.zeros((), numpy_dtype(dtype))))
            except Exception:  # noqa: BLE001 - a dtype the backend has no array of: only itself
                self._holds[dtype] = dtype
        return self._holds[dtype]

    def _place(self, value: np.ndarray) -> Any:
        return self.backend.to_device(self.backend.ops.asarray(value), self.device)

    def _input(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)) or x is None:  # sequences and empty optionals pass as they are
            return x
        if isinstance(x, np.ndarray) and x.dtype.kind in "OSU":
            return x  # strings stay numpy: only handlers that understand them read them
        return self.backend.ops.asarray(x) if isinstance(x, (np.ndarray, np.generic, int, float)) else x

    def __repr__(self) -> str:
        shared = f", {len(self.shared)} read by several nodes" if self.shared else ""
        return (
            f"<ImportedModel opset {self.opset} on {self.backend.name} {self.device}: "
            f"inputs {self.input_names} -> outputs {self.output_names}; {len(self.params)} weights{shared}>"
        )


_PLANS = 64


def _probe(*args: Any) -> Any:
    return args


def _quick_key(inputs: tuple) -> tuple | None:
    """Each input's type, shape and dtype, as they are (no conversion), or None when one has
    no shape or dtype (a sequence, None, a Python number) or an unhashable shape (a symbolic
    dimension).

    Every call computes it, so it is written for speed (attribute errors instead of
    ``getattr`` defaults, no generator for the usual single input): at batch 1 it is a
    visible part of a call's Python (``benchmarks/convert.py --parts calls`` measures it).
    """
    try:
        if len(inputs) == 1:
            x = inputs[0]
            key: tuple = ((type(x), x.shape, x.dtype),)
        else:
            key = tuple([(type(x), x.shape, x.dtype) for x in inputs])
        hash(key)
    except (AttributeError, TypeError):
        return None
    return key


def _signature(ops: Any, feeds: list[Any]) -> tuple | None:
    """Shapes and dtypes of the inputs, or None when one is not a plain array of concrete
    shape (a sequence, or a dimension that is symbolic under tracing)."""
    key = []
    for x in feeds:
        if isinstance(x, (list, tuple)) or x is None:
            return None
        shape = tuple(ops.shape(x))
        if not all(type(d) is int for d in shape):
            return None
        key.append((shape, str(x.dtype)))
    return tuple(key)


def _read_by(graph: Graph, skipped: set[int]) -> set[str]:
    """The names the nodes of ``graph`` read, but for those at the positions in ``skipped``
    (what their subgraphs read from the enclosing scope included)."""
    read: set[str] = set()
    for index, node in enumerate(graph.nodes):
        if index in skipped:
            continue
        read.update(node.inputs)
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Graph):
                    read.update(sub.outer_names)
    return read


def _constants(graph: Graph) -> tuple[set[str], dict[str, int]]:
    """The float initializers that are not weights (see ``ImportedModel.constants``), and how
    many nodes read each initializer (subgraphs included)."""
    floats = {name for name, value in graph.initializers.items() if value.dtype.name in _FLOATS}
    constants = {name for name in floats if graph.initializers[name].ndim == 0}
    readers: dict[str, int] = {}
    for node, _ in graph.walk():
        static = node.handler.static if node.handler is not None else ()
        for position, name in enumerate(node.inputs):
            readers[name] = readers.get(name, 0) + 1
            if name in floats and (position in static or (node.op == "Pow" and position == 1)):
                constants.add(name)
    return constants, readers


def _dtype_name(ops: Any, x: Any) -> str:
    """``x``'s dtype as numpy names it, for numpy arrays and the backend's own."""
    return x.dtype.name if isinstance(x, (np.ndarray, np.generic)) else ops.dtype(x)


def _is_tensor(x: Any) -> bool:
    """A value a compiled call can take: an array, not a sequence, None or strings."""
    if isinstance(x, (list, tuple)) or x is None:
        return False
    return not (isinstance(x, np.ndarray) and x.dtype.kind in "OSU")
