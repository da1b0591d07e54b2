"""ONNX handlers: reductions (ReduceSum, ReduceMean, ReduceMax, ... ReduceSumSquare).

Every reduction is written as ``post(reduce(pre(x)))`` (ReduceL2 is ``sqrt(sum(x * x))``),
because ONNX defines the corner cases that way: with ``noop_with_empty_axes`` and no axes
only ``pre`` and ``post`` run (ReduceLogSum is then ``log(x)``), and a reduction over
an empty set gives the reduction's identity passed through ``post`` (0 for sums, -inf for
ReduceMax and ReduceLogSum...) rather than numpy's error. Results keep the input's
dtype: numpy and torch widen integer sums to int64, ONNX does not.

Axes are an attribute up to ReduceSum-11 and the others' version 13, then an optional
(static) input: ReduceSum from 13, the others from 18.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import ConversionError, message
from xdevice.converters.importer.registry import handler

_INTEGER = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _iinfo(dtype: str, which: str, fallback: float) -> float | int | bool:
    if dtype == "bool":
        return which == "max"
    if dtype in _INTEGER:
        return int(getattr(np.iinfo(np.dtype(dtype)), which))
    return fallback


# name -> (pre, reduce, post, value over an empty set as a function of the dtype)
_KINDS = {
    "ReduceSum": (None, "sum", None, lambda dtype: 0),
    "ReduceMean": (None, "mean", None, lambda dtype: 0 if dtype in _INTEGER else math.nan),
    "ReduceProd": (None, "prod", None, lambda dtype: 1),
    "ReduceMax": (None, "max", None, lambda dtype: _iinfo(dtype, "min", -math.inf)),
    "ReduceMin": (None, "min", None, lambda dtype: _iinfo(dtype, "max", math.inf)),
    "ReduceL1": ("abs", "sum", None, lambda dtype: 0),
    "ReduceL2": ("square", "sum", "sqrt", lambda dtype: 0),
    "ReduceSumSquare": ("square", "sum", None, lambda dtype: 0),
    "ReduceLogSum": (None, "sum", "log", lambda dtype: -math.inf),
    "ReduceLogSumExp": ("exp", "sum", "log", lambda dtype: -math.inf),
}


def _reduce(ctx, node, x, axes, noop: bool):
    ops = ctx.ops
    pre, reduce, post, empty = _KINDS[node.op]
    dtype, shape = ops.dtype(x), ops.shape(x)
    keepdims = bool(node.attr("keepdims", 1))
    axes = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    if not axes and noop:  # "reduce over no axes": only the elementwise steps run
        axes = ()
    elif not axes:
        axes = tuple(range(len(shape)))
    else:
        if any(not -len(shape) <= a < len(shape) for a in axes):
            raise ConversionError(
                message(
                    f"{node.op} node {node.name!r} has an axis out of range",
                    expected=f"axes in [{-len(shape)}, {len(shape) - 1}]",
                    received=axes,
                )
            )
        axes = tuple(sorted({a % len(shape) for a in axes}))
    if axes and any(isinstance(d, int) and d == 0 for d in shape):
        # numpy and the frameworks disagree (or raise) on empty reductions: ONNX's identity
        out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes)
        return ops.full(out_shape, empty(dtype), dtype)
    if node.op == "ReduceLogSumExp" and axes and dtype not in _INTEGER:
        return ops.logsumexp(x, axis=axes, keepdims=keepdims)  # stable: no overflow of exp
    y = ops.cast(x, "float64") if dtype in _INTEGER and (post or reduce == "mean" or pre == "exp") else x
    if dtype == "bool":  # max/min of booleans are any/all; not every framework reduces bool
        y = ops.cast(x, "int32")
    if pre and not (pre == "abs" and dtype.startswith("uint")):  # |x| of unsigned is x
        y = getattr(ops, pre)(y)
    if axes:
        y = getattr(ops, reduce)(y, axis=axes, keepdims=keepdims)
    if post:
        y = getattr(ops, post)(y)
    return ops.cast(y, dtype) if ops.dtype(y) != dtype else y


def _attribute_axes(ctx, node, x):
    return _reduce(ctx, node, x, node.attr("axes"), noop=False)


def _input_axes(ctx, node, x, axes=None):
    return _reduce(ctx, node, x, axes, noop=bool(node.attr("noop_with_empty_axes", 0)))


for _op in _KINDS:
    handler(_op, since=1)(_attribute_axes)
    handler(_op, since=13 if _op == "ReduceSum" else 18, static=(1,))(_input_axes)
