"""The reference op set in numpy: the ground truth every other backend is measured against.

Written for clarity over speed. Convolution and pooling go through one sliding-window view
(``windows``), which ``autodiff.py`` reuses for their gradients. Parity runs this backend in
float64, so its own rounding stays far below any tolerance.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from xdevice._errors import UnsupportedOp, message
from xdevice.backends._shapes import as_tuple, conv_padding, pool_counts, pool_padding, slice_index, windows
from xdevice.backends.opset import NARROW_DTYPES, Ops, numpy_dtype

__all__ = ["NumpyOps"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _ieee(op):
    """``op`` with IEEE results and no warning: log(0) is -inf, 1/0 inf, 0/0 nan, as every
    framework gives them silently (numpy warns, and the reference must not be noisier)."""

    @functools.wraps(op)
    def quiet(*args):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return op(*args)

    return quiet


class NumpyOps(Ops):
    name = "numpy"
    key_dtype = "uint32"

    # -- arrays ---------------------------------------------------------------------------

    def asarray(self, x, dtype=None):
        return np.asarray(x, dtype=numpy_dtype(dtype) if dtype else None)

    def to_numpy(self, x):
        return np.array(x, copy=True)

    def shape(self, x):
        return tuple(int(d) for d in np.shape(x))

    def dtype(self, x):
        return np.asarray(x).dtype.name

    @_ieee
    def bitcast(self, x, dtype):
        return np.asarray(x).view(numpy_dtype(dtype))

    def cast(self, x, dtype):
        x = np.asarray(x)
        if x.dtype == object and numpy_dtype(dtype).kind in "iu":
            # sizes of a traced shape (Python objects, symbolic): integers already, kept symbolic
            if any(not isinstance(v, (int, np.integer)) for v in x.reshape(-1)):
                return x
        return x.astype(numpy_dtype(dtype))

    def zeros(self, shape, dtype="float32"):
        return np.zeros(tuple(shape), dtype=numpy_dtype(dtype))

    def ones(self, shape, dtype="float32"):
        return np.ones(tuple(shape), dtype=numpy_dtype(dtype))

    def full(self, shape, value, dtype="float32"):
        return np.full(tuple(shape), value, dtype=numpy_dtype(dtype))

    def arange(self, start, stop=None, step=1, dtype="int32"):
        return (
            np.arange(start, stop, step, dtype=numpy_dtype(dtype))
            if stop is not None
            else np.arange(start, dtype=numpy_dtype(dtype))
        )

    # -- elementwise ----------------------------------------------------------------------

    def negative(self, x):
        return np.negative(x)

    def abs(self, x):
        return np.abs(x)

    def sign(self, x):
        return np.sign(x)

    @_ieee
    def exp(self, x):
        return np.exp(x)

    @_ieee
    def log(self, x):
        return np.log(x)

    @_ieee
    def sqrt(self, x):
        return np.sqrt(x)

    def sin(self, x):
        return np.sin(x)

    def cos(self, x):
        return np.cos(x)

    def tan(self, x):
        return np.tan(x)

    def tanh(self, x):
        return np.tanh(x)

    def sigmoid(self, x):
        x = np.asarray(x)
        # exp of a non-positive number only: no overflow either side
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)

    def erf(self, x):
        x = np.asarray(x)
        from math import erf

        return np.vectorize(erf, otypes=[np.float64])(x).astype(x.dtype)

    def floor(self, x):
        return np.floor(x)

    def ceil(self, x):
        return np.ceil(x)

    def round(self, x):
        return np.round(x)

    def asin(self, x):
        return np.arcsin(x)

    def acos(self, x):
        return np.arccos(x)

    def atan(self, x):
        return np.arctan(x)

    def sinh(self, x):
        return np.sinh(x)

    def cosh(self, x):
        return np.cosh(x)

    def asinh(self, x):
        return np.arcsinh(x)

    def acosh(self, x):
        return np.arccosh(x)

    def atanh(self, x):
        return np.arctanh(x)

    def bitwise_not(self, x):
        return np.invert(x)

    @_ieee
    def fmod(self, x, y):
        return np.fmod(x, y)

    def cumprod(self, x, axis):
        return np.cumprod(x, axis=axis)

    def sort(self, x, axis=-1, descending=False):
        x = np.asarray(x)
        # ml_dtypes' narrow floats do not order NaN: sort by a float32 key
        key = x.astype(np.float32) if x.dtype.kind == "V" or x.dtype.name in NARROW_DTYPES else x
        if descending:
            # stable descending with NaN first: sort the reversed order key, then map back
            order = np.flip(np.argsort(np.flip(key, axis), axis=axis, kind="stable"), axis)
            order = x.shape[axis] - 1 - order
        else:
            order = np.argsort(key, axis=axis, kind="stable")
        return np.take_along_axis(x, order, axis=axis), order.astype(np.int64)

    def scatter(self, x, indices, updates, axis=0, reduction="none"):
        out = np.array(x, copy=True)
        index = np.asarray(indices).astype(np.int64)
        index = np.where(index < 0, index + out.shape[axis], index)
        grids: list[Any] = list(np.indices(index.shape, sparse=True))
        grids[axis % out.ndim] = index
        target = tuple(np.broadcast_to(g, index.shape) for g in grids)
        updates = np.broadcast_to(updates, index.shape)
        if reduction == "none":
            out[target] = updates  # numpy's fancy assignment: the last duplicate wins
        elif reduction in _SCATTER:
            _SCATTER[reduction].at(out, target, updates)
        else:
            raise UnsupportedOp(message("Unknown scatter reduction", received=reduction, choices=["none", *_SCATTER]))
        return out

    def det(self, x):
        return np.linalg.det(x)

    def relu(self, x):
        x = np.asarray(x)
        return np.maximum(x, np.zeros((), x.dtype))

    def logical_not(self, x):
        return np.logical_not(x)

    def isnan(self, x):
        return np.isnan(x)

    def isinf(self, x):
        return np.isinf(x)

    def stop_gradient(self, x):
        return x

    def gelu(self, x, approximate=False):
        x = np.asarray(x)
        if approximate:
            inner = _SQRT_2_OVER_PI * (x + 0.044715 * x**3)
            return (0.5 * x * (1 + np.tanh(inner))).astype(x.dtype)
        return (0.5 * x * (1 + self.erf(x / math.sqrt(2)))).astype(x.dtype)

    def add(self, x, y):
        return np.add(x, y)

    def subtract(self, x, y):
        return np.subtract(x, y)

    def multiply(self, x, y):
        return np.multiply(x, y)

    @_ieee
    def divide(self, x, y):
        return np.true_divide(x, y)

    @_ieee
    def power(self, x, y):
        return np.power(x, y)

    def maximum(self, x, y):
        return np.maximum(x, y)

    def minimum(self, x, y):
        return np.minimum(x, y)

    @_ieee
    def mod(self, x, y):
        return np.mod(x, y)

    @_ieee
    def floor_divide(self, x, y):
        return np.floor_divide(x, y)

    def logical_and(self, x, y):
        return np.logical_and(x, y)

    def logical_or(self, x, y):
        return np.logical_or(x, y)

    def logical_xor(self, x, y):
        return np.logical_xor(x, y)

    def bitwise_and(self, x, y):
        return np.bitwise_and(x, y)

    def bitwise_or(self, x, y):
        return np.bitwise_or(x, y)

    def bitwise_xor(self, x, y):
        return np.bitwise_xor(x, y)

    def left_shift(self, x, y):
        return np.left_shift(x, y)

    def right_shift(self, x, y):
        return np.right_shift(x, y)

    def equal(self, x, y):
        return np.equal(x, y)

    def not_equal(self, x, y):
        return np.not_equal(x, y)

    def less(self, x, y):
        return np.less(x, y)

    def less_equal(self, x, y):
        return np.less_equal(x, y)

    def greater(self, x, y):
        return np.greater(x, y)

    def greater_equal(self, x, y):
        return np.greater_equal(x, y)

    def where(self, condition, x, y):
        return np.where(condition, x, y)

    # -- linear algebra -------------------------------------------------------------------

    def matmul(self, a, b):
        return np.matmul(a, b)

    def einsum(self, equation, *operands):
        return np.einsum(equation, *operands, optimize=True)

    # -- reductions -----------------------------------------------------------------------

    def sum(self, x, axis=None, keepdims=False):
        return np.sum(x, axis=_axes(axis), keepdims=keepdims)

    def mean(self, x, axis=None, keepdims=False):
        return np.mean(x, axis=_axes(axis), keepdims=keepdims)

    def max(self, x, axis=None, keepdims=False):
        return np.max(x, axis=_axes(axis), keepdims=keepdims)

    def min(self, x, axis=None, keepdims=False):
        return np.min(x, axis=_axes(axis), keepdims=keepdims)

    def prod(self, x, axis=None, keepdims=False):
        return np.prod(x, axis=_axes(axis), keepdims=keepdims)

    def argmax(self, x, axis, keepdims=False):
        return np.argmax(x, axis=axis, keepdims=keepdims)

    def argmin(self, x, axis, keepdims=False):
        return np.argmin(x, axis=axis, keepdims=keepdims)

    def cumsum(self, x, axis):
        return np.cumsum(x, axis=axis)

    # -- shape ----------------------------------------------------------------------------

    def reshape(self, x, shape):
        return np.reshape(x, tuple(shape))

    def transpose(self, x, axes=None):
        return np.transpose(x, None if axes is None else tuple(axes))

    def expand_dims(self, x, axis):
        return np.expand_dims(x, axis)

    def squeeze(self, x, axis=None):
        return np.squeeze(x, axis=_axes(axis))

    def broadcast_to(self, x, shape):
        return np.broadcast_to(x, tuple(shape))

    def concat(self, xs, axis=0):
        return np.concatenate(list(xs), axis=axis)

    def stack(self, xs, axis=0):
        return np.stack(list(xs), axis=axis)

    def split(self, x, sections, axis=0):
        if isinstance(sections, int):
            return np.split(x, sections, axis=axis)
        return np.split(x, np.cumsum(sections)[:-1], axis=axis)

    def slice(self, x, starts, stops, axes=None, steps=None):
        return np.asarray(x)[slice_index(np.ndim(x), starts, stops, axes, steps)]

    def take(self, x, indices, axis=0):
        return np.take(x, indices, axis=axis)

    def take_along_axis(self, x, indices, axis):
        return np.take_along_axis(x, np.asarray(indices).astype(np.int64), axis=axis)

    def pad(self, x, pad_width, mode="constant", value=0):
        pad_width = [tuple(p) for p in pad_width]
        if mode == "constant":
            return np.pad(x, pad_width, mode="constant", constant_values=value)
        if mode in ("reflect", "edge"):
            return np.pad(x, pad_width, mode=mode)
        raise UnsupportedOp(message("Unknown pad mode", received=mode, choices=["constant", "reflect", "edge"]))

    def flip(self, x, axis):
        return np.flip(x, axis=_axes(axis))

    def tile(self, x, reps):
        return np.tile(x, tuple(reps))

    # -- neural network -------------------------------------------------------------------

    def conv(self, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
        x, w = np.asarray(x), np.asarray(w)
        dims = w.ndim - 2
        pads = conv_padding(padding, x.shape[2:], w.shape[2:], stride, dilation)
        padded = np.pad(x, [(0, 0), (0, 0), *pads])
        cols = windows(padded, w.shape[2:], as_tuple(stride, dims), as_tuple(dilation, dims))
        # cols: (N, C, *out, *kernel) -> grouped contraction with w (O, C/g, *kernel)
        n, c = x.shape[:2]
        out_shape = cols.shape[2 : 2 + dims]
        cols = cols.reshape(n, groups, c // groups, *out_shape, *w.shape[2:])
        wg = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
        letters = "defgh"[:dims], "uvw"[:dims]
        y = np.einsum(f"ngc{letters[0]}{letters[1]},goc{letters[1]}->ngo{letters[0]}", cols, wg, optimize=True)
        y = y.reshape(n, w.shape[0], *out_shape)
        if b is not None:
            y = y + np.asarray(b).reshape(1, -1, *([1] * dims))
        return y.astype(np.result_type(x, w))

    def max_pool(self, x, window, stride=None, padding=0, dilation=1, ceil_mode=False):
        x = np.asarray(x)
        dims = x.ndim - 2
        window = as_tuple(window, dims)
        stride = as_tuple(stride or window, dims)
        pads = pool_padding(padding, x.shape[2:], window, stride, as_tuple(dilation, dims), ceil_mode)
        padded = np.pad(x, [(0, 0), (0, 0), *pads], constant_values=-np.inf)
        cols = windows(padded, window, stride, as_tuple(dilation, dims))
        return cols.max(axis=tuple(range(-dims, 0)))

    def avg_pool(self, x, window, stride=None, padding=0, count_include_pad=False, ceil_mode=False):
        x = np.asarray(x)
        dims = x.ndim - 2
        window = as_tuple(window, dims)
        stride = as_tuple(stride or window, dims)
        pads = pool_padding(padding, x.shape[2:], window, stride, (1,) * dims, ceil_mode)
        kernel_axes = tuple(range(-dims, 0))
        total = windows(np.pad(x, [(0, 0), (0, 0), *pads]), window, stride, (1,) * dims).sum(axis=kernel_axes)
        counts = pool_counts(x.shape[2:], pads, window, stride, count_include_pad, padding)
        with np.errstate(invalid="ignore", divide="ignore"):  # a window all in padding is 0/0: NaN
            return (total / counts).astype(x.dtype)


_SCATTER = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _axes(axis):
    if axis is None or isinstance(axis, int):
        return axis
    return tuple(axis)
