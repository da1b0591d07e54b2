"""The op set in JAX: ``jax.numpy`` and ``lax`` primitives, traceable under ``jax.jit``.

Everything here reads only static facts (shapes, dtypes, Python arguments), never a traced
value, so each op works under ``jax.jit`` and ``jax.grad``. Padding, pooling counts and
slice bounds are computed in Python with the numpy reference's own helpers, so the two
backends cannot drift apart. Without x64, JAX has no 64-bit types: int64 and float64 name
int32 and float32, and ``dtype`` reports what an array really holds. Composites with a
native JAX form are overridden: the softmax family, ``rsqrt``, ``softplus``, attention
(``jax.nn.dot_product_attention``), and the recurrent layers as one ``lax.scan`` over time.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xdevice._errors import UnsupportedOp, message
from xdevice.backends._shapes import as_tuple, conv_padding, pool_counts, pool_padding, slice_index
from xdevice.backends.composite import float32_inside
from xdevice.backends.opset import DTYPES, NARROW_DTYPES, Array, Ops

__all__ = ["JaxOps", "jax_dtype"]

_PAD_MODES = ("constant", "reflect", "edge")
_DTYPE_NAMES = DTYPES + NARROW_DTYPES
_SCATTER = {"add": "add", "mul": "multiply", "max": "max", "min": "min"}  # reduction: .at[] method


def jax_dtype(name: str) -> np.dtype:
    """The dtype JAX gives ``name``: 64-bit names map to 32-bit ones while x64 is off
    (asking JAX for float64 then would warn, and warnings are errors in the tests).
    ``jnp.dtype`` knows the ml_dtypes names (bfloat16, float8, int4) numpy alone may not."""
    try:
        dtype = jnp.dtype(name)
    except TypeError:
        dtype = None
    if dtype is None or dtype.name not in _DTYPE_NAMES:  # e.g. ONNX "string", complex
        raise UnsupportedOp(
            message(
                "The jax backend cannot hold this dtype",
                received=name,
                choices=_DTYPE_NAMES,
                fix="cast to one of the listed dtypes first",
            )
        )
    return jax.dtypes.canonicalize_dtype(dtype)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float))  # bool included, as an int


def _like(number: int | float, other: Any) -> Any:
    """A Python number in ``other``'s dtype where numpy's NEP 50 keeps that dtype.

    JAX would parse a bare int as int32 and overflow on uint32 words like 0x846CA68B, so
    the conversion happens here. A float against integers, or an int against bools,
    promotes in numpy; JAX's weak typing does the same when the number stays as is."""
    dtype = jnp.result_type(other)
    if isinstance(number, float) and not jnp.issubdtype(dtype, jnp.inexact):
        return number
    if dtype == np.bool_ and not isinstance(number, bool):
        return number
    return np.asarray(number, dtype)


def _nep50(x: Any, y: Any) -> tuple[Any, Any]:
    if _is_number(x) and not _is_number(y):
        return _like(x, y), y
    if _is_number(y) and not _is_number(x):
        return x, _like(y, x)
    return x, y


def _unary(fn: Callable) -> Callable:
    def op(self, x: Array) -> Array:
        return fn(x)

    return op


def _binary(fn: Callable) -> Callable:
    def op(self, x: Array, y: Array) -> Array:
        return fn(*_nep50(x, y))

    return op


def _axes(axis: int | Sequence[int] | None) -> int | tuple[int, ...] | None:
    return axis if axis is None or isinstance(axis, int) else tuple(axis)


def _lowest(dtype: np.dtype) -> np.ndarray:
    """The identity of max: -inf, or the least integer. A concrete value, so ``lax`` picks
    its differentiable max-pool primitive."""
    low = -np.inf if jnp.issubdtype(dtype, jnp.inexact) else jnp.iinfo(dtype).min
    return np.asarray(low, dtype)


class JaxOps(Ops):
    name = "jax"
    key_dtype = "uint32"

    # -- arrays ---------------------------------------------------------------------------

    def asarray(self, x: Any, dtype: str | None = None) -> Array:
        want = jax_dtype(dtype) if dtype else None
        if isinstance(x, jax.Array) and (want is None or x.dtype == want):
            return x
        return jnp.asarray(x, dtype=want)

    def to_numpy(self, x: Array) -> Any:
        return np.array(x, copy=True)

    def shape(self, x: Array) -> tuple[int, ...]:
        # A symbolic dimension (jax.export, jax2onnx) stays symbolic: int() of it raises.
        # np.shape reads .shape; jax2onnx replaces jnp.shape with a traced Shape op.
        return tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in np.shape(x))

    def dtype(self, x: Array) -> str:
        return np.dtype(jnp.result_type(x)).name

    def cast(self, x: Array, dtype: str) -> Array:
        return jnp.asarray(x).astype(jax_dtype(dtype))

    def bitcast(self, x: Array, dtype: str) -> Array:
        x = jnp.asarray(x)
        if x.dtype == jnp.bool_:  # lax refuses bool; its one byte holds 0 or 1, as uint8 would
            x = x.astype(jnp.uint8)
        return lax.bitcast_convert_type(x, jax_dtype(dtype))

    def zeros(self, shape: Sequence[int], dtype: str = "float32") -> Array:
        return jnp.zeros(tuple(shape), jax_dtype(dtype))

    def ones(self, shape: Sequence[int], dtype: str = "float32") -> Array:
        return jnp.ones(tuple(shape), jax_dtype(dtype))

    def full(self, shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
        return jnp.full(tuple(shape), value, jax_dtype(dtype))

    def arange(self, start: int, stop: int | None = None, step: int = 1, dtype: str = "int32") -> Array:
        if stop is None:  # arange(n): jax2onnx's arange refuses a positional None
            start, stop = 0, start
        return jnp.arange(start, stop, step, dtype=jax_dtype(dtype))

    # -- elementwise ----------------------------------------------------------------------

    negative = _unary(jnp.negative)
    abs = _unary(jnp.abs)
    sign = _unary(jnp.sign)
    exp = _unary(jnp.exp)
    log = _unary(jnp.log)
    sqrt = _unary(jnp.sqrt)
    sin = _unary(jnp.sin)
    cos = _unary(jnp.cos)
    tan = _unary(jnp.tan)
    tanh = _unary(jnp.tanh)
    sigmoid = _unary(jax.nn.sigmoid)
    erf = _unary(lax.erf)
    floor = _unary(jnp.floor)
    ceil = _unary(jnp.ceil)
    round = _unary(jnp.round)  # half to even, as numpy
    relu = _unary(jax.nn.relu)  # its own JVP gives 0 at 0
    logical_not = _unary(jnp.logical_not)
    isnan = _unary(jnp.isnan)
    isinf = _unary(jnp.isinf)
    asin = _unary(jnp.arcsin)
    acos = _unary(jnp.arccos)
    atan = _unary(jnp.arctan)
    sinh = _unary(jnp.sinh)
    cosh = _unary(jnp.cosh)
    asinh = _unary(jnp.arcsinh)
    acosh = _unary(jnp.arccosh)
    atanh = _unary(jnp.arctanh)
    bitwise_not = _unary(jnp.invert)  # logical not on bools, as numpy's invert
    stop_gradient = _unary(lax.stop_gradient)
    # fused natives for composites of the op set
    rsqrt = _unary(lax.rsqrt)
    softplus = _unary(jax.nn.softplus)

    def gelu(self, x: Array, approximate: bool = False) -> Array:
        return jax.nn.gelu(x, approximate=approximate)

    add = _binary(jnp.add)
    subtract = _binary(jnp.subtract)
    multiply = _binary(jnp.multiply)
    divide = _binary(jnp.true_divide)
    power = _binary(jnp.power)
    maximum = _binary(jnp.maximum)
    minimum = _binary(jnp.minimum)
    mod = _binary(jnp.mod)  # sign of the divisor, as numpy
    fmod = _binary(jnp.fmod)  # sign of the dividend (lax.rem)
    floor_divide = _binary(jnp.floor_divide)
    logical_and = _binary(jnp.logical_and)
    logical_or = _binary(jnp.logical_or)
    logical_xor = _binary(jnp.logical_xor)
    bitwise_and = _binary(jnp.bitwise_and)
    bitwise_or = _binary(jnp.bitwise_or)
    bitwise_xor = _binary(jnp.bitwise_xor)
    left_shift = _binary(jnp.left_shift)
    right_shift = _binary(jnp.right_shift)  # logical on unsigned types
    equal = _binary(jnp.equal)
    not_equal = _binary(jnp.not_equal)
    less = _binary(jnp.less)
    less_equal = _binary(jnp.less_equal)
    greater = _binary(jnp.greater)
    greater_equal = _binary(jnp.greater_equal)

    def write_slots(self, x: Array, update: Array, start: Any, axis: int) -> Array:
        start = jnp.asarray(start, jnp.int32)
        return lax.dynamic_update_slice_in_dim(x, jnp.asarray(update, x.dtype), start, axis % jnp.ndim(x))

    def where(self, condition: Array, x: Array, y: Array) -> Array:
        return jnp.where(condition, *_nep50(x, y))

    def while_loop(
        self,
        condition: Callable[[tuple, tuple], Array],
        body: Callable[[tuple, tuple], tuple],
        state: tuple,
        operands: tuple = (),
    ) -> tuple:
        return tuple(
            lax.while_loop(
                lambda s: jnp.reshape(condition(s, operands), ()).astype(bool),
                lambda s: tuple(body(s, operands)),
                tuple(state),
            )
        )

    def compiles_loop(self, values: list) -> bool:
        """Whether a loop of known trip count over ``values`` should run as one
        ``lax.while_loop`` rather than unrolled: while traced (one of them a tracer), where XLA
        compiles the body once and runs it faster than unrolled (the imported zoo lstm's row of
        ``benchmarks/convert.py``)."""
        return any(isinstance(v, jax.core.Tracer) for v in values)

    def cond(
        self, predicate: Array, then: Callable[..., tuple], otherwise: Callable[..., tuple], operands: tuple = ()
    ) -> tuple:
        return tuple(
            lax.cond(
                jnp.reshape(predicate, ()).astype(bool),
                lambda *o: tuple(then(*o)),
                lambda *o: tuple(otherwise(*o)),
                *operands,
            )
        )

    # -- linear algebra -------------------------------------------------------------------

    def matmul(self, a: Array, b: Array) -> Array:
        return jnp.matmul(a, b)

    def einsum(self, equation: str, *operands: Array) -> Array:
        return jnp.einsum(equation, *operands)

    def det(self, x: Array) -> Array:
        return jnp.linalg.det(x)

    # -- reductions -----------------------------------------------------------------------

    def sum(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return jnp.sum(x, axis=_axes(axis), keepdims=keepdims)

    def mean(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return jnp.mean(x, axis=_axes(axis), keepdims=keepdims)

    def max(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return jnp.max(x, axis=_axes(axis), keepdims=keepdims)  # ties share the gradient evenly

    def min(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return jnp.min(x, axis=_axes(axis), keepdims=keepdims)

    def prod(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return jnp.prod(x, axis=_axes(axis), keepdims=keepdims)

    def argmax(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return jnp.argmax(x, axis=axis, keepdims=keepdims)

    def argmin(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return jnp.argmin(x, axis=axis, keepdims=keepdims)

    def cumsum(self, x: Array, axis: int) -> Array:
        return jnp.cumsum(x, axis=axis)

    def cumprod(self, x: Array, axis: int) -> Array:
        return jnp.cumprod(x, axis=axis)  # its gradient holds at zeros too, unlike out / x

    def sort(self, x: Array, axis: int = -1, descending: bool = False) -> tuple[Array, Array]:
        x = jnp.asarray(x)
        axis = axis % x.ndim
        if descending:
            # the reference's order: a stable ascending sort of the reversed axis, read
            # backwards, puts NaN first and the lower index first among equal values
            values, order = self.sort(jnp.flip(x, axis), axis)
            return jnp.flip(values, axis), x.shape[axis] - 1 - jnp.flip(order, axis)
        # lax.sort orders -0.0 == 0.0 and every NaN last, as numpy; the iota rides along
        index = lax.broadcasted_iota(jax_dtype("int64"), x.shape, axis)
        return tuple(lax.sort((x, index), dimension=axis, num_keys=1, is_stable=True))

    @float32_inside
    def logsumexp(self, x: Array, axis: int = -1, keepdims: bool = False) -> Array:
        return jax.nn.logsumexp(x, axis=axis, keepdims=keepdims)

    @float32_inside
    def softmax(self, x: Array, axis: int = -1) -> Array:
        return jax.nn.softmax(x, axis=axis)

    @float32_inside
    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        return jax.nn.log_softmax(x, axis=axis)

    def checkpoint(self, fn: Callable[..., Any], *args: Array) -> Any:
        return jax.checkpoint(fn)(*args)

    def attention(self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None) -> Array:
        # jax.nn.dot_product_attention, JAX's one entry to its fused kernels, in its (B, T, N, H)
        # layout: the op's (B, N, T, H) heads swapped in and out (XLA folds the transposes into
        # the dots under jit); a (B, T, H) input gets a head axis. It runs the logits in
        # float32; for float16 it asks dot_general for F16_F16_F32, which XLA:CPU refuses under
        # jit, so float16 stays with the composite, as do shapes it does not take (other ranks,
        # a broadcast batch or heads, v's own depth, a mask that widens the output).
        q, k, v = jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)
        if (
            q.ndim not in (3, 4)
            or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]
            or k.shape != v.shape
            or q.shape[-1] != k.shape[-1]
            or not q.dtype == k.dtype == v.dtype
            or q.dtype not in (jnp.float32, jnp.bfloat16)
        ):
            return super().attention(q, k, v, mask, scale)
        if mask is not None:
            mask = jnp.asarray(mask, bool)
            scores = (*q.shape[:-1], k.shape[-2])
            if mask.ndim > len(scores) or any(  # sizes may be symbolic (an export's batch)
                not (isinstance(m, int) and m == 1) and m is not s and m != s
                for m, s in zip(reversed(mask.shape), reversed(scores))
            ):
                return super().attention(q, k, v, mask, scale)
            # A fully masked row attends uniformly with no gradient to q or k, as the reference:
            # a zero query with every key allowed is exactly that. XLA's kernel would give it
            # anyway, but jax2onnx lowers the call to a softmax renormalised over the allowed
            # keys, which gives such a row zeros.
            attends = jnp.any(mask, axis=-1, keepdims=True)
            q, mask = jnp.where(attends, q, jnp.zeros((), q.dtype)), mask | ~attends
            if q.ndim == 3 and mask.ndim >= 2:  # broadcastable to (B, T, S): heads go in before T
                mask = jnp.expand_dims(mask, -3)
        heads = (lambda x: jnp.swapaxes(x, -3, -2)) if q.ndim == 4 else (lambda x: jnp.expand_dims(x, -2))
        out = jax.nn.dot_product_attention(heads(q), heads(k), heads(v), mask=mask, scale=scale)
        return jnp.swapaxes(out, -3, -2) if q.ndim == 4 else jnp.squeeze(out, -2)

    # -- shape ----------------------------------------------------------------------------

    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        return jnp.reshape(x, tuple(shape))

    def transpose(self, x: Array, axes: Sequence[int] | None = None) -> Array:
        return jnp.transpose(x, None if axes is None else tuple(axes))

    def expand_dims(self, x: Array, axis: int) -> Array:
        return jnp.expand_dims(x, axis)

    def squeeze(self, x: Array, axis: int | Sequence[int] | None = None) -> Array:
        return jnp.squeeze(x, axis=_axes(axis))

    def broadcast_to(self, x: Array, shape: Sequence[int]) -> Array:
        return jnp.broadcast_to(x, tuple(shape))

    def concat(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return jnp.concatenate(list(xs), axis=axis)

    def stack(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return jnp.stack(list(xs), axis=axis)

    def split(self, x: Array, sections: int | Sequence[int], axis: int = 0) -> list[Array]:
        if isinstance(sections, int):
            return jnp.split(x, sections, axis=axis)
        return jnp.split(x, list(itertools.accumulate(sections[:-1])), axis=axis)

    def slice(
        self,
        x: Array,
        starts: Sequence[int],
        stops: Sequence[int],
        axes: Sequence[int] | None = None,
        steps: Sequence[int] | None = None,
    ) -> Array:
        # Python slices on a static shape: clamping and negative steps resolve at trace time
        return jnp.asarray(x)[slice_index(jnp.ndim(x), starts, stops, axes, steps)]

    def take(self, x: Array, indices: Array | int, axis: int = 0) -> Array:
        if isinstance(indices, (int, np.integer)):  # a static slice, no gather
            return lax.index_in_dim(x, int(indices), axis % jnp.ndim(x), keepdims=False)
        # jnp.take's default mode fills out-of-range indices with NaN; wrap as numpy does negatives
        size = jnp.shape(x)[axis]
        if not isinstance(size, (int, np.integer)):  # a symbolic size: "wrap" would need its value
            indices = jnp.asarray(indices)
            return jnp.take(x, jnp.where(indices < 0, indices + size, indices), axis=axis, mode="clip")
        return jnp.take(x, jnp.asarray(indices), axis=axis, mode="wrap")

    def take_along_axis(self, x: Array, indices: Array, axis: int) -> Array:
        return jnp.take_along_axis(x, jnp.asarray(indices), axis=axis, mode="clip", wrap_negative_indices=True)

    def scatter(self, x: Array, indices: Array, updates: Array, axis: int = 0, reduction: str = "none") -> Array:
        x = jnp.asarray(x)
        axis = axis % x.ndim
        index = jnp.asarray(indices)
        index = jnp.where(index < 0, index + x.shape[axis], index)
        grids = list(np.indices(index.shape, sparse=True))  # static grids; broadcast by indexing
        grids[axis] = index
        target = tuple(grids)
        updates = jnp.broadcast_to(updates, index.shape).astype(x.dtype)
        if reduction == "none":  # .at[].set leaves the winner among duplicates open
            return self.scatter_last_wins(x, index, updates, axis)
        if reduction not in _SCATTER:
            raise UnsupportedOp(message("Unknown scatter reduction", received=reduction, choices=["none", *_SCATTER]))
        return getattr(x.at[target], _SCATTER[reduction])(updates)

    def pad(self, x: Array, pad_width: Sequence[tuple[int, int]], mode: str = "constant", value: float = 0) -> Array:
        pad_width = [(before, after) for before, after in pad_width]
        if mode == "constant":
            return jnp.pad(x, pad_width, mode="constant", constant_values=value)
        if mode in _PAD_MODES:
            return jnp.pad(x, pad_width, mode=mode)
        raise UnsupportedOp(message("Unknown pad mode", received=mode, choices=list(_PAD_MODES)))

    def flip(self, x: Array, axis: int | Sequence[int]) -> Array:
        return jnp.flip(x, axis=_axes(axis))

    def tile(self, x: Array, reps: Sequence[int]) -> Array:
        return jnp.tile(x, tuple(reps))

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
        dims = jnp.ndim(w) - 2
        pads = conv_padding(padding, self.shape(x)[2:], self.shape(w)[2:], stride, dilation)
        stride, dilation = as_tuple(stride, dims), as_tuple(dilation, dims)
        kernel = self.shape(w)[2:]
        if groups > 1 and self.shape(w)[1] == 1 and math.prod(kernel) <= _DEPTHWISE_TAPS:
            y = _depthwise(x, w, stride, pads, dilation, groups)
        elif groups == 1 and all(k == 1 for k in kernel) and all(p == (0, 0) for p in pads):
            y = _pointwise(x, w, stride)
        else:  # lax's default dimension numbers are channels first: NC..., OI..., NC...
            y = lax.conv_general_dilated(x, w, stride, pads, rhs_dilation=dilation, feature_group_count=groups)
        return y if b is None else y + jnp.reshape(b, (1, -1) + (1,) * dims)

    def max_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
    ) -> Array:
        dims = jnp.ndim(x) - 2
        window = as_tuple(window, dims)
        stride = as_tuple(stride or window, dims)
        dilation = as_tuple(dilation, dims)
        pads = pool_padding(padding, self.shape(x)[2:], window, stride, dilation, ceil_mode)
        geometry = ((1, 1, *window), (1, 1, *stride), ((0, 0), (0, 0), *pads), (1, 1, *dilation))
        if all(d == 1 for d in dilation):
            return lax.reduce_window(x, _lowest(x.dtype), lax.max, *geometry[:3])
        return _dilated_max_pool(x, geometry)

    def avg_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        count_include_pad: bool = False,
        ceil_mode: bool = False,
    ) -> Array:
        dims = jnp.ndim(x) - 2
        window = as_tuple(window, dims)
        stride = as_tuple(stride or window, dims)
        spatial = self.shape(x)[2:]
        pads = pool_padding(padding, spatial, window, stride, (1,) * dims, ceil_mode)
        total = lax.reduce_window(
            x, np.asarray(0, x.dtype), lax.add, (1, 1, *window), (1, 1, *stride), ((0, 0), (0, 0), *pads)
        )
        # the divisors depend on shapes only: a numpy constant baked into the trace
        counts = pool_counts(spatial, pads, window, stride, count_include_pad, padding)
        return (total / np.asarray(counts, x.dtype)).astype(x.dtype)

    # -- recurrent layers: one lax.scan over time instead of an unrolled Python loop ---------
    # Each step runs the op set's own cell. Hoisting the input projection out of the loop
    # (one big matmul, as the opset's lstm does) measured 1.5-2x slower forward on XLA:CPU.

    def lstm(self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array) -> tuple[Array, Array, Array]:
        def step(carry: tuple[Array, Array], x_t: Array) -> tuple[tuple[Array, Array], Array]:
            h, c = self.lstm_cell(x_t, *carry, w_ih, w_hh, b)
            return (h, c), h

        (h, c), outputs = lax.scan(step, (h, c), jnp.swapaxes(x, 0, 1))
        return jnp.swapaxes(outputs, 0, 1), h, c

    def gru(self, x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array) -> tuple[Array, Array]:
        def step(h, x_t):
            h = self.gru_cell(x_t, h, w_ih, w_hh, b_ih, b_hh)
            return h, h

        h, outputs = lax.scan(step, h, jnp.swapaxes(x, 0, 1))
        return jnp.swapaxes(outputs, 0, 1), h


def _pointwise(x: Any, w: Any, stride: tuple) -> Any:
    """An unpadded 1x1 convolution as a matrix product over channels (of every stride-th pixel).

    XLA's CPU convolutions read the kernel channels-last (``HW..IO``), so an ``OI11`` weight is
    transposed on every call: for ResNet-50 that is 12M weights of its 1x1 convolutions,
    ~60 ms of a ~1 s forward at one thread, and its backward convolutions are slower still. A
    dot reads ``(O, I)`` as it is stored."""
    if any(s != 1 for s in stride):
        x = x[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in stride)]
    w = lax.squeeze(w, tuple(range(2, jnp.ndim(w))))  # (O, I); jax2onnx cannot lower this reshape
    y = lax.dot_general(x, w, (((1,), (1,)), ((), ())))  # (N, *spatial, O)
    return jnp.moveaxis(y, -1, 1)


#: depthwise kernels up to this many taps run as a sum of shifted slices (XLA's CPU grouped
#: convolution is ~50x slower than that for a 3x3 depthwise layer); larger ones go to lax
_DEPTHWISE_TAPS = 64


def _depthwise(x: Any, w: Any, stride: tuple, pads: list, dilation: tuple, groups: int) -> Any:
    """A depthwise convolution (one input channel per group; ``w`` is ``(C * m, 1, *kernel)``)
    as the sum over the kernel's taps of strided slices of ``x`` times per-channel weights."""
    dtype = x.dtype
    if dtype in (jnp.float16, jnp.bfloat16):  # accumulate as a convolution does, in float32
        return _depthwise(x.astype(jnp.float32), w.astype(jnp.float32), stride, pads, dilation, groups).astype(dtype)
    multiplier = w.shape[0] // groups
    if multiplier > 1:  # output channel o reads input channel o // m
        x = jnp.repeat(x, multiplier, axis=1)
    x = jnp.pad(x, ((0, 0), (0, 0), *pads))
    spatial = x.shape[2:]
    kernel = w.shape[2:]
    outs = [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(spatial, kernel, dilation, stride)]
    y = None
    for tap in itertools.product(*(range(k) for k in kernel)):
        starts = [t * d for t, d in zip(tap, dilation)]
        stops = [start + (out - 1) * s + 1 for start, out, s in zip(starts, outs, stride)]
        window = lax.slice(x, (0, 0, *starts), (*x.shape[:2], *stops), (1, 1, *stride))
        term = window * jnp.reshape(w[(slice(None), 0) + tuple(tap)], (1, -1) + (1,) * len(kernel))
        y = term if y is None else y + term
    return y


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _dilated_max_pool(x: Any, geometry: tuple) -> Any:
    """A dilated max pool in one ``reduce_window`` (JAX has no gradient of its own for a
    dilated max window; the one here sends each window's gradient to its first maximum, as
    PyTorch does). ``geometry``: ``(window, strides, padding, dilation)`` over every axis."""
    window, strides, padding, dilation = geometry
    return lax.reduce_window(x, _lowest(x.dtype), lax.max, window, strides, padding, window_dilation=dilation)


def _dilated_max_pool_forward(x: Any, geometry: tuple) -> tuple[Any, tuple]:
    window, strides, padding, dilation = geometry
    positions = jnp.arange(x.size, dtype=jnp.int32).reshape(x.shape)

    def first_max(a, b):  # (value, position) pairs: the larger value, the earlier position on a tie
        take_b = (b[0] > a[0]) | ((b[0] == a[0]) & (b[1] < a[1]))
        return jnp.where(take_b, b[0], a[0]), jnp.where(take_b, b[1], a[1])

    values, where = lax.reduce_window(
        (x, positions),
        (_lowest(x.dtype), np.int32(x.size)),
        first_max,
        window,
        strides,
        padding,
        window_dilation=dilation,
    )
    return values, (where, x.shape)


def _dilated_max_pool_backward(geometry: tuple, saved: tuple, grad: Any) -> tuple[Any]:
    where, shape = saved
    flat = jnp.zeros(math.prod(shape), grad.dtype).at[where.ravel()].add(grad.ravel(), mode="drop")
    return (flat.reshape(shape),)


_dilated_max_pool.defvjp(_dilated_max_pool_forward, _dilated_max_pool_backward)
