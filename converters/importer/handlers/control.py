"""ONNX handlers: control flow (If, Loop, Scan) and random numbers.

Subgraphs run through the interpreter with ``ctx.run``, seeing the enclosing scope by
name (``ctx.values``). Branch conditions, trip counts and loop conditions are read with
``ctx.static``: they work eagerly and whenever they are constants, and under
``jax.jit``/``tf.function`` a condition computed from a traced input raises a
``ConversionError`` naming the node. A loop's iteration number is static, so index
arithmetic inside the body folds. Scan lengths come from static shapes, so ``Scan``
unrolls under tracing.

Random ops draw from the op set's keyed generator: the ``seed`` attribute is the key,
and without one a key derived from the node's output name, so a model gives the same
numbers on every backend and every run (ONNX leaves unseeded values unspecified).
"""

from __future__ import annotations

import zlib

import numpy as np

from xdevice._errors import ConversionError, message
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler


def _flag(value) -> bool:
    return bool(np.asarray(value).reshape(-1)[0])


@handler("If", since=1, static=(0,))
def if_(ctx, node, condition):
    branch = node.attr("then_branch") if _flag(condition) else node.attr("else_branch")
    return tuple(ctx.run(branch, ctx.values, []))


def _empty_scan_output(ctx, node, graph, index: int):
    """A scan output of zero iterations: shape ``(0, *element_shape)`` from the body's
    declared output type."""
    tensor_type = graph.proto.output[index].type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if None in dims:
        raise ConversionError(message(f"{node.op} node {node.name!r} ran zero iterations and its body does not "
                                      "declare the shape of scan output " + graph.outputs[index],
                                      fix="give the body's outputs static shapes"))
    return ctx.ops.zeros((0, *dims), onnx_dtype(tensor_type.elem_type))


def _stack(ctx, values: list, axis: int = 0):
    return ctx.ops.stack([ctx.array(v) for v in values], axis=axis)


@handler("Loop", since=1, static=(0, 1))
def loop(ctx, node, trip_count=None, condition=None, *initial):
    """Run ``body`` while the condition holds and fewer than ``trip_count`` iterations ran;
    the body gets ``(iteration, condition, *carried)`` and returns ``(condition,
    *carried, *scan_outputs)``; scan outputs are stacked on a new first axis."""
    body = node.attr("body")
    trips = None if trip_count is None else int(np.asarray(trip_count).reshape(-1)[0])
    going = True if condition is None else _flag(condition)
    carried = list(initial)
    scans: list[list] = [[] for _ in range(len(body.outputs) - 1 - len(carried))]
    iteration = 0
    while going and (trips is None or iteration < trips):
        outputs = ctx.run(body, ctx.values, [np.asarray(iteration, dtype=np.int64), np.asarray(going), *carried])
        going = _flag(ctx.static(outputs[0]))
        carried = outputs[1:1 + len(carried)]
        for collected, value in zip(scans, outputs[1 + len(carried):]):
            collected.append(value)
        iteration += 1
    stacked = [_stack(ctx, values) if values else _empty_scan_output(ctx, node, body, 1 + len(carried) + k)
               for k, values in enumerate(scans)]
    return tuple(carried + stacked)


def _scan(ctx, node, states: list, inputs: list, input_axes, input_reversed, output_axes, output_reversed):
    """The scan loop over already unbatched inputs: ``(final states, scan outputs)``."""
    ops, body = ctx.ops, node.attr("body")
    lengths = {ops.shape(x)[axis] for x, axis in zip(inputs, input_axes)}
    if len(lengths) != 1:
        raise ConversionError(message(f"Scan node {node.name!r} scans inputs of different lengths",
                                      expected="one length along every scan axis", received=sorted(lengths)))
    length = lengths.pop()
    scans: list[list] = [[] for _ in range(len(body.outputs) - len(states))]
    for t in range(length):
        slices = [ops.take(x, length - 1 - t if rev else t, axis=axis)
                  for x, axis, rev in zip(inputs, input_axes, input_reversed)]
        outputs = ctx.run(body, ctx.values, [*states, *slices])
        states = outputs[:len(states)]
        for collected, value in zip(scans, outputs[len(states):]):
            collected.append(value)
    stacked = []
    for k, (values, axis, rev) in enumerate(zip(scans, output_axes, output_reversed)):
        if not values:
            stacked.append(_empty_scan_output(ctx, node, body, len(states) + k))
            continue
        stacked.append(_stack(ctx, values[::-1] if rev else values, axis=axis))
    return list(states), stacked


@handler("Scan", since=9)
def scan(ctx, node, *values):
    ops = ctx.ops
    count = node.attr("num_scan_inputs")
    states, inputs = list(values[:len(values) - count]), list(values[len(values) - count:])
    outputs = len(node.attr("body").outputs) - len(states)
    input_axes = [a % len(ops.shape(x)) for a, x in zip(node.attr("scan_input_axes", [0] * count), inputs)]
    states, stacked = _scan(ctx, node, states, inputs, input_axes, node.attr("scan_input_directions", [0] * count),
                            node.attr("scan_output_axes", [0] * outputs),
                            node.attr("scan_output_directions", [0] * outputs))
    return tuple(states + stacked)


@handler("Scan", since=8, static=(0,))
def scan_8(ctx, node, sequence_lens, *values):
    """Version 8: every state and scan input has a batch axis 0 (scan inputs scan axis 1),
    and ``sequence_lens`` may end a batch entry's scan early; its outputs are padded
    with zeros to the longest."""
    ops = ctx.ops
    count = node.attr("num_scan_inputs")
    directions = node.attr("directions", [0] * count)
    states, inputs = list(values[:len(values) - count]), list(values[len(values) - count:])
    batch, steps = ops.shape(inputs[0])[0], ops.shape(inputs[0])[1]
    lengths = [steps] * batch if sequence_lens is None else [int(n) for n in np.asarray(sequence_lens).reshape(-1)]
    outputs = len(node.attr("body").outputs) - len(states)
    finals, scans = [], []
    for b in range(batch):
        rows = [ops.slice(ops.take(x, b, axis=0), [0], [lengths[b]], axes=[0]) for x in inputs]
        final, stacked = _scan(ctx, node, [ops.take(ctx.array(s), b, axis=0) for s in states], rows, [0] * count,
                               directions, [0] * outputs, [0] * outputs)
        pad = steps - lengths[b]
        finals.append(final)
        scans.append([ops.pad(ctx.array(s), [(0, pad)] + [(0, 0)] * (len(ops.shape(s)) - 1)) if pad else s
                      for s in stacked])
    return tuple([_stack(ctx, [f[i] for f in finals]) for i in range(len(states))]
                 + [_stack(ctx, [s[k] for s in scans]) for k in range(outputs)])


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
