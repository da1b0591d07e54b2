"""ONNX handlers: control flow (If, Loop, Scan) and random numbers.

Subgraphs run through the interpreter with ``ctx.run``, seeing the enclosing scope by
name (``ctx.values``). A branch condition, trip count or loop condition known while the
graph is built (eagerly, or a constant, or a counter carried as a constant) is read as a
number: the branch taken is the only one traced, and the loop unrolls, so index arithmetic
inside the body folds and torch export sees plain ops. One known only at run time (computed
from a traced input, or a symbolic size) becomes the framework's own control flow through
the op set's ``cond`` and ``while_loop``: ``lax.cond``/``lax.while_loop``,
``tf.cond``/``tf.while_loop``, torch's ``cond``/``while_loop`` operators. A Loop's scan
outputs are then written into buffers of trip-count rows (a trip count is needed, and only
outputs something reads are built) and, unless the condition provably stays true, cut to
the iterations run, which TensorFlow and torch can do and JAX cannot (a ``ConversionError``
names the node). Scan lengths come from static shapes, so ``Scan`` unrolls under tracing.

Random ops draw from the op set's keyed generator: the ``seed`` attribute is the key,
and without one a key derived from the node's output name, so a model gives the same
numbers on every backend and every run (ONNX leaves unseeded values unspecified).
"""

from __future__ import annotations

import zlib

import numpy as np

from xdevice._errors import ConversionError, message
from xdevice.converters.importer.interpreter import Optional, is_static, is_symbolic, onnx_dtype, symbolic_array
from xdevice.converters.importer.registry import handler


def _flag(value) -> bool:
    return bool(np.asarray(value).reshape(-1)[0])


@handler("If", since=1)
def if_(ctx, node, condition):
    """The branch the condition picks; a condition known only at run time (computed from a
    traced input) becomes the framework's own branch, both branches traced."""
    then, otherwise = node.attr("then_branch"), node.attr("else_branch")
    known = ctx.known(condition)
    if known is not None:
        return tuple(ctx.run(then if _flag(known) else otherwise, ctx.values, []))
    names = _outer(ctx, then, otherwise)
    arrays = [
        lambda *operands, branch=branch: [ctx.array(v) for v in ctx.run(branch, _scope(ctx, names, operands), [])]
        for branch in (then, otherwise)
    ]
    return _compiled(
        ctx,
        node,
        lambda: ctx.ops.cond(ctx.array(condition), *arrays, tuple(ctx.values[n] for n in names)),
        "both branches give outputs of the same shapes and dtypes",
    )


def _outer(ctx, *graphs) -> list[str]:
    """The outer values the subgraphs read that are arrays of the framework (not constants):
    its control-flow op takes them as operands."""
    names = dict.fromkeys(n for g in graphs for n in g.outer_names)
    return [
        n
        for n in names
        if n in ctx.values and not is_static(ctx.values[n]) and not isinstance(ctx.values[n], (list, Optional))
    ]


def _scope(ctx, names: list[str], operands) -> dict:
    return {**ctx.values, **dict(zip(names, operands))}


def _compiled(ctx, node, build, needs: str):
    """``build()``, a framework control-flow op; its own errors (branches or loop states that
    differ in shape or dtype) become a ``ConversionError`` naming the node."""
    try:
        return tuple(build())
    except ConversionError:
        raise
    except Exception as error:
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r} depends on a value known only at run time, so it becomes "
                f"{ctx.backend.name}'s own control flow, which needs {needs}",
                received=f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}",
                fix="run the model eagerly, or make the condition a constant",
            )
        ) from error


def _empty_scan_output(ctx, node, graph, index: int):
    """A scan output of zero iterations: shape ``(0, *element_shape)`` from the body's
    declared output type."""
    tensor_type = graph.proto.output[index].type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if None in dims:
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r} ran zero iterations and its body does not "
                "declare the shape of scan output " + graph.outputs[index],
                fix="give the body's outputs static shapes",
            )
        )
    return ctx.ops.zeros((0, *dims), onnx_dtype(tensor_type.elem_type))


def _stack(ctx, values: list, axis: int = 0):
    return ctx.ops.stack([ctx.array(v) for v in values], axis=axis)


@handler("Loop", since=1)
def loop(ctx, node, trip_count=None, condition=None, *initial):
    """Run ``body`` while the condition holds and fewer than ``trip_count`` iterations ran;
    the body gets ``(iteration, condition, *carried)`` and returns ``(condition,
    *carried, *scan_outputs)``; scan outputs are stacked on a new first axis.

    With the trip count and every condition known while the graph is built, the loop
    unrolls (index arithmetic folds, and torch export sees plain ops), except where the op set
    compiles a counted loop faster (JAX while traced: a ``lax.while_loop``, unless the body
    needs its iteration as a number). Otherwise it becomes
    the framework's own while loop; scan outputs then need a trip count (a size is enough)
    and a condition that stays true, since their length is a shape."""
    body = node.attr("body")
    trips, going = ctx.known(trip_count), ctx.known(condition)
    if (trip_count is not None and trips is None) or (condition is not None and going is None):
        return _while(ctx, node, trip_count, condition, list(initial))
    if trips is not None and _compiles_counted_loop(ctx, node, initial) and _stays_true(ctx, node, condition):
        try:  # one compiled loop: XLA runs it faster than the same body unrolled trip-count times
            return _while(ctx, node, trip_count, condition, list(initial))
        except ConversionError:
            pass  # the body needs its iteration as a number (a static index): unrolled below
    trips = None if trips is None else int(trips.reshape(-1)[0])
    going = True if going is None else _flag(going)
    carried = list(initial)
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - len(carried))]
    iteration = 0
    while going and (trips is None or iteration < trips):
        outputs = ctx.run(body, ctx.values, [np.asarray(iteration, dtype=np.int64), np.asarray(going), *carried])
        known = ctx.known(outputs[0])
        if known is None:  # the condition turned out to be computed from a traced input
            return _while(ctx, node, trip_count, condition, list(initial))
        going = _flag(known)
        carried = outputs[1 : 1 + len(carried)]
        for collected, value in zip(scans, outputs[1 + len(carried) :]):
            collected.append(value)
        iteration += 1
    stacked = [
        _stack(ctx, values) if values else _empty_scan_output(ctx, node, body, 1 + len(carried) + k)
        for k, values in enumerate(scans)
    ]
    return tuple(carried + stacked)


def _compiles_counted_loop(ctx, node, initial) -> bool:
    """Whether a Loop of known trip count runs as the framework's own loop rather than
    unrolled, where the op set says that is faster for these values (``compiles_loop``: JAX
    while traced, where XLA compiles the body once and runs it faster than unrolled: the
    imported zoo lstm's row of ``benchmarks/convert.py``)."""
    return ctx.ops.compiles_loop([*initial, *(ctx.values.get(n) for n in node.attr("body").outer_names)])


def _while(ctx, node, trip_count, condition, initial: list):
    """``Loop`` as the framework's while loop, over the state ``(iteration, condition,
    *carried, *scan buffers)``; each scan output is written into a buffer of trip-count rows."""
    ops, body = ctx.ops, node.attr("body")
    start = [
        ops.asarray(0, "int64"),
        ops.asarray(True, "bool") if condition is None else ops.reshape(ops.cast(ctx.array(condition), "bool"), ()),
    ]
    carried = [ctx.array(v) for v in initial]
    scans = len(body.outputs) - 1 - len(carried)
    limit = ops.asarray(-1, "int64") if trip_count is None else ops.reshape(ctx.array(trip_count), ())
    names = _outer(ctx, body)
    buffers = []
    if any(node.read[len(carried) :]):  # scan outputs nothing reads are not kept
        rows, every = _scan_rows(ctx, node, trip_count, condition)
        probe = ctx.run(body, ctx.values, [*start, *carried])[1 + len(carried) :]
        try:
            buffers = [ops.zeros((rows, *ops.shape(ctx.array(v))), ops.dtype(ctx.array(v))) for v in probe]
        except Exception as error:
            raise ConversionError(
                message(
                    f"Loop node {node.name!r} stacks scan outputs over a trip count computed from data, which "
                    f"{ctx.backend.name} cannot use as a size while the graph is built",
                    received=f"{type(error).__name__}: {str(error).strip()[:160]}",
                    fix="run the model eagerly, or make the trip count a constant or an input's size",
                )
            ) from error

    def going(state, operands):  # the limit travels as the last operand: torch traces no closures
        if trip_count is None:
            return state[1]
        return ops.logical_and(state[1], ops.less(state[0], ops.cast(operands[-1], ops.dtype(state[0]))))

    def step(state, operands):
        iteration, carry, stacks = state[0], state[2 : 2 + len(carried)], state[2 + len(carried) :]
        outputs = ctx.run(body, _scope(ctx, names, operands), [iteration, state[1], *carry])
        new = [ops.cast(ctx.array(v), ops.dtype(old)) for v, old in zip(outputs[1 : 1 + len(carried)], carry)]
        written = _written(ctx, stacks, outputs[1 + len(carried) :], iteration)  # row `iteration` of each buffer
        return (ops.add(iteration, 1), ops.reshape(ops.cast(ctx.array(outputs[0]), "bool"), ()), *new, *written)

    final = _compiled(
        ctx,
        node,
        lambda: ops.while_loop(going, step, (*start, *carried, *buffers), (*(ctx.values[n] for n in names), limit)),
        "carried values that keep their shape and dtype",
    )
    if buffers and not every:  # the loop may have stopped early: its outputs have as many rows as it ran
        done = final[0]
        stacked = _compiled(
            ctx,
            node,
            lambda: [ops.take(b, ops.arange(done, dtype=ops.dtype(done)), axis=0) for b in final[2 + len(carried) :]],
            "scan outputs whose length, the number of iterations the loop ran, can be a "
            "shape (the condition cannot be shown to stay true until the trip count)",
        )
        return tuple(final[2 : 2 + len(carried)]) + stacked
    return tuple(final[2:]) + (None,) * (scans - len(buffers))


def _stays_true(ctx, node, condition) -> bool:
    """Whether the Loop's condition provably stays true: known true on entry, and the body's
    condition output is the condition input passed on, or a constant true."""
    if not (condition is None or ctx.known(condition) is not None and _flag(ctx.known(condition))):
        return False
    body = node.attr("body")
    out, into = body.outputs[0], body.inputs[1]
    producers = {o: n for n in body.nodes for o in n.outputs}
    while out in producers and producers[out].op == "Identity":
        out = producers[out].inputs[0]
    constant = body.initializers.get(out)
    if out in producers and producers[out].op == "Constant":
        constant = producers[out].attr("value")
    return out == into or (constant is not None and _flag(constant))


def _scan_rows(ctx, node, trip_count, condition):
    """The scan buffers' length, the trip count, and whether the loop provably runs that many
    times (its condition stays true); if not, the outputs keep the rows the loop wrote."""
    stays = _stays_true(ctx, node, condition)
    if trip_count is None:
        raise ConversionError(
            message(
                f"Loop node {node.name!r} stacks scan outputs over a number of iterations known only at run time",
                expected="a trip count, the most rows the outputs can have",
                fix="run the model eagerly, or carry the values instead of scanning them",
            )
        )
    known = ctx.known(trip_count)
    if known is not None:
        return int(known.reshape(-1)[0]), stays
    if isinstance(trip_count, np.ndarray):  # a symbolic size
        return trip_count.reshape(-1)[0], stays
    return ctx.ops.reshape(trip_count, ()), stays  # a size computed while the graph runs (TensorFlow's)


def _scan(ctx, node, states: list, inputs: list, input_axes, input_reversed, output_axes, output_reversed):
    """The scan loop over already unbatched inputs: ``(final states, scan outputs)``."""
    ops, body = ctx.ops, node.attr("body")
    sizes = [ops.shape(x)[axis] for x, axis in zip(inputs, input_axes)]
    if not all(isinstance(n, (int, np.integer)) for n in sizes):  # a symbolic or run-time length
        return _scan_loop(ctx, node, states, inputs, input_axes, input_reversed, output_axes, output_reversed, sizes[0])
    lengths = set(sizes)
    if len(lengths) != 1:
        raise ConversionError(
            message(
                f"Scan node {node.name!r} scans inputs of different lengths",
                expected="one length along every scan axis",
                received=sorted(lengths),
            )
        )
    length = lengths.pop()
    scans: list[list] = [[] for _ in range(len(body.outputs) - len(states))]
    for t in range(length):
        slices = [
            ops.take(x, length - 1 - t if rev else t, axis=axis)
            for x, axis, rev in zip(inputs, input_axes, input_reversed)
        ]
        outputs = ctx.run(body, ctx.values, [*states, *slices])
        states = outputs[: len(states)]
        for collected, value in zip(scans, outputs[len(states) :]):
            collected.append(value)
    stacked = []
    for k, (values, axis, rev) in enumerate(zip(scans, output_axes, output_reversed)):
        if not values:
            stacked.append(_empty_scan_output(ctx, node, body, len(states) + k))
            continue
        stacked.append(_stack(ctx, values[::-1] if rev else values, axis=axis))
    return list(states), stacked


def _scan_loop(ctx, node, states: list, inputs: list, input_axes, input_reversed, output_axes, output_reversed, length):
    """``Scan`` over a length known only at run time, as the framework's while loop: the
    state is ``(step, *states, *output buffers)``; the scanned inputs and the length are
    operands."""
    ops, body = ctx.ops, node.attr("body")
    names = _outer(ctx, body)
    states = [ctx.array(v) for v in states]
    count = len(states)

    def rows(step, operands):
        scanned, limit = operands[len(names) : -1], operands[-1]
        return [
            ops.take(x, ops.subtract(ops.subtract(limit, 1), step) if rev else step, axis=axis)
            for x, axis, rev in zip(scanned, input_axes, input_reversed)
        ]

    limit = ops.reshape(ctx.array(symbolic_array([length]) if is_symbolic(length) else length), ())
    operands = (*(ctx.values[n] for n in names), *inputs, ops.cast(limit, "int64"))
    start = ops.asarray(0, "int64")
    probe = ctx.run(body, ctx.values, [*states, *rows(start, operands)])[count:]
    buffers = [ops.zeros((length, *ops.shape(ctx.array(v))), ops.dtype(ctx.array(v))) for v in probe]

    def going(state, operands):
        return ops.less(state[0], ops.cast(operands[-1], ops.dtype(state[0])))

    def step(state, operands):
        at, carry, stacks = state[0], state[1 : 1 + count], state[1 + count :]
        outputs = ctx.run(body, _scope(ctx, names, operands[: len(names)]), [*carry, *rows(at, operands)])
        new = [ops.cast(ctx.array(v), ops.dtype(old)) for v, old in zip(outputs[:count], carry)]
        return (ops.add(at, 1), *new, *_written(ctx, stacks, outputs[count:], at))

    final = _compiled(
        ctx,
        node,
        lambda: ops.while_loop(going, step, (start, *states, *buffers), operands),
        "states that keep their shape and dtype",
    )
    stacked = []
    for value, axis, rev in zip(final[1 + count :], output_axes, output_reversed):
        value = ops.flip(value, (0,)) if rev else value
        if axis % len(ops.shape(value)):  # rows are stacked on axis 0; the output wants them on `axis`
            order = list(range(1, len(ops.shape(value))))
            order.insert(axis % len(ops.shape(value)), 0)
            value = ops.transpose(value, order)
        stacked.append(value)
    return list(final[1 : 1 + count]), stacked


def _written(ctx, buffers: list, values: list, at) -> list:
    """Each buffer with row ``at`` replaced by the matching value (a select over the rows, which
    every framework traces with ``at`` unknown)."""
    if not buffers:
        return []
    ops = ctx.ops
    here = ops.equal(ops.arange(ops.shape(buffers[0])[0], dtype=ops.dtype(at)), at)
    return [
        ops.where(
            ops.reshape(here, (-1,) + (1,) * (len(ops.shape(b)) - 1)),
            ops.expand_dims(ops.cast(ctx.array(v), ops.dtype(b)), 0),
            b,
        )
        for v, b in zip(values, buffers)
    ]


@handler("Scan", since=9)
def scan(ctx, node, *values):
    ops = ctx.ops
    count = node.attr("num_scan_inputs")
    states, inputs = list(values[: len(values) - count]), list(values[len(values) - count :])
    outputs = len(node.attr("body").outputs) - len(states)
    input_axes = [a % len(ops.shape(x)) for a, x in zip(node.attr("scan_input_axes", [0] * count), inputs)]
    states, stacked = _scan(
        ctx,
        node,
        states,
        inputs,
        input_axes,
        node.attr("scan_input_directions", [0] * count),
        node.attr("scan_output_axes", [0] * outputs),
        node.attr("scan_output_directions", [0] * outputs),
    )
    return tuple(states + stacked)


@handler("Scan", since=8, static=(0,))
def scan_8(ctx, node, sequence_lens, *values):
    """Version 8: every state and scan input has a batch axis 0 (scan inputs scan axis 1),
    and ``sequence_lens`` may end a batch entry's scan early; its outputs are padded
    with zeros to the longest."""
    ops = ctx.ops
    count = node.attr("num_scan_inputs")
    directions = node.attr("directions", [0] * count)
    states, inputs = list(values[: len(values) - count]), list(values[len(values) - count :])
    batch, steps = ops.shape(inputs[0])[0], ops.shape(inputs[0])[1]
    lengths = [steps] * batch if sequence_lens is None else [int(n) for n in np.asarray(sequence_lens).reshape(-1)]
    outputs = len(node.attr("body").outputs) - len(states)
    finals, scans = [], []
    for b in range(batch):
        rows = [ops.slice(ops.take(x, b, axis=0), [0], [lengths[b]], axes=[0]) for x in inputs]
        final, stacked = _scan(
            ctx,
            node,
            [ops.take(ctx.array(s), b, axis=0) for s in states],
            rows,
            [0] * count,
            directions,
            [0] * outputs,
            [0] * outputs,
        )
        pad = steps - lengths[b]
        finals.append(final)
        scans.append(
            [ops.pad(ctx.array(s), [(0, pad)] + [(0, 0)] * (len(ops.shape(s)) - 1)) if pad else s for s in stacked]
        )
    return tuple(
        [_stack(ctx, [f[i] for f in finals]) for i in range(len(states))]
        + [_stack(ctx, [s[k] for s in scans]) for k in range(outputs)]
    )


# -- random numbers ---------------------------------------------------------------------------


def _key(ctx, node):
    seed = node.attr("seed")
    if seed is None:  # unseeded: a fixed key per node, so runs and backends agree
        seed = zlib.crc32(node.outputs[0].encode())
    return ctx.ops.random_key(int(seed))


def _like_dtype(ctx, node, x) -> str:
    return onnx_dtype(node.attr("dtype")) if node.attr("dtype") is not None else ctx.ops.dtype(x)


def _normal(ctx, node, shape, dtype: str):
    ops = ctx.ops
    sample = ops.normal(_key(ctx, node), shape, "float32")
    return ops.cast(ops.add(ops.multiply(sample, node.attr("scale", 1.0)), node.attr("mean", 0.0)), dtype)


def _uniform(ctx, node, shape, dtype: str):
    ops = ctx.ops
    return ops.cast(ops.uniform(_key(ctx, node), shape, node.attr("low", 0.0), node.attr("high", 1.0)), dtype)


@handler("RandomNormal", since=1)
def random_normal(ctx, node):
    return _normal(ctx, node, tuple(node.attr("shape")), onnx_dtype(node.attr("dtype", 1)))


@handler("RandomUniform", since=1)
def random_uniform(ctx, node):
    return _uniform(ctx, node, tuple(node.attr("shape")), onnx_dtype(node.attr("dtype", 1)))


@handler("RandomNormalLike", since=1)
def random_normal_like(ctx, node, x):
    return _normal(ctx, node, ctx.ops.shape(x), _like_dtype(ctx, node, x))


@handler("RandomUniformLike", since=1)
def random_uniform_like(ctx, node, x):
    return _uniform(ctx, node, ctx.ops.shape(x), _like_dtype(ctx, node, x))


@handler("Bernoulli", since=15)
def bernoulli(ctx, node, probabilities):
    ops = ctx.ops
    draw = ops.uniform(_key(ctx, node), ops.shape(probabilities), dtype=ops.dtype(probabilities))
    return ops.cast(ops.less(draw, probabilities), _like_dtype(ctx, node, probabilities))


@handler("Multinomial", since=7)
def multinomial(ctx, node, logits):
    """``sample_size`` class indices per row of unnormalised log-probabilities, by the
    Gumbel-max trick: ``argmax(logits + Gumbel noise)`` is a draw from ``softmax(logits)``."""
    ops = ctx.ops
    batch, classes = ops.shape(logits)
    samples = node.attr("sample_size", 1)
    u = ops.maximum(ops.uniform(_key(ctx, node), (batch, samples, classes)), 1e-12)  # log(0) would be -inf
    gumbel = ops.negative(ops.log(ops.negative(ops.log(u))))
    scores = ops.add(ops.expand_dims(ops.cast(logits, "float32"), 1), gumbel)
    return ops.cast(ops.argmax(scores, axis=-1), onnx_dtype(node.attr("dtype", 6)))
