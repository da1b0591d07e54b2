"""The interpreter: runs an ONNX graph node by node over one backend's op set.

Values flowing through the graph are of four kinds: *static* numpy arrays (shapes, axes,
integer constants: known when the graph is built, so ``Reshape`` and ``Slice`` work under
``jax.jit`` and ``tf.function``), the backend's own arrays, Python lists (ONNX sequences)
and :class:`Optional` (ONNX optionals). A node whose inputs are all static is folded with
the numpy reference on the spot and its outputs stay static. A handler that needs a
concrete value (``static=`` inputs, a loop count) gets one eagerly; under tracing, a value
that is not static raises ``ConversionError`` naming the node.

Subgraphs (``If``, ``Loop``, ``Scan``) run through the same interpreter, seeing the outer
graph's values by name.

Work that does not depend on the data is done once, not per call: every node's handler is
resolved when the model is loaded (``Graph.bind``), and a :class:`Plan` per input signature
(shapes and dtypes) remembers the outputs of every node that folded to a value fixed by the
signature alone (constants, shapes and the arithmetic over them), so a later call with the
same signature runs only the nodes that compute on data. Nodes that compute on the weights
alone (an exporter's reordering of an LSTM's gates, a transposed weight) are found by
:func:`weight_only`: an ``ImportedModel`` call runs them once and hands their results to the
captured program instead of the weights (``run_graph(..., skip=...)``). A handler's own work
on its weight inputs alone (an LSTM's gates put in the op set's order) is registered with
:func:`registry.prepares`: it too runs once per state of the weights, and the handler finds its
results in ``ctx.prepared`` (``run_graph(..., prepared=...)``).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.converters.importer import registry

__all__ = [
    "Graph",
    "Node",
    "Context",
    "Optional",
    "Plan",
    "run_graph",
    "run_nodes",
    "unsupported",
    "weight_only",
    "prepared_nodes",
    "prepare_weights",
    "numpy_of",
    "ONNX_DTYPES",
    "onnx_dtype",
]

# ONNX TensorProto data types by number, as our dtype names ("string" for STRING)
ONNX_DTYPES = {
    1: "float32",
    2: "uint8",
    3: "int8",
    4: "uint16",
    5: "int16",
    6: "int32",
    7: "int64",
    8: "string",
    9: "bool",
    10: "float16",
    11: "float64",
    12: "uint32",
    13: "uint64",
    16: "bfloat16",
    17: "float8_e4m3fn",
    18: "float8_e4m3fnuz",
    19: "float8_e5m2",
    20: "float8_e5m2fnuz",
    21: "uint4",
    22: "int4",
    23: "float4_e2m1fn",
    24: "float8_e8m0fnu",
    25: "uint2",
    26: "int2",
}
_RANDOM = ("RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Bernoulli", "Multinomial")
#: ops whose static output depends on their input's shape alone, not its values
_SHAPE_ONLY = ("Shape", "Size")


def onnx_dtype(code: int) -> str:
    if code not in ONNX_DTYPES:
        import onnx

        raise UnsupportedOp(
            message(
                "Unsupported ONNX tensor type",
                received=onnx.TensorProto.DataType.Name(code),
                choices=sorted(set(ONNX_DTYPES.values())),
            )
        )
    return ONNX_DTYPES[code]


@dataclasses.dataclass
class Optional:
    """An ONNX optional: ``value`` is None when empty."""

    value: Any = None


class Node:
    """One ONNX node: its op, input and output names, and attributes as Python values
    (tensors as numpy arrays, graphs as :class:`Graph`), with the schema's defaults."""

    _position: int  # its index in its graph's nodes, while ``fusion`` looks for patterns

    def __init__(self, proto, opsets: dict[str, int]):
        from onnx import helper, numpy_helper

        self.proto = proto
        self.op, self.domain, self.name = proto.op_type, proto.domain, proto.name or proto.op_type
        self.inputs, self.outputs = list(proto.input), list(proto.output)
        self.attrs: dict[str, Any] = {}
        for attribute in proto.attribute:
            value = helper.get_attribute_value(attribute)
            if attribute.type == attribute.TENSOR:
                value = numpy_helper.to_array(value)
            elif attribute.type == attribute.GRAPH:
                value = Graph(value, opsets)
            elif attribute.type == attribute.GRAPHS:
                value = [Graph(g, opsets) for g in value]
            elif isinstance(value, bytes):
                value = value.decode()
            elif attribute.type == attribute.STRINGS:
                value = [v.decode() for v in value]
            self.attrs[attribute.name] = value
        self.domain_key = "" if self.domain in ("", "ai.onnx") else self.domain
        self.has_subgraph = any(
            isinstance(v, Graph) or (isinstance(v, list) and v and isinstance(v[0], Graph)) for v in self.attrs.values()
        )
        self.foldable = self.op not in _RANDOM and not self.has_subgraph
        self.handler: registry.Handler | None = None  # set by Graph.bind
        self.read: list[bool] = [True] * len(self.outputs)  # which outputs a later node or the graph reads

    def attr(self, name: str, default: Any = None) -> Any:
        """The attribute ``name``, or ``default`` when the node leaves it out."""
        return self.attrs.get(name, default)

    def __repr__(self) -> str:
        return f"<{self.op} node {self.name!r}>"


class Graph:
    """A parsed ONNX graph: nodes in order, inputs, outputs and initializers (numpy)."""

    def __init__(self, proto, opsets: dict[str, int]):
        from onnx import numpy_helper

        self.proto, self.opsets = proto, opsets
        self.initializers = {t.name: numpy_helper.to_array(t) for t in proto.initializer}
        self.inputs = [i.name for i in proto.input if i.name not in self.initializers]
        self.outputs = [o.name for o in proto.output]
        self.nodes = [Node(n, opsets) for n in proto.node]
        read = {*self.outputs}
        for node in self.nodes:
            read.update(node.inputs)
            read.update(
                n
                for v in node.attrs.values()
                for g in (v if isinstance(v, list) else [v])
                if isinstance(g, Graph)
                for n in g.outer_names
            )
        for node in self.nodes:
            node.read = [name in read for name in node.outputs]

    def bind(self) -> list[str]:
        """Resolve every node's handler (subgraphs included) once; returns what has none, as
        :func:`unsupported` words it."""
        missing: dict[str, list[str]] = {}
        for node, graph in self.walk():
            opset = graph.opsets.get(node.domain_key)
            found, since = registry.resolve(node.op, node.domain_key, opset) if opset is not None else (None, None)
            node.handler = found
            if found is None:
                where = f"{node.domain_key}::" if node.domain_key else ""
                version = f"opset {opset}" + (f", schema since {since}" if since else ", unknown to onnx.defs")
                missing.setdefault(f"{where}{node.op} ({version})", []).append(node.name)
        return [f"{op}: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}" for op, names in missing.items()]

    @functools.cached_property
    def outer_names(self) -> list[str]:
        """The enclosing scope's values this graph reads (its subgraphs' reads included), in
        first-read order: what a framework's control-flow op takes as explicit operands."""
        defined = {*self.inputs, *self.initializers, ""}
        found: dict[str, None] = {}
        for node in self.nodes:
            subgraphs = [
                g for v in node.attrs.values() for g in (v if isinstance(v, list) else [v]) if isinstance(g, Graph)
            ]
            for name in [*node.inputs, *(n for g in subgraphs for n in g.outer_names)]:
                if name not in defined:
                    found[name] = None
            defined.update(node.outputs)
        return list(found)

    def walk(self) -> Iterable[tuple[Node, Graph]]:
        """Every node of this graph and of its subgraphs, with the graph that holds it."""
        for node in self.nodes:
            yield node, self
            for value in node.attrs.values():
                for sub in value if isinstance(value, list) else [value]:
                    if isinstance(sub, Graph):
                        yield from sub.walk()


def unsupported(graph: Graph) -> list[str]:
    """Every ``op (opset N): node names`` the registry cannot run, subgraphs included (and
    every node's handler bound, see :meth:`Graph.bind`)."""
    return graph.bind()


class Plan:
    """What one input signature fixes in a graph: the outputs of the nodes that folded to
    values determined by the signature alone, by node position. The first run records them;
    later runs with the same signature take them instead of running those nodes. The
    initializers named in ``weights`` are never fixed: they can change between calls, even
    where the backend holds them as numpy arrays."""

    def __init__(self, weights: Collection[str] = ()):
        self.weights = weights
        self.folded: dict[int, tuple] = {}
        self.recording = True
        self.fixed: set[str] = set()  # value names fixed by the signature, while recording

    def note(self, index: int, node: Node, inputs_fixed: bool, outputs: tuple) -> None:
        """Keep ``outputs`` if the node's inputs are fixed (or it reads only their shapes) and
        it computes nothing random: then the same signature always gives the same outputs."""
        fixed = node.op in _SHAPE_ONLY or (node.foldable and inputs_fixed)
        if fixed and all(is_static(o) for o in outputs):
            self.folded[index] = outputs
            self.fixed.update(name for name in node.outputs if name)

    def done(self) -> None:
        self.recording = False
        self.fixed = set()


class Context:
    """What a handler sees: the backend's ops, and helpers for static values and subgraphs."""

    def __init__(self, backend):
        self.backend = backend
        self.ops = backend.ops
        self.node: Node | None = None
        self.values: dict[str, Any] = {}  # the enclosing scope, for nodes with subgraphs
        # the node's inputs as the graph holds them (static numpy where known when the graph
        # is built), before they were converted to the backend's arrays
        self.given: list[Any] = []
        # what the node's weight preparation (see ``registry.prepares``) made, when it ran before the call
        self.prepared: tuple | None = None

    def static(self, value: Any) -> np.ndarray | None:
        """``value`` as a concrete numpy array (None stays None); raises under tracing when
        the value is only known at run time."""
        if value is None or isinstance(value, np.ndarray):
            return value
        if isinstance(value, (int, float, bool, list, tuple)):
            return np.asarray(value)
        try:
            return np.asarray(self.ops.to_numpy(value))
        except Exception as error:
            where = f"{self.node.op} node {self.node.name!r}" if self.node else "a node"
            raise ConversionError(
                message(
                    f"{where} needs a value known when the graph is built, but it depends on a traced input",
                    received=f"{type(error).__name__}: {error}".splitlines()[0],
                    fix="make that input a constant or initializer, or run the model eagerly",
                )
            ) from error

    def known(self, value: Any) -> np.ndarray | None:
        """``value`` as numpy when it is known while the graph is built, else None: a value
        computed from a traced input, or a symbolic size (control flow then compiles)."""
        if _symbolic_array(value):
            return None
        try:
            return self.static(value)
        except ConversionError:
            return None

    def array(self, value: Any) -> Any:
        """``value`` as the backend's array (static numpy values are converted; a shape with
        symbolic sizes becomes the framework's int64 tensor of them)."""
        if isinstance(value, (np.ndarray, np.generic)):
            if _symbolic_array(value):
                ops = self.ops
                items = [ops.asarray(v, "int64") for v in value.reshape(-1)]
                return ops.reshape(ops.stack(items), value.shape) if items else ops.asarray(value.astype(np.int64))
            if value.dtype.kind in "OSU":
                raise UnsupportedOp(
                    message(
                        f"The {self.backend.name} backend has no string tensors",
                        fix="run string ops with the numpy backend",
                    )
                )
            return self.ops.asarray(value)
        return value

    def run(self, graph: Graph, values: dict[str, Any], inputs: list[Any]) -> list[Any]:
        """Run a subgraph with ``inputs`` bound to its inputs, seeing ``values`` by name."""
        return run_graph(graph, self, {**values, **dict(zip(graph.inputs, inputs))})


def is_static(value: Any) -> bool:
    return value is None or isinstance(value, (np.ndarray, np.generic))


def is_symbolic(value: Any) -> bool:
    """A size known only symbolically while a graph is traced with free dimensions (a torch
    ``SymInt``, a ``jax.export`` dimension): an integer to Python arithmetic, not a number."""
    return not isinstance(value, (int, float, bool, complex, np.number, np.bool_, str, bytes)) and value is not None


#: ops numpy computes on symbolic sizes through Python's operators alone (no size is asked
#: for as a number, which would make a tracer fix it) ...
_SHAPE_ARITHMETIC = frozenset({"Concat", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Max", "Min", "Identity"})
#: ... and ops that only move a shape's sizes around (the shape is their data, input 0)
_SHAPE_MOVES = frozenset({"Gather", "Unsqueeze", "Squeeze", "Slice", "Reshape", "Cast", "Flatten"})


def symbolic_array(sizes: Any) -> np.ndarray:
    """A 1-D object array of ``sizes`` (numbers and symbolic sizes), built one by one so that
    numpy never tries to convert a framework's scalar tensor."""
    sizes = list(sizes)
    found = np.empty(len(sizes), dtype=object)
    for i, size in enumerate(sizes):
        found[i] = size
    return found


def _symbolic_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) and value.dtype == object and any(is_symbolic(v) for v in value.reshape(-1))


def numpy_of(value: Any, ops) -> Any:
    """A graph value for a numpy caller: arrays to numpy, sequences item by item."""
    if isinstance(value, list):
        return [numpy_of(v, ops) for v in value]
    if isinstance(value, Optional):
        return None if value.value is None else numpy_of(value.value, ops)
    if value is None or isinstance(value, np.ndarray):
        return value
    return np.asarray(ops.to_numpy(value))


def weight_only(graph: Graph, weights: Collection[str]) -> list[int]:
    """Positions of the nodes of ``graph`` (not its subgraphs) that compute on ``weights`` and
    constants alone, directly or through other such nodes: their outputs are the same on every
    call until a weight changes. Random nodes, nodes with subgraphs and shape reads (whose
    outputs are known when the graph is built anyway) are left out.

    >>> import onnx
    >>> from onnx import helper
    >>> nodes = [helper.make_node("Transpose", ["w"], ["wt"]), helper.make_node("MatMul", ["x", "wt"], ["y"])]
    >>> proto = helper.make_graph(nodes, "g", [], [], [onnx.numpy_helper.from_array(np.ones((2, 2), "float32"), "w")])
    >>> weight_only(Graph(proto, {"": 17}), {"w"})
    [0]
    """
    return _weight_values(graph, weights)[0]


def _weight_values(graph: Graph, weights: Collection[str]) -> tuple[list[int], set[str], set[str]]:
    """``weight_only``'s positions, the names of the values computed from ``weights`` (those
    included) and the names of the constants."""
    derived = set(weights)
    fixed = set(graph.initializers) - derived  # constants: initializers and what folds from them alone
    found = []
    for index, node in enumerate(graph.nodes):
        names = [name for name in node.inputs if name]
        if not node.foldable or not all(name in derived or name in fixed for name in names):
            continue
        if not any(name in derived for name in names):
            fixed.update(node.outputs)  # a Constant node, or arithmetic over constants
        elif node.op not in _SHAPE_ONLY:
            found.append(index)
            derived.update(name for name in node.outputs if name)
    return found, derived, fixed


def prepared_nodes(graph: Graph, weights: Collection[str]) -> list[int]:
    """Positions of the nodes of ``graph`` (not its subgraphs) whose handler has a weight
    preparation (:func:`registry.prepares`) and whose inputs it reads are ``weights`` and constants
    alone (directly or through :func:`weight_only` nodes), at least one of them a weight.
    Preparations register when the handler modules load: call it after :meth:`Graph.bind`."""
    _, derived, fixed = _weight_values(graph, weights)
    found = []
    for index, node in enumerate(graph.nodes):
        entry = registry.PREPARATIONS.get(node.op) if node.domain_key == "" else None
        if entry is None:
            continue
        names = [node.inputs[i] for i in entry[0] if i < len(node.inputs) and node.inputs[i]]
        if any(name in derived for name in names) and all(name in derived or name in fixed for name in names):
            found.append(index)
    return found


def prepare_weights(graph: Graph, ctx: Context, values: dict[str, Any], positions: Iterable[int]) -> dict[int, tuple]:
    """Run the weight preparations of the nodes at ``positions`` (see :func:`prepared_nodes`)
    over ``values`` (the weights and what the weight-only nodes made) and ``graph``'s
    initializers; returns their results by node position, for the nodes that had any."""
    values = {**graph.initializers, **values}
    found = {}
    for index in positions:
        node = graph.nodes[index]
        inputs, fn = registry.PREPARATIONS[node.op]
        args = [ctx.array(values[node.inputs[i]]) if i < len(node.inputs) and node.inputs[i] else None for i in inputs]
        previous, ctx.node = ctx.node, node
        try:
            made = fn(ctx, node, *args)
        finally:
            ctx.node = previous
        if made is not None:
            found[index] = tuple(made)
    return found


def run_nodes(graph: Graph, ctx: Context, values: dict[str, Any], positions: Iterable[int]) -> dict[str, Any]:
    """Run the nodes of ``graph`` at ``positions`` (in order) over ``values`` and
    ``graph``'s initializers; returns every value by name, their outputs included."""
    values = {**graph.initializers, **values, "": None}
    for index in positions:
        node = graph.nodes[index]
        args = [values[name] if name in values else _missing_input(node, name) for name in node.inputs]
        fold = node.foldable and all(is_static(a) for a in args) and any(a is not None for a in args)
        outputs = _run_node(node, ctx, graph.opsets, args, values, fold)
        values.update(zip(node.outputs, outputs if isinstance(outputs, tuple) else (outputs,)))
    return values


def run_graph(
    graph: Graph,
    ctx: Context,
    values: dict[str, Any],
    plan: Plan | None = None,
    skip: Container[int] = (),
    prepared: Mapping[int, Sequence[str]] | None = None,
) -> list[Any]:
    """Run ``graph`` with ``values`` (inputs, initializers, outer values) and return its
    outputs; with a ``plan``, take (or record) the outputs fixed by the input signature. The
    nodes at the positions in ``skip`` do not run: ``values`` holds their outputs. The node at
    a position in ``prepared`` finds the values of the names there in ``ctx.prepared`` (what
    its weight preparation made, see :func:`registry.prepares`)."""
    values = {**graph.initializers, **values, "": None}
    folded = plan.folded if plan is not None and not plan.recording else {}
    for index, node in enumerate(graph.nodes):
        if index in skip:
            continue
        outputs = folded.get(index)
        if outputs is None:
            args = [values[name] if name in values else _missing_input(node, name) for name in node.inputs]
            fold = node.foldable and all(is_static(a) for a in args) and any(a is not None for a in args)
            made = prepared.get(index) if prepared else None
            outputs = _run_node(
                node, ctx, graph.opsets, args, values, fold, made=None if made is None else [values[n] for n in made]
            )
            if not isinstance(outputs, tuple):
                outputs = (outputs,)
            if plan is not None and plan.recording:  # an initializer not replaced by a param is fixed
                plan.note(
                    index,
                    node,
                    all(
                        name in plan.fixed
                        or (name in graph.initializers and name not in plan.weights and is_static(values[name]))
                        for name in node.inputs
                        if name
                    ),
                    outputs,
                )
        for name, value in zip(node.outputs, outputs):
            if name:
                values[name] = value
    if plan is not None and plan.recording:
        plan.done()
    return [values[name] for name in graph.outputs]


def _run_node(
    node: Node,
    ctx: Context,
    opsets: dict[str, int],
    args: list,
    values: dict,
    fold: bool,
    symbolic: bool = False,
    made: list | None = None,
) -> Any:
    found = node.handler
    if found is None:  # a graph nobody bound: resolve it now (unsupported() guards the rest)
        found, _ = registry.resolve(node.op, node.domain_key, opsets[node.domain_key])
        if found is None:
            raise UnsupportedOp(message(f"No handler for {node.op}", received=node.name))
    if fold and not symbolic and any(_symbolic_array(a) for a in args):
        fold = False  # a symbolic size used as a size (numpy would ask for its int): the framework's op
        if node.op in _SHAPE_ARITHMETIC or (node.op in _SHAPE_MOVES and _symbolic_array(args[0])):
            try:  # shape arithmetic over symbolic sizes: numpy computes it on the Python objects
                return _run_node(node, ctx, opsets, args, values, fold=True, symbolic=True)
            except Exception:  # noqa: BLE001 - what numpy cannot do on them, the framework does
                pass
    target = outer = _numpy_context(ctx) if fold else ctx
    previous, target.node = target.node, node
    before = target.given, target.prepared
    target.given, target.prepared = args, None if fold or made is None else tuple(made)
    try:
        if not fold:
            static = found.static
            # a loop's carried values stay as they are: a counter known when the graph is built
            # keeps the loop's condition known too (a Keras RNN's loop under jax.jit / tf.function)
            args = [
                ctx.static(a) if i in static else a if node.has_subgraph and is_static(a) else ctx.array(a)
                for i, a in enumerate(args)
            ]
        if node.has_subgraph:  # its own context, holding the outer scope its subgraphs read
            target = copy.copy(target)
            target.values = values
        out = found.fn(target, node, *args)
    except Exception as error:
        notes = getattr(error, "__notes__", None)
        if not any(note.startswith("while running") for note in notes or ()):  # the innermost node's
            # what Python 3.11's error.add_note does, also on 3.10 (where tracebacks do not print it)
            error.__notes__ = [*(notes or ()), f"while running the {node.op} node {node.name!r}"]  # type: ignore[attr-defined]  # 3.10 stubs lack it
        raise
    finally:
        outer.node = previous
        outer.given, outer.prepared = before
    if fold:  # keep folded results static (numpy), whatever the numpy backend returned
        out = tuple(_as_static(o) for o in out) if isinstance(out, tuple) else _as_static(out)
    return out


def _as_static(value: Any) -> Any:
    if isinstance(value, (list, Optional)) or value is None:
        return value
    return np.asarray(value)


_numpy_contexts: dict[int, Context] = {}


def _numpy_context(ctx: Context) -> Context:
    from xdevice import _registry

    reference = _registry.backend("numpy")  # folding computes on the reference backend
    if ctx.backend is reference:
        return ctx
    key = id(ctx)
    if key not in _numpy_contexts:
        _numpy_contexts.clear()
        _numpy_contexts[key] = Context(reference)
    return _numpy_contexts[key]


def _missing_input(node: Node, name: str):
    raise ConversionError(
        message(
            f"{node.op} node {node.name!r} reads {name!r}, which no earlier node produces",
            expected="nodes in topological order",
            fix="run onnx.checker and re-export the model",
        )
    )
