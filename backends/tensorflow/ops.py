"""The op set in TensorFlow: numpy's semantics on ``tf.Tensor``, traceable by ``tf.function``.

Everything here is graph-safe: shapes come from static ``x.shape`` and nothing calls
``.numpy()``. Python numbers take the other input's dtype (NEP 50), and mixed tensor dtypes
promote as numpy does, because TensorFlow itself refuses to mix dtypes. Convolution and
pooling take channels-first input at the API but run channels-last inside, the only layout
TensorFlow's CPU kernels have; when tracing, the transposes between layers are cancelled
(``_sunk``). Several composites of ``opset.Ops`` are overridden with fused TensorFlow kernels
(softmax, moments, MatMul+BiasAdd, sparse cross entropy, unrolled recurrences...), which the
op tests hold to the numpy reference like every primitive.
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record  # no public way to ask whether a tape records
from tensorflow.python.framework.ops import EagerTensor  # no public name for an immutable tensor

from xdevice._errors import UnsupportedOp, message
from xdevice.backends._dtypes import ml_dtype
from xdevice.backends._shapes import as_tuple, conv_padding, pool_counts, pool_padding, slice_index
from xdevice.backends.composite import float32_inside, masked_score
from xdevice.backends.opset import DTYPES, NARROW_DTYPES, Array, Ops, numpy_dtype

__all__ = ["TensorflowOps"]

_PAD_MODES = ["constant", "reflect", "edge"]

# The narrow formats TensorFlow can cast (it holds the fnuz float8s too, but has no kernel for
# them, not even Cast). Its Cast converts int4 only to and from other integers, and float8 only
# from floats: other casts bridge through int64 or float32, which give numpy's values exactly.
_INT4 = tuple(tf.as_dtype(name) for name in ("int4", "uint4"))
_FLOAT8 = tuple(tf.as_dtype(name) for name in ("float8_e4m3fn", "float8_e5m2"))
_NARROW = {d.name for d in _INT4 + _FLOAT8}
# The other narrow formats (int2, uint2, float4_e2m1fn, the fnuz float8s, float8_e8m0fnu, which
# TensorFlow lacks altogether) are held as torch holds its shell dtypes: a uint8 tensor with one
# value's code in the low bits of each byte (ml_dtypes' layout), marked with the format's name in
# the attribute ``_HELD``. ``cast`` decodes and encodes the codes; ``dtype`` and ``to_numpy`` read
# the mark, and the ops that only move values (reshape, take...) keep it. The mark is the
# tensor's own: a tf.function's argument is a new tensor without it.
_HOLDS = tuple(name for name in NARROW_DTYPES if name not in _NARROW)
_HELD = "_xdevice_dtype"
_CODE_BITS = {"int2": 2, "uint2": 2, "float4_e2m1fn": 4}  # the others use the whole byte

# ScatterElements reductions as segment reductions
_SEGMENT = {
    "add": tf.math.unsorted_segment_sum,
    "mul": tf.math.unsorted_segment_prod,
    "max": tf.math.unsorted_segment_max,
    "min": tf.math.unsorted_segment_min,
}


def _is_array(x: Any) -> bool:
    return isinstance(x, (tf.Tensor, tf.Variable))


def _tensor(x: Any) -> Array:
    """``x`` as a tensor; numpy data keeps its dtype (Python floats become float64, as numpy),
    a narrow format TensorFlow cannot compute in is held as marked codes (``_HELD``)."""
    if _is_array(x):
        return x
    x = np.asarray(x)
    if x.dtype.name in _HOLDS:
        return _held_as(tf.convert_to_tensor(x.view(np.uint8)), x.dtype.name)
    return tf.convert_to_tensor(x)


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (bool, int, float))


def _weak_dtype(scalar: bool | int | float, dtype: tf.DType) -> tf.DType:
    """The dtype a Python number takes next to an array of ``dtype`` (numpy's NEP 50)."""
    if isinstance(scalar, bool) or (isinstance(scalar, int) and dtype != tf.bool) or dtype.is_floating:
        return dtype
    return tf.float64 if isinstance(scalar, float) else tf.int64


def _operands(x: Any, y: Any) -> tuple[Array, Array]:
    """Both inputs of a two-input op as tensors of one dtype, promoted as numpy would."""
    if _is_scalar(x) and _is_scalar(y):
        dtype = np.result_type(x, y)
        return tf.constant(x, dtype), tf.constant(y, dtype)
    if _is_scalar(x) or _is_scalar(y):
        scalar, array = (x, _tensor(y)) if _is_scalar(x) else (y, _tensor(x))
        dtype = _weak_dtype(scalar, array.dtype)
        array, scalar = tf.cast(array, dtype), tf.constant(scalar, dtype)
        return (scalar, array) if _is_scalar(x) else (array, scalar)
    x, y = _tensor(x), _tensor(y)
    if x.dtype != y.dtype:
        dtype = tf.as_dtype(np.result_type(x.dtype.as_numpy_dtype, y.dtype.as_numpy_dtype))
        x, y = tf.cast(x, dtype), tf.cast(y, dtype)
    return x, y


def _tf_dtype(name: str) -> tf.DType:
    """TensorFlow's dtype for a dtype name, or UnsupportedOp for one it cannot hold or cast."""
    unusable = name in NARROW_DTYPES and name not in _NARROW
    try:
        dtype = None if unusable else tf.as_dtype(name)
    except TypeError:
        dtype = None
    if dtype is None:
        what = (
            "TensorFlow has no kernels for this dtype (cast holds it as codes, one per byte)"
            if unusable
            else "TensorFlow has no such dtype"
        )
        raise UnsupportedOp(
            message(
                what,
                received=name,
                choices=[*DTYPES, *sorted(_NARROW)],
                fix="cast on another backend (numpy has every ml_dtypes format)",
            )
        )
    return dtype


def _castable(x: Array, dtype: tf.DType) -> Array:
    """``x`` bridged through a wide type where TensorFlow has no direct Cast to ``dtype``."""
    if x.dtype in _INT4 and not dtype.is_integer:
        x = tf.cast(x, tf.int64)
    if dtype in _INT4 and not x.dtype.is_integer:
        x = tf.cast(x, tf.int64)  # floats truncate first, then wrap, as ml_dtypes does
    if dtype in _FLOAT8 and not x.dtype.is_floating:
        x = tf.cast(x, tf.float32)
    return x


def _held_as(codes: Array, name: str | None) -> Array:
    """uint8 ``codes`` marked as holding the narrow format ``name`` (unmarked for None)."""
    if name is not None:
        setattr(codes, _HELD, name)
    return codes


def _held(x: Any) -> str | None:
    """The narrow format whose codes ``x`` holds (``_HELD``), or None for an ordinary array."""
    return getattr(x, _HELD, None)


def _held_codes(x: Array) -> tuple[Array, str | None]:
    """``x``'s codes and format when it holds a narrow format TensorFlow has no kernels for:
    a marked uint8 tensor, or (eagerly) a tensor of TensorFlow's own int2, float4... dtype,
    whose bytes only numpy can read; ``(x, None)`` for any other tensor."""
    name = _held(x)
    if name is not None or x.dtype.name not in _HOLDS:
        return x, name
    if not tf.executing_eagerly():
        raise UnsupportedOp(
            message(
                f"TensorFlow has no kernels for {x.dtype.name}, not even to read its bytes in a traced graph",
                received=f"a {x.dtype.name} tensor in a tf.function",
                fix=f"pass the {x.dtype.name} values as numpy (ml_dtypes) arrays, or call the model eagerly",
            )
        )
    return _held_as(tf.convert_to_tensor(x.numpy().view(np.uint8)), x.dtype.name), x.dtype.name


@functools.cache
def _code_values(name: str) -> np.ndarray:
    """The value of each code of a held format, indexed by code: float32 for the floats,
    int8/uint8 for int2/uint2 (types TensorFlow computes in), as ml_dtypes reads them."""
    codes = np.arange(2 ** _CODE_BITS.get(name, 8), dtype=np.uint8).view(ml_dtype(name))
    return codes.astype(np.float32 if name.startswith("float") else np.int8 if name == "int2" else np.uint8)


def _decoded(codes: Array, name: str) -> Array:
    """The values of held ``codes`` (float32, int8 or uint8): a look-up of each code's value."""
    table = _code_values(name)
    return tf.gather(table, tf.cast(tf.bitwise.bitwise_and(codes, len(table) - 1), tf.int32))


def _encoded(x: Array, name: str) -> Array:
    """The codes (uint8) of ``x`` in held format ``name``, as ml_dtypes casts: integers keep
    their low bits (``x`` int64); floats (``x`` float32) round to nearest, ties to even, and
    saturate at the largest value (the Cast handler settles overflow as ONNX asks first)."""
    if name in ("int2", "uint2"):
        return tf.cast(tf.bitwise.bitwise_and(x, 2 ** _CODE_BITS[name] - 1), tf.uint8)
    bits = tf.bitcast(x, tf.int32)  # bits, not arithmetic: TensorFlow reads float32 subnormals as 0
    if name == "float8_e8m0fnu":  # a power of two: its exponent field, the mantissa rounded half up
        exponent = tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 23), 255)
        up = tf.cast(tf.bitwise.bitwise_and(bits, 0x7FFFFF) >= 0x400000, tf.int32)
        code = tf.where(exponent == 0, 0, tf.minimum(exponent + up, 255))  # below 2**-126: 2**-127
        return tf.cast(tf.where((bits <= 0) | (exponent == 255), 255, code), tf.uint8)  # <= 0, inf, NaN: NaN
    values = _code_values(name)
    grid = values[: len(values) // 2]  # the non-negative values, ascending with their codes
    middles = (grid[:-1] + grid[1:]) / 2  # exact: a few mantissa bits
    magnitude = tf.reshape(tf.minimum(tf.abs(x), grid[-1]), [-1])
    upper = tf.clip_by_value(tf.searchsorted(grid, magnitude), 1, len(grid) - 1)  # first value >= magnitude
    middle = tf.gather(middles, upper - 1)
    round_up = (magnitude > middle) | ((magnitude == middle) & (upper % 2 == 0))
    code = tf.reshape(tf.where(round_up, upper, upper - 1), tf.shape(x))
    negative = bits < 0
    if values[len(grid)] != 0:  # no -0 (the fnuz formats: that code is NaN): -0 is 0
        negative &= code > 0
    code = tf.where(negative, code + len(grid), code)
    nan = int(np.array(np.nan, np.float32).astype(ml_dtype(name)).view(np.uint8))
    return tf.cast(tf.where(tf.math.is_nan(x), nan, code), tf.uint8)


def _shift(fn, x: Array, y: Array) -> Array:
    """``fn(x, y)`` (a bit shift) with numpy's result for a shift out of range (negative, or as
    wide as the type): every bit shifted out, 0, or -1 for a right shift of a negative value;
    TensorFlow's kernels mask or wrap such a shift (C's undefined behaviour)."""
    out_of_range = (y < 0) | (y >= x.dtype.size * 8)
    shifted = fn(x, tf.where(out_of_range, tf.zeros_like(y), y))
    filled = tf.zeros_like(x)
    if fn is tf.bitwise.right_shift and not x.dtype.is_unsigned:  # the sign bit fills it
        filled = tf.where(x < 0, tf.constant(-1, x.dtype), filled)
    return tf.where(out_of_range, filled, shifted)


def _keeps_held(fn):
    """An op method that only moves ``x``'s values (reshape, take...): held codes stay marked."""

    @functools.wraps(fn)
    def op(self, x: Array, *args: Any, **kwargs: Any) -> Array:
        x = _tensor(x)
        return _held_as(fn(self, x, *args, **kwargs), _held(x))

    return op


def _constant(value: Any, dtype: tf.DType) -> Array:
    """A Python number in ``dtype`` as numpy converts it (floats to ints truncate)."""
    return tf.constant(np.asarray(value).astype(tf.as_dtype(dtype).as_numpy_dtype))


def _unary(fn):
    """An op method applying TensorFlow's ``fn`` to one input."""

    def op(self, x: Array) -> Array:
        x = _tensor(x)
        last = _viewed(x)  # elementwise: run it channels-last, where x came from
        return fn(x) if last is None else _channels_first(fn(last))

    return op


def _float_unary(fn):
    """Like ``_unary``, for an op defined on floats: integers and booleans are first cast to
    the float numpy computes them in (float16 for 8 bits, float32 for 16, else float64)."""

    def op(self, x: Array) -> Array:
        x = _tensor(x)
        if not x.dtype.is_floating:
            x = tf.cast(x, np.result_type(x.dtype.as_numpy_dtype, np.float16))
        return fn(x)

    return op


def _unbroadcast(g: Array, x: Array) -> Array:
    """The gradient ``g`` of a broadcast result, summed back to the shape of input ``x``."""
    axes, _ = tf.raw_ops.BroadcastGradientArgs(s0=tf.shape(x), s1=tf.shape(g))
    return tf.reshape(tf.reduce_sum(g, axes), tf.shape(x))


@tf.custom_gradient
def _fmod(x: Array, y: Array) -> Array:
    # TensorFlow registers no gradient for TruncateMod; numpy's tape: d/dx 1, d/dy -trunc(x/y)
    def grad(g):
        quotient = x / y
        quotient = tf.where(quotient < 0, tf.math.ceil(quotient), tf.math.floor(quotient))
        return _unbroadcast(g, x), _unbroadcast(-g * quotient, y)

    return tf.truncatemod(x, y), grad


def _argsort_last(key: Array, descending: bool) -> Array:
    """Stable argsort along the last axis: top_k puts the lower index first among equal keys;
    ascending sorts the reversed key (-k for floats, ~k for integers, which cannot overflow)."""
    if not descending:
        key = -key if key.dtype.is_floating else tf.bitwise.invert(key)
    return tf.math.top_k(key, tf.shape(key)[-1]).indices


def _binary(fn):
    """An op method applying TensorFlow's ``fn`` to promoted operands."""

    def op(self, x: Array, y: Array) -> Array:
        x, y = _operands(x, y)
        # both channels-first views of the same rank, or one with a scalar: run channels-last
        a, b = _viewed(x), _viewed(y)
        if a is not None and (b is not None and a.shape.rank == b.shape.rank or y.shape.rank == 0):
            return _channels_first(fn(a, y if b is None else b))
        if b is not None and x.shape.rank == 0:
            return _channels_first(fn(x, b))
        return fn(x, y)

    return op


def _axes(axis: int | Sequence[int] | None) -> int | list[int] | None:
    return axis if axis is None or isinstance(axis, int) else list(axis)


def _static(x: Array) -> list[Any]:
    """The shape for ``tf.reshape``: static sizes, -1 for a single unknown one, and the run-time
    size (a scalar tensor) for each of several unknown ones (a traced batch and sequence)."""
    dims = x.shape.as_list()
    if dims.count(None) <= 1:
        return [-1 if d is None else d for d in dims]
    return [tf.shape(x)[i] if d is None else d for i, d in enumerate(dims)]


# -- channels-last windows: conv and pooling ------------------------------------------------

# Elementwise ops (by TensorFlow op type) that commute with a transpose: see _sunk
_ELEMENTWISE = {
    "Relu": tf.nn.relu,
    "Relu6": tf.nn.relu6,
    "Elu": tf.nn.elu,
    "Selu": tf.nn.selu,
    "Sigmoid": tf.math.sigmoid,
    "Tanh": tf.math.tanh,
    "Softplus": tf.math.softplus,
    "Neg": tf.math.negative,
    "Identity": tf.identity,
    "AddV2": tf.math.add,
    "Sub": tf.math.subtract,
    "Mul": tf.math.multiply,
    "RealDiv": tf.math.truediv,
    "Maximum": tf.math.maximum,
    "Minimum": tf.math.minimum,
}


def _channels_last(x: Array) -> Array:
    viewed = _viewed(x)
    if viewed is not None:
        return viewed
    perm = (0, *range(2, x.shape.rank), 1)
    sunk = _sunk(x, perm)
    return tf.transpose(x, perm) if sunk is None else sunk


def _channels_first(y: Array) -> Array:
    """Channels-last ``y`` transposed to the API's channels-first layout. While tracing, the
    result remembers ``y`` (see ``_viewed``): when only our ops read it, the transpose is pruned."""
    rank = y.shape.rank
    perm = (0, rank - 1, *range(1, rank - 1))
    if tf.executing_eagerly() or not record.could_possibly_record():
        x = tf.transpose(y, perm)
    else:  # recorded by hand: its gradient is _transposed, not the gradient registered for Transpose
        with record.stop_recording():
            x = tf.transpose(y, perm)
        back = (0, *range(2, rank), 1)
        record.record_operation("ChannelsFirst", [x], [y], lambda g: [_transposed(g, back)])
    if not tf.executing_eagerly():
        if not hasattr(x.graph, "_xdevice_views"):
            x.graph._xdevice_views = {}
        x.graph._xdevice_views[x.ref()] = y
    return x


def _viewed(x: Array) -> Array | None:
    """The channels-last tensor that channels-first ``x`` is a transpose of, if ``_channels_first``
    made ``x`` in the graph being traced; else None.

    Conv, pooling, batch norm and elementwise ops read that tensor instead of ``x``, so a chain
    conv -> norm -> relu -> add -> conv runs channels-last with no transposes between. Under a
    tape the read is recorded as a transpose of ``x`` itself (``_as_transpose_of``): gradients
    still reach ``x`` and whatever it came from, and with respect to ``x`` too when asked for.
    """
    views = getattr(getattr(x, "graph", None), "_xdevice_views", None)
    if views is None or tf.executing_eagerly() or x.graph is not tf.compat.v1.get_default_graph():
        return None
    y = views.get(x.ref())
    if y is None or not record.could_possibly_record():
        return y
    return _as_transpose_of(y, x)


def _as_transpose_of(y: Array, x: Array) -> Array:
    """``y`` (which equals ``transpose(x, to channels-last)``) recorded on the tapes as that
    transpose of ``x``: its gradient goes back to ``x`` through the inverse transpose, and
    from ``x`` through ``x``'s own transpose to ``y``, the pair built as none (``_transposed``).
    Recorded on ``x`` alone, so no gradient is counted twice."""
    with record.stop_recording():
        out = tf.identity(y)
    rank = y.shape.rank

    def backward(g):
        return [_transposed(g, (0, rank - 1, *range(1, rank - 1)))]

    record.record_operation("ChannelsLastView", [out], [x], backward)
    return out


def _transposed(g: Array, perm: tuple[int, ...]) -> Array:
    """``transpose(g, perm)`` for a gradient flowing back through a layout change, built
    without the transpose where ``g`` is (a sum of) transposes by the inverse permutation.

    A channels-first tensor read by several of our ops gets its gradient as the tape's sum of
    the channels-first readers' gradients, each a transpose of a channels-last gradient; the
    channels-first -> channels-last transpose after that sum is one Grappler does not cancel
    (one pair, or more, per layer of a training step). The sum is taken channels-last instead."""
    undone = _undone(g, perm)
    return tf.transpose(g, perm) if undone is None else undone


def _undone(g: Array, perm: tuple[int, ...]) -> Array | None:
    """``transpose(g, perm)`` read off the graph where ``g`` is, or sums, transposes by the
    inverse of ``perm`` (the rest of a sum transposed once); None if no term is."""
    op = None if tf.executing_eagerly() else getattr(g, "op", None)
    if op is not None and op.type == "Transpose":
        p = tf.get_static_value(op.inputs[1])
        return op.inputs[0] if p is not None and [int(p[i]) for i in perm] == list(range(len(perm))) else None
    if op is None or op.type not in ("AddN", "AddV2") or any(a.shape.rank != len(perm) for a in op.inputs):
        return None
    terms = [(a, _undone(a, perm)) for a in op.inputs]
    if all(u is None for _, u in terms):
        return None
    rest = [a for a, u in terms if u is None]
    undone = [u for _, u in terms if u is not None]
    if rest:
        undone.append(tf.transpose(rest[0] if len(rest) == 1 else tf.add_n(rest), perm))
    return undone[0] if len(undone) == 1 else tf.add_n(undone)


def _transpose_source(b: Array) -> Array | None:
    """While tracing, the matrix that 2-D ``b`` is ``transpose(., (1, 0))`` of; else None."""
    op = None if tf.executing_eagerly() or b.shape.rank != 2 else getattr(b, "op", None)
    if op is None or op.type != "Transpose":
        return None
    perm = tf.get_static_value(op.inputs[1])
    return op.inputs[0] if perm is not None and list(perm) == [1, 0] else None


def _matmul_transposed(a: Array, b: Array, stored: Array) -> Array:
    """``a @ b`` for ``b = stored.T`` as one ``MatMul`` reading ``stored`` as it is
    (``transpose_b``), over ``a`` flattened to 2-D: a tied language-model head
    ``h @ embedding.T`` copies the whole embedding otherwise (1 GB for Llama 3.2 1B's) on
    every call, and its gradient back. Recorded on the tape against ``a`` and ``b`` itself,
    so a gradient with respect to ``b`` is still there when asked for; the pair of transposes
    its gradient then makes on the way to ``stored`` is adjacent, and Grappler cancels it."""
    a = tf.convert_to_tensor(a)  # a variable's read, which the tape records
    flat = tf.reshape(a, (-1, a.shape[-1] if a.shape[-1] is not None else tf.shape(a)[-1]))
    with record.stop_recording():
        y = tf.reshape(tf.linalg.matmul(flat, stored, transpose_b=True), _static(a)[:-1] + [b.shape[-1]])

    def backward(g):
        g = tf.reshape(g, (-1, b.shape[-1] if b.shape[-1] is not None else tf.shape(b)[-1]))
        grad_a = tf.reshape(tf.linalg.matmul(g, stored), tf.shape(a))
        return [grad_a, tf.transpose(tf.linalg.matmul(g, flat, transpose_a=True))]

    record.record_operation("MatMulTransposed", [y], [a, b], backward)
    return y


def _sunk(x: Array, perm: tuple[int, ...]) -> Array | None:
    """``transpose(x, perm)`` rebuilt, while tracing, from the channels-last tensor that our
    own conv or pool transposed to give ``x``, through the elementwise ops between; or None.

    Layers chain as conv -> bias/norm -> relu -> pool, each channels-first at the API; on CPU
    the transposes back and forth cost as much as the convolutions, so the chain is rebuilt
    channels-last and the channels-first copy, if nothing else reads it, is pruned. Not done
    eagerly (no graph to read), nor while a tape records, where the tape may watch an
    intermediate that the rebuilt chain would bypass. Results are memoised on the graph so
    that a residual chain is rebuilt once, not once per consumer.
    """
    graph = getattr(x, "graph", None)
    if tf.executing_eagerly() or graph is not tf.compat.v1.get_default_graph() or record.could_possibly_record():
        return None
    if not hasattr(graph, "_xdevice_channels_last"):
        graph._xdevice_channels_last = {}
    return _sink(x, perm, graph._xdevice_channels_last)


def _sink(x: Array, perm: tuple[int, ...], memo: dict) -> Array | None:
    key = (x.ref(), perm)
    if key not in memo:
        memo[key] = _rebuild(x, perm, memo)
    return memo[key]


def _rebuild(x: Array, perm: tuple[int, ...], memo: dict) -> Array | None:
    op, rank = x.op, len(perm)
    if op.type == "Transpose":  # transpose(transpose(z, p), perm) is z when p undoes perm
        p = tf.get_static_value(op.inputs[1])
        return op.inputs[0] if p is not None and list(p[list(perm)]) == list(range(rank)) else None
    if op.type not in _ELEMENTWISE or x.shape.rank != rank:
        return None
    inputs, sunk = [], False
    for a in op.inputs:
        b = _sink(a, perm, memo) if a.shape.rank == rank else None
        sunk |= b is not None
        if b is None and a.shape.rank:  # a broadcast operand (per-channel scale...): transpose it
            if not a.shape.is_fully_defined():
                return None
            b = tf.transpose(tf.reshape(a, [1] * (rank - a.shape.rank) + a.shape.as_list()), perm)
        inputs.append(a if b is None else b)
    return _ELEMENTWISE[op.type](*inputs) if sunk else None


# conv kernels laid out for TensorFlow, kept per immutable weight: id -> (the weight, its kernel)
_KERNELS: dict[tuple[int, tuple[int, ...]], tuple[weakref.ref, Array]] = {}


def _kernel(w: Array, perm: tuple[int, ...]) -> Array:
    """``transpose(w, perm)``: a conv weight (OIHW, the op set's layout) as TensorFlow's kernel
    (HWIO). An eager tensor never changes (a model's weights outside training are held so), so
    its kernel is made once and kept while it lives: a forward pass then relays no weights
    (ResNet-50: 53 transposes a call otherwise; ``benchmarks/zoo_real.py --models resnet50
    --frameworks tensorflow --measure forward`` times it against keras-hub's). Training's
    variables change every step and are transposed in the step. The kept kernel is returned
    with the transpose's gradient, so a tape or ``tf.gradients`` still reaches ``w``."""
    if not isinstance(w, EagerTensor):
        return tf.transpose(w, perm)
    key = (id(w), perm)
    held = _KERNELS.get(key)
    if held is None or held[0]() is not w:
        with tf.init_scope():
            kernel = tf.transpose(w, perm)
        forget = lambda _, key=key: _KERNELS.pop(key, None)
        held = _KERNELS[key] = (weakref.ref(w, forget), kernel)
    if tf.executing_eagerly() and not record.could_possibly_record():
        return held[1]  # eager, no tape: nothing to differentiate
    back = tuple(int(i) for i in np.argsort(perm))

    @tf.custom_gradient
    def relaid(w):
        return tf.identity(held[1]), lambda g: tf.transpose(g, back)

    return relaid(w)


def _windowed(x: Array, pads, window, stride, dilation, op, *, explicit=False, same=True, fill=0.0) -> Array:
    """Run ``op(x, strides, padding)`` on channels-last ``x`` with numpy's explicit ``pads``.

    TensorFlow's padding is "VALID", "SAME" (which pads after first) or, for 2-D conv only,
    an explicit list; anything else is padded here first. Its dilated path (space-to-batch)
    takes no stride, so a dilated strided op runs at stride 1 and keeps every stride-th output.
    """
    dims = len(window)
    step = (1,) * dims if any(d > 1 for d in dilation) else tuple(stride)
    spatial = x.shape[1:-1].as_list()
    padding: str | list[list[int]]
    if all(p == (0, 0) for p in pads):
        padding = "VALID"
    elif same and None not in spatial and list(pads) == conv_padding("same", spatial, window, step, dilation):
        padding = "SAME"
    elif explicit:
        padding = [[0, 0], *map(list, pads), [0, 0]]
    else:
        x = tf.pad(x, [[0, 0], *map(list, pads), [0, 0]], constant_values=_constant(fill, x.dtype))
        padding = "VALID"
    y = op(x, step, padding)
    if step != tuple(stride):
        y = y[(slice(None),) + tuple(slice(None, None, s) for s in stride)]
    return y


@tf.custom_gradient
def _cumprod_last(x):
    """cumprod over the last axis; TensorFlow's own gradient divides by x (NaN at zeros)."""
    out = tf.math.cumprod(x, axis=-1)

    def grad(g):
        # d out_j / d x_i = prod_{k <= j, k != i} x_k for j >= i: products with x_i set to 1
        n = x.shape[-1]
        eye = tf.eye(n, dtype=tf.bool)
        others = tf.where(eye, tf.ones((), x.dtype), x[..., None, :])  # (..., i, k)
        products = tf.math.cumprod(others, axis=-1)
        later = tf.cast(tf.linalg.band_part(tf.ones((n, n), x.dtype), 0, -1), x.dtype)  # j >= i
        return tf.reduce_sum(products * g[..., None, :] * later, axis=-1)

    return out, grad


def _cumprod(x, axis: int):
    rank = x.shape.rank
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]  # a swap is its own inverse
    return tf.transpose(_cumprod_last(tf.transpose(x, perm)), perm)


class TensorflowOps(Ops):
    name = "tensorflow"
    # TensorFlow's uint32 arithmetic is patchy; int64 multiplies wrap and the hash masks to 32 bits
    key_dtype = "int64"

    # -- arrays ---------------------------------------------------------------------------

    def asarray(self, x: Any, dtype: str | None = None) -> Array:
        if _is_array(x):
            return x if dtype is None or self.dtype(x) == dtype else self.cast(x, dtype)
        if dtype is not None and dtype not in _HOLDS:
            _tf_dtype(dtype)  # one TensorFlow has no such dtype for fails here
        return _tensor(np.asarray(x, dtype=numpy_dtype(dtype) if dtype else None))

    def to_numpy(self, x: Array) -> Any:
        if not _is_array(x):
            return np.array(x, copy=True)
        name = _held(x)  # held codes: ml_dtypes holds them one to a byte too, in the low bits
        return x.numpy() if name is None else x.numpy().view(ml_dtype(name))

    def shape(self, x: Array) -> tuple[int, ...]:
        if not _is_array(x):
            return np.shape(x)
        # a dimension unknown while tracing (a None batch) is only known at run time
        return tuple(tf.shape(x)[i] if d is None else int(d) for i, d in enumerate(x.shape))

    def dtype(self, x: Array) -> str:
        return (_held(x) or x.dtype.name) if _is_array(x) else np.asarray(x).dtype.name

    def cast(self, x: Array, dtype: str) -> Array:
        x, source = _held_codes(_tensor(x))
        if source == dtype:
            return x
        if source is not None:  # held codes: their values first, in a type TensorFlow computes in
            x = _decoded(x, source)
        if dtype in _HOLDS:
            if not tf.executing_eagerly():  # a traced function's output would lose the mark
                raise UnsupportedOp(
                    message(
                        f"TensorFlow holds {dtype} as marked codes only outside traced graphs",
                        received=f"a cast to {dtype} in a tf.function",
                        fix="call the model eagerly (ImportedModel falls back to it by itself)",
                    )
                )
            wide = "int64" if dtype in ("int2", "uint2") else "float32"
            return _held_as(_encoded(self.cast(x, wide), dtype), dtype)
        want = _tf_dtype(dtype)
        return tf.cast(_castable(x, want), want)  # float to int truncates toward zero, as numpy

    def bitcast(self, x: Array, dtype: str) -> Array:
        x, source = _held_codes(_tensor(x))
        if x.dtype == tf.bool:  # tf.bitcast refuses bool; its byte holds 0 or 1, as uint8's does
            x = tf.cast(x, tf.uint8)
        if source is not None and _CODE_BITS.get(source, 8) != 8 or _CODE_BITS.get(dtype, 8) != 8:
            raise UnsupportedOp(
                message(
                    "TensorFlow cannot reinterpret the bits of a type narrower than a byte",
                    received=f"a bitcast from {source or x.dtype.name} to {dtype}",
                    fix="run the model on the numpy or torch backend",
                )
            )
        want = tf.uint8 if dtype in _HOLDS else _tf_dtype(dtype)  # a byte-wide held format: the bytes
        # a new tensor even for the same type, so no mark moves from x or onto it
        return _held_as(tf.identity(x) if x.dtype == want else tf.bitcast(x, want), dtype if dtype in _HOLDS else None)

    def zeros(self, shape: Sequence[int], dtype: str = "float32") -> Array:
        return tf.zeros(tuple(shape), dtype)

    def ones(self, shape: Sequence[int], dtype: str = "float32") -> Array:
        return tf.ones(tuple(shape), dtype)

    def full(self, shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
        return tf.fill(tuple(shape), _constant(value, dtype))

    def arange(self, start: int, stop: int | None = None, step: int = 1, dtype: str = "int32") -> Array:
        return tf.range(start, stop, step, dtype=dtype)

    # -- elementwise ----------------------------------------------------------------------

    negative = _unary(tf.math.negative)
    abs = _unary(tf.math.abs)
    sign = _unary(tf.math.sign)
    exp = _unary(tf.math.exp)
    log = _unary(tf.math.log)
    sqrt = _unary(tf.math.sqrt)
    sin = _unary(tf.math.sin)
    cos = _unary(tf.math.cos)
    tan = _unary(tf.math.tan)
    tanh = _unary(tf.math.tanh)
    sigmoid = _unary(tf.math.sigmoid)
    erf = _unary(tf.math.erf)
    floor = _unary(tf.math.floor)
    ceil = _unary(tf.math.ceil)
    round = _unary(tf.math.round)  # half to even
    relu = _unary(tf.nn.relu)  # gradient 0 at 0
    logical_not = _unary(tf.math.logical_not)
    isnan = _unary(tf.math.is_nan)
    isinf = _unary(tf.math.is_inf)
    stop_gradient = _unary(tf.stop_gradient)
    asin = _float_unary(tf.math.asin)
    acos = _float_unary(tf.math.acos)
    atan = _float_unary(tf.math.atan)
    sinh = _float_unary(tf.math.sinh)
    cosh = _float_unary(tf.math.cosh)
    asinh = _float_unary(tf.math.asinh)
    acosh = _float_unary(tf.math.acosh)
    atanh = _float_unary(tf.math.atanh)

    def bitwise_not(self, x: Array) -> Array:
        x = _tensor(x)
        return tf.math.logical_not(x) if x.dtype == tf.bool else tf.bitwise.invert(x)

    def gelu(self, x: Array, approximate: bool = False) -> Array:
        return tf.nn.gelu(_tensor(x), approximate=approximate)

    add = _binary(tf.math.add)
    subtract = _binary(tf.math.subtract)
    multiply = _binary(tf.math.multiply)
    divide = _binary(tf.math.truediv)
    power = _binary(tf.math.pow)
    maximum = _binary(tf.math.maximum)
    minimum = _binary(tf.math.minimum)
    mod = _binary(tf.math.floormod)  # the sign of the divisor
    floor_divide = _binary(tf.math.floordiv)
    logical_and = _binary(tf.math.logical_and)
    logical_or = _binary(tf.math.logical_or)
    logical_xor = _binary(tf.math.logical_xor)
    bitwise_and = _binary(tf.bitwise.bitwise_and)
    bitwise_or = _binary(tf.bitwise.bitwise_or)
    bitwise_xor = _binary(tf.bitwise.bitwise_xor)
    left_shift = _binary(lambda x, y: _shift(tf.bitwise.left_shift, x, y))
    right_shift = _binary(lambda x, y: _shift(tf.bitwise.right_shift, x, y))  # logical on unsigned
    equal = _binary(tf.math.equal)
    not_equal = _binary(tf.math.not_equal)
    less = _binary(tf.math.less)
    less_equal = _binary(tf.math.less_equal)
    greater = _binary(tf.math.greater)
    greater_equal = _binary(tf.math.greater_equal)

    def fmod(self, x: Array, y: Array) -> Array:
        x, y = map(tf.convert_to_tensor, _operands(x, y))  # variables read: custom_gradient takes tensors
        dtype = x.dtype
        if dtype.is_unsigned:
            return tf.math.floormod(x, y)  # the same for non-negative operands; TruncateMod has no kernel
        # TruncateMod has kernels for 32- and 64-bit types only; the remainder of two halves is
        # exact in float32 and representable in their own type, so the round trip is exact
        wide = {tf.float16: tf.float32, tf.bfloat16: tf.float32, tf.int8: tf.int32, tf.int16: tf.int32}.get(dtype)
        if wide is not None:
            return tf.cast(self.fmod(tf.cast(x, wide), tf.cast(y, wide)), dtype)
        return _fmod(x, y) if dtype.is_floating else tf.truncatemod(x, y)

    def where(self, condition: Array, x: Array, y: Array) -> Array:
        condition = _tensor(condition)
        if condition.dtype != tf.bool:
            condition = tf.not_equal(condition, tf.zeros((), condition.dtype))
        return tf.where(condition, *_operands(x, y))

    def while_loop(self, condition, body, state: tuple, operands: tuple = ()) -> tuple:
        return tuple(
            tf.while_loop(
                lambda *s: tf.cast(tf.reshape(condition(s, operands), ()), tf.bool),
                lambda *s: tuple(body(s, operands)),
                tuple(state),
            )
        )

    def cond(self, predicate: Array, then, otherwise, operands: tuple = ()) -> tuple:
        return tuple(
            tf.cond(
                tf.cast(tf.reshape(predicate, ()), tf.bool),
                lambda: tuple(then(*operands)),
                lambda: tuple(otherwise(*operands)),
            )
        )

    # -- linear algebra -------------------------------------------------------------------

    @float32_inside  # TensorFlow has no half-precision determinant kernel
    def det(self, x: Array) -> Array:
        return tf.linalg.det(_tensor(x))

    def matmul(self, a: Array, b: Array) -> Array:
        a, b = _operands(a, b)
        # numpy: a vector gains a unit axis, which the result then loses
        if b.shape.rank == 1:
            return self.matmul(a, b[:, None])[..., 0]
        if a.shape.rank == 1:
            return self.matmul(a[None], b)[..., 0, :]
        stored = _transpose_source(b)
        if stored is not None and a.shape.rank >= 2:
            return _matmul_transposed(a, b, stored)
        if a.shape.rank > 2 and b.shape.rank == 2:
            # one 2-D matmul over the flattened batch: a broadcast batched matmul would reduce
            # a per-batch weight gradient
            y = tf.linalg.matmul(tf.reshape(a, (-1, a.shape[-1])), b)
            return tf.reshape(y, _static(a)[:-1] + [b.shape[-1]])
        return tf.linalg.matmul(a, b)

    def einsum(self, equation: str, *operands: Array) -> Array:
        return tf.einsum(equation, *map(_tensor, operands))

    # -- reductions -----------------------------------------------------------------------

    def sum(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        x = _tensor(x)
        x = tf.cast(x, tf.int64) if x.dtype == tf.bool else x  # numpy counts booleans
        return tf.reduce_sum(x, _axes(axis), keepdims)

    def mean(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        x = _tensor(x)
        x = x if x.dtype.is_floating else tf.cast(x, tf.float64)  # numpy's mean of integers is float64
        return tf.reduce_mean(x, _axes(axis), keepdims)

    def max(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return tf.reduce_max(_tensor(x), _axes(axis), keepdims)  # ties share the gradient

    def min(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return tf.reduce_min(_tensor(x), _axes(axis), keepdims)

    def prod(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return tf.reduce_prod(_tensor(x), _axes(axis), keepdims)

    def argmax(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        y = tf.math.argmax(_tensor(x), axis, output_type=tf.int64)
        return tf.expand_dims(y, axis) if keepdims else y

    def argmin(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        y = tf.math.argmin(_tensor(x), axis, output_type=tf.int64)
        return tf.expand_dims(y, axis) if keepdims else y

    def cumsum(self, x: Array, axis: int) -> Array:
        return tf.math.cumsum(_tensor(x), axis)

    def cumprod(self, x: Array, axis: int) -> Array:
        x = _tensor(x)
        if not x.dtype.is_floating:  # numpy multiplies integers and booleans in 64 bits
            x = tf.cast(x, tf.uint64 if x.dtype.is_unsigned else tf.int64)
        if not x.dtype.is_floating:
            return tf.math.cumprod(x, axis)
        return _cumprod(x, axis % x.shape.rank)

    def sort(self, x: Array, axis: int = -1, descending: bool = False) -> tuple[Array, Array]:
        x = _tensor(x)
        rank = x.shape.rank
        perm = list(range(rank))  # top_k sorts the last axis: swap axis there (its own inverse)
        perm[axis], perm[-1] = perm[-1], perm[axis]
        moved = tf.transpose(x, perm)
        key = tf.cast(moved, tf.int8) if moved.dtype == tf.bool else moved
        if key.dtype.is_floating:
            # top_k has no place for NaN: order the numbers (NaN as inf), then a second stable
            # pass on the NaN flag moves NaN last ascending, first descending
            nan = tf.math.is_nan(key)
            order = _argsort_last(tf.where(nan, tf.constant(np.inf, key.dtype), key), descending)
            flags = tf.cast(tf.gather(nan, order, batch_dims=rank - 1), tf.int8)
            order = tf.gather(order, _argsort_last(flags, descending), batch_dims=rank - 1)
        else:
            order = _argsort_last(key, descending)
        values = tf.gather(moved, order, batch_dims=rank - 1)
        return tf.transpose(values, perm), tf.cast(tf.transpose(order, perm), tf.int64)

    # -- shape ----------------------------------------------------------------------------

    @_keeps_held
    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        return tf.reshape(_tensor(x), tuple(shape))

    @_keeps_held
    def transpose(self, x: Array, axes: Sequence[int] | None = None) -> Array:
        return tf.transpose(_tensor(x), None if axes is None else tuple(axes))

    @_keeps_held
    def expand_dims(self, x: Array, axis: int) -> Array:
        return tf.expand_dims(_tensor(x), axis)

    @_keeps_held
    def squeeze(self, x: Array, axis: int | Sequence[int] | None = None) -> Array:
        return tf.squeeze(_tensor(x), _axes(axis))

    @_keeps_held
    def broadcast_to(self, x: Array, shape: Sequence[int]) -> Array:
        return tf.broadcast_to(_tensor(x), tuple(shape))

    def concat(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return tf.concat([_tensor(x) for x in xs], axis)

    def stack(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return tf.stack([_tensor(x) for x in xs], axis)

    def split(self, x: Array, sections: int | Sequence[int], axis: int = 0) -> list[Array]:
        return tf.split(_tensor(x), sections if isinstance(sections, int) else list(sections), axis=axis)

    def slice(
        self,
        x: Array,
        starts: Sequence[int],
        stops: Sequence[int],
        axes: Sequence[int] | None = None,
        steps: Sequence[int] | None = None,
    ) -> Array:
        x = _tensor(x)
        # clamp to [-n-1, n], which keeps Python's meaning and fits any index dtype (ONNX uses INT64_MAX)
        shape = x.shape.as_list()
        axes = range(len(starts)) if axes is None else axes
        starts, stops = ([_clamp(v, shape[a]) for a, v in zip(axes, values)] for values in (starts, stops))
        return x[slice_index(x.shape.rank, starts, stops, axes, steps)]

    @_keeps_held
    def take(self, x: Array, indices: Array | int, axis: int = 0) -> Array:
        x = _tensor(x)
        axis %= x.shape.rank
        if isinstance(indices, (int, np.integer)):  # a strided slice: its gradient stays dense
            return x[(slice(None),) * axis + (int(indices),)]
        indices = _tensor(indices)
        size = x.shape[axis] if x.shape[axis] is not None else tf.shape(x)[axis]  # known only at run time
        return tf.gather(x, self._wrapped(indices, size), axis=axis)

    def take_along_axis(self, x: Array, indices: Array, axis: int) -> Array:
        x, indices = _tensor(x), _tensor(indices)
        rank = x.shape.rank
        axis %= rank
        # gather over the last axis with every other axis batched (and broadcast)
        perm = (*range(axis), *range(axis + 1, rank), axis)
        x, indices = tf.transpose(x, perm), tf.transpose(indices, perm)
        if x.shape.is_fully_defined() and indices.shape.is_fully_defined():
            batch = tf.broadcast_static_shape(x.shape[:-1], indices.shape[:-1]).as_list()
            x = tf.broadcast_to(x, batch + x.shape[-1:].as_list())
            indices = tf.broadcast_to(self._wrapped(indices, x.shape[-1]), batch + indices.shape[-1:].as_list())
        else:  # sizes known only at run time (a traced batch or sequence)
            batch = tf.broadcast_dynamic_shape(tf.shape(x)[:-1], tf.shape(indices)[:-1])
            size = tf.shape(x)[-1]
            x = tf.broadcast_to(x, tf.concat([batch, tf.shape(x)[-1:]], 0))
            indices = tf.broadcast_to(self._wrapped(indices, size), tf.concat([batch, tf.shape(indices)[-1:]], 0))
        y = tf.gather(x, indices, batch_dims=rank - 1)
        return tf.transpose(y, np.argsort(perm))

    @staticmethod
    def _wrapped(indices: Array, size: int) -> Array:
        """Negative indices counted from the end, as numpy does (``tf.gather`` does not)."""
        if indices.dtype.is_unsigned:
            return indices
        return tf.where(indices < 0, indices + tf.cast(size, indices.dtype), indices)

    def scatter(self, x: Array, indices: Array, updates: Array, axis: int = 0, reduction: str = "none") -> Array:
        if reduction != "none" and reduction not in _SEGMENT:
            raise UnsupportedOp(message("Unknown scatter reduction", received=reduction, choices=["none", *_SEGMENT]))
        x, index = _tensor(x), tf.cast(_tensor(indices), tf.int64)
        rank, size = x.shape.rank, tf.shape(x, out_type=tf.int64)
        axis %= rank
        index = self._wrapped(index, size[axis])
        # the flat position in x of each update: its own coordinates, the index along axis
        counts = tf.shape(index, out_type=tf.int64)
        coords = [tf.reshape(tf.range(counts[d]), [-1 if e == d else 1 for e in range(rank)]) for d in range(rank)]
        coords[axis] = index
        target = coords[0]
        for d in range(1, rank):
            target = target * size[d] + coords[d]
        updates = tf.cast(tf.broadcast_to(_tensor(updates), tf.shape(index)), x.dtype)
        if reduction == "none":  # TensorScatterUpdate leaves the order of duplicates open
            return self.scatter_last_wins(x, index, updates, axis)
        # x's own elements lead every segment: none is empty, and (on CPU, whose segment kernels
        # run in order) the updates combine as numpy's ufunc.at does, onto x in index order
        count = tf.size(x, out_type=tf.int64)
        ids = tf.concat([tf.range(count), tf.reshape(target, [-1])], 0)
        data = tf.concat([tf.reshape(x, [-1]), tf.reshape(updates, [-1])], 0)
        out = _SEGMENT[reduction](data, ids, count)
        if reduction in ("max", "min") and x.dtype.is_floating:
            # segment max/min keep or drop NaN by position; np.maximum.at propagates any
            nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(data), tf.int32), ids, count) > 0
            out = tf.where(nan, tf.constant(np.nan, x.dtype), out)
        return tf.reshape(out, size)

    def pad(self, x: Array, pad_width: Sequence[tuple[int, int]], mode: str = "constant", value: float = 0) -> Array:
        x = _tensor(x)
        pad_width = [(int(before), int(after)) for before, after in pad_width]
        if mode == "constant":
            return tf.pad(x, pad_width, constant_values=_constant(value, x.dtype))
        if mode not in _PAD_MODES:
            raise UnsupportedOp(message("Unknown pad mode", received=mode, choices=_PAD_MODES))
        # numpy's reflect and edge as a gather of source positions: TensorFlow's SYMMETRIC is
        # neither, and its REFLECT refuses pads as wide as the axis, which numpy reflects again
        for axis, (before, after) in enumerate(pad_width):
            if before or after:
                size = x.shape[axis]
                source = np.arange(-before, size + after)
                period = 2 * (size - 1)
                if mode == "edge" or period == 0:
                    source = np.clip(source, 0, size - 1)
                else:
                    source = source % period
                    source = np.where(source >= size, period - source, source)
                x = tf.gather(x, source, axis=axis)
        return x

    @_keeps_held
    def flip(self, x: Array, axis: int | Sequence[int]) -> Array:
        return tf.reverse(_tensor(x), [axis] if isinstance(axis, int) else list(axis))

    @_keeps_held
    def tile(self, x: Array, reps: Sequence[int]) -> Array:
        x, reps = _tensor(x), tuple(reps)
        extra = len(reps) - x.shape.rank  # numpy prepends unit axes to whichever is shorter
        x = x[(None,) * extra + (...,)] if extra > 0 else x
        return tf.tile(x, (1,) * -extra + reps)

    # -- neural network -------------------------------------------------------------------

    def conv(
        self,
        x: Array,
        w: Array,
        b: Array | None = None,
        stride: int | Sequence[int] = 1,
        padding: Any = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
    ) -> Array:
        x, w = _operands(x, w)
        dims = w.shape.rank - 2
        stride, dilation, kernel = as_tuple(stride, dims), as_tuple(dilation, dims), tuple(w.shape[2:])
        pads = conv_padding(padding, self.shape(x)[2:], kernel, stride, dilation)
        x = _channels_last(x)
        w = _kernel(w, (*range(2, dims + 2), 1, 0))  # OI* -> *IO
        channels, layout = x.shape[-1], ("NWC", "NHWC", "NDHWC")[dims - 1]
        # undilated 2-D conv takes explicit pads; dilated convs go through tf.nn.convolution's
        # space-to-batch, as CPU kernels without oneDNN have no dilated gradients
        direct = dims == 2 and max(dilation) == 1
        conv = tf.nn.conv2d if direct else tf.nn.convolution

        def dense(x, w):
            # data_format spelled out: eager Conv3D gradients fail on a None attribute
            return _windowed(
                x,
                pads,
                kernel,
                stride,
                dilation,
                explicit=direct,
                op=lambda x, s, p: conv(x, w, s, p, data_format=layout, dilations=dilation),
            )

        if groups == 1:
            y = dense(x, w)
        elif dims == 2 and groups == channels and stride[0] == stride[1]:
            # depthwise (CPU kernels want equal strides; explicit pads crash Grappler's shape
            # inference): (kh, kw, 1, C*m) -> (kh, kw, C, m), output channel c*m + j as in OIHW
            w = tf.reshape(w, (*kernel, channels, -1))
            y = _windowed(
                x,
                pads,
                kernel,
                stride,
                dilation,
                op=lambda x, s, p: tf.nn.depthwise_conv2d(x, w, (1, *s, 1), p, dilations=dilation),
            )
        else:
            # CPU kernels lack grouped-conv gradients without oneDNN: one conv per group
            y = tf.concat([dense(xg, wg) for xg, wg in zip(tf.split(x, groups, -1), tf.split(w, groups, -1))], -1)
        if b is not None:
            y = tf.nn.bias_add(y, tf.cast(_tensor(b), y.dtype))
        return _channels_first(y)

    def max_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
    ) -> Array:
        x = _tensor(x)
        dims = x.shape.rank - 2
        window, dilation = as_tuple(window, dims), as_tuple(dilation, dims)
        stride = as_tuple(stride or window, dims)
        pads = pool_padding(padding, self.shape(x)[2:], window, stride, dilation, ceil_mode)
        # TensorFlow's dilated SAME pools pad with zeros (space-to-batch): pad with -inf here then
        y = _windowed(
            _channels_last(x),
            pads,
            window,
            stride,
            dilation,
            lambda x, s, p: tf.nn.pool(x, window, "MAX", s, p, dilations=dilation),
            same=max(dilation) == 1,
            fill=-np.inf,
        )
        return _channels_first(y)

    def avg_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        count_include_pad: bool = False,
        ceil_mode: bool = False,
    ) -> Array:
        x = _tensor(x)
        dims = x.shape.rank - 2
        window = as_tuple(window, dims)
        stride, ones = as_tuple(stride or window, dims), (1,) * dims
        spatial = self.shape(x)[2:]
        pads = pool_padding(padding, spatial, window, stride, ones, ceil_mode)
        # TensorFlow's SAME average already leaves padding out of the count; otherwise pad with
        # zeros, average over the whole window, and rescale to numpy's per-window counts
        same = not count_include_pad
        y = _windowed(
            _channels_last(x), pads, window, stride, ones, lambda x, s, p: tf.nn.pool(x, window, "AVG", s, p), same=same
        )
        if not (same and pads == conv_padding("same", spatial, window, stride, ones)):
            counts = pool_counts(spatial, pads, window, stride, count_include_pad, padding)
            if (counts != math.prod(window)).any():
                with np.errstate(divide="ignore"):  # a window all in padding: 0 * inf is NaN, as numpy's 0/0
                    scale = math.prod(window) / counts
                y = y * tf.constant(scale[None, ..., None], y.dtype)
        return _channels_first(y)

    # -- composites with fused TensorFlow kernels ------------------------------------------

    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        x, w = _operands(x, w)
        b = None if b is None else _tensor(b)
        if b is None or b.shape.rank != 1 or b.dtype != x.dtype or x.shape.rank < 2 or w.shape.rank != 2:
            return super().linear(x, w, b)
        # a 2-D MatMul straight into BiasAdd, which Grappler fuses (with a following Relu)
        depth = w.shape[0] if w.shape[0] is not None else tf.shape(x)[-1]  # x's may be unknown while traced
        y = tf.nn.bias_add(tf.linalg.matmul(tf.reshape(x, (-1, depth)), w), b)
        return y if x.shape.rank == 2 else tf.reshape(y, _static(x)[:-1] + [w.shape[-1]])

    square = _unary(tf.math.square)
    rsqrt = _unary(tf.math.rsqrt)
    softplus = _unary(tf.nn.softplus)

    @float32_inside
    def logsumexp(self, x: Array, axis: int = -1, keepdims: bool = False) -> Array:
        return tf.reduce_logsumexp(_tensor(x), axis, keepdims)

    @float32_inside
    def softmax(self, x: Array, axis: int = -1) -> Array:
        return tf.nn.softmax(_tensor(x), axis)

    @float32_inside
    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        return tf.nn.log_softmax(_tensor(x), axis)

    @float32_inside
    def layer_norm(
        self, x: Array, scale: Array | None, offset: Array | None, axis: int = -1, eps: float = 1e-5
    ) -> Array:
        x = _tensor(x)
        mean, var = tf.nn.moments(x, list(range(axis % x.shape.rank, x.shape.rank)), keepdims=True)
        y = (x - mean) * tf.math.rsqrt(var + eps)
        y = y if scale is None else y * scale
        return y if offset is None else y + offset

    def batch_norm(self, x: Array, scale: Array, offset: Array, mean: Array, var: Array, eps: float = 1e-5) -> Array:
        x = _tensor(x)
        last = _viewed(x)
        if last is None or not all(_is_array(p) and p.dtype == x.dtype for p in (scale, offset, mean, var)):
            return super().batch_norm(x, scale, offset, mean, var, eps)
        # channels-last: the per-channel factors broadcast over the last axis as they are
        factor = scale * tf.math.rsqrt(var + _constant(eps, x.dtype))
        return _channels_first(last * factor + (offset - mean * factor))

    @float32_inside
    def batch_norm_train(self, x: Array, scale: Array, offset: Array, eps: float = 1e-5) -> tuple[Array, Array, Array]:
        x = _tensor(x)
        last = _viewed(x)
        if last is None:
            mean, var = tf.nn.moments(x, [0, *range(2, x.shape.rank)])  # one pass for both
        else:  # reduce the channels-last tensor over all axes but its last, as Keras does
            mean, var = tf.nn.moments(last, list(range(x.shape.rank - 1)))
        return self.batch_norm(x, scale, offset, mean, var, eps), mean, var

    def checkpoint(self, fn: Any, *args: Array) -> Any:
        if not record.could_possibly_record():  # no tape: nothing is kept to recompute
            return fn(*args)
        # recompute_grad differentiates its arguments (and variables fn reads): a variable is
        # read once out here, so its gradient reaches the outer tape through that read
        args = tuple(tf.convert_to_tensor(a) if isinstance(a, tf.Variable) else _tensor(a) for a in args)
        return tf.recompute_grad(fn)(*args)

    def attention(self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None) -> Array:
        # The composite in TensorFlow's own ops: TensorFlow has no fused attention kernel.
        # Keras 3's ops.dot_product_attention on its TensorFlow backend is this same
        # matmul-softmax-matmul (it refuses flash_attention=True), in the (B, T, N, H) layout
        # with two more transposes and a mask widened to the logits' shape; and reaching it
        # without switching the global Keras backend takes keras.src's private module.
        q, k, v = map(_tensor, (q, k, v))
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        scores = tf.linalg.matmul(q, k, transpose_b=True) * tf.constant(scale, q.dtype)
        if mask is not None:  # a finite fill: a fully masked row attends uniformly
            scores = self.where(mask, scores, masked_score(self.dtype(scores)))
        return tf.linalg.matmul(tf.nn.softmax(scores), v)

    # Recurrences unroll over the static time axis. Measured under tf.function on the zoo
    # LSTM (32 steps, CPU): the forward is on par with a tf.while_loop or tf.scan, and the
    # training step ~20% faster (no per-step loop frames or TensorArray gradients). A time
    # axis unknown while tracing (a symbolic sequence) runs as tf.scan.

    def lstm(self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array) -> tuple[Array, Array, Array]:
        h, c, w_hh = map(_tensor, (h, c, w_hh))

        def step(inputs, state):
            h, c = state
            i, f, g, o = tf.split(inputs + tf.linalg.matmul(h, w_hh), 4, axis=-1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            return tf.sigmoid(o) * tf.tanh(c), c

        outputs, (h, c) = _recurrence(self.linear(x, w_ih, b), (h, c), step)  # one matmul for every step's input
        return outputs, h, c

    def gru(self, x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array) -> tuple[Array, Array]:
        h, w_hh, b_hh = map(_tensor, (h, w_hh, b_hh))

        def step(inputs, state):
            (h,) = state
            xr, xz, xn = tf.split(inputs, 3, axis=-1)
            hr, hz, hn = tf.split(tf.linalg.matmul(h, w_hh) + b_hh, 3, axis=-1)
            r, z = tf.sigmoid(xr + hr), tf.sigmoid(xz + hz)
            n = tf.tanh(xn + r * hn)
            return ((1.0 - z) * n + z * h,)

        outputs, (h,) = _recurrence(self.linear(x, w_ih, b_ih), (h,), step)
        return outputs, h

    def cross_entropy(self, logits: Array, labels: Array) -> Array:
        labels = tf.cast(_tensor(labels), tf.int32)
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, _tensor(logits)))


def _recurrence(projected: Any, state: tuple, step: Any) -> tuple[Any, tuple]:
    """``state = step(projected[:, t], state)`` over the time axis: the stacked first state
    (the hidden output, ``(N, T, H)``) and the last state."""
    if projected.shape[1] is not None:
        outputs = []
        for inputs in tf.unstack(projected, axis=1):
            state = step(inputs, state)
            outputs.append(state[0])
        return tf.stack(outputs, axis=1), state
    states = tf.scan(
        lambda carried, inputs: tuple(step(inputs, carried)),
        tf.transpose(projected, (1, 0, 2)),
        initializer=tuple(state),
    )
    return tf.transpose(states[0], (1, 0, 2)), tuple(s[-1] for s in states)


def _clamp(bound: Any, size: int | None) -> Any:
    """A slice bound clamped to [-size-1, size]; a bound that is a tensor (a traced length) or
    a dimension unknown while tracing is left to the strided slice, which clamps itself (a
    Python bound is kept within int32, which TensorFlow makes of it)."""
    if not isinstance(bound, (int, np.integer)):
        return bound
    if size is None:
        return max(-(2**31), min(int(bound), 2**31 - 1))
    return max(-size - 1, min(int(bound), size))
