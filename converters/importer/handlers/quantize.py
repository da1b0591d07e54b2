"""ONNX handlers: linear quantization (QuantizeLinear, DequantizeLinear, the QLinear and
Integer ops).

Quantizing rounds half to even (``ops.round``) and saturates to the target type's range;
the arithmetic follows ONNX's reference: integer products are exact (int32, or float64
where a framework has no integer convolution), the rescale runs in float64 before the
final rounding, and DequantizeLinear multiplies in float32 and casts to the scale's type.
Narrow targets (int4, uint4, float8) work where the backend's ``cast`` has the dtype.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.converters.importer.handlers.convolution import conv_settings
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler

_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint4": (0, 15),
    "int4": (-8, 7),
    "uint2": (0, 3),
    "int2": (-2, 1),
    "int32": (-(2**31), 2**31 - 1),
}
_FLOAT8_MAX = {
    "float8_e4m3fn": 448.0,
    "float8_e4m3fnuz": 240.0,
    "float8_e5m2": 57344.0,
    "float8_e5m2fnuz": 57344.0,
    "float4_e2m1fn": 6.0,
}
_HALF = ("float16", "bfloat16")


def _broadcastable(ctx, node, value, x_shape, axis: int, block_size: int):
    """A scale or zero point reshaped to broadcast against ``x``: a scalar stays, a 1-D
    per-axis vector lines up with ``axis``, a blocked one is repeated ``block_size``
    times along ``axis`` (and cut to the axis' length)."""
    ops = ctx.ops
    shape = ops.shape(value)
    if len(shape) == 0 or math.prod(shape) == 1:
        return ops.reshape(value, ())
    axis = axis % len(x_shape)
    if block_size:
        index = np.arange(x_shape[axis]) // block_size
        return ops.take(value, ops.asarray(index, "int64"), axis=axis)
    if len(shape) != 1 or shape[0] != x_shape[axis]:
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r} has a scale or zero point that does not fit the input",
                expected=f"a scalar, or a 1-D tensor of length {x_shape[axis]} (input axis {axis}), or "
                "a blocked tensor with the block_size attribute",
                received=f"shape {shape}",
            )
        )
    return ops.reshape(value, tuple(-1 if i == axis else 1 for i in range(len(x_shape))))


def _divide(ctx, x, y, dtype: str):
    """``x / y`` correctly rounded to ``dtype``: divided in float64 and rounded once, since
    XLA's float32 division on CPU can be an ulp off, which moves a quantized value at a .5 tie."""
    ops = ctx.ops
    return ops.cast(ops.divide(ops.cast(x, "float64"), ops.cast(y, "float64")), dtype)


def _quotient_dtype(a: str, b: str) -> str:
    """numpy's result type of dividing floats of types ``a`` and ``b``."""
    if a == b:
        return a
    order = ("float16", "bfloat16", "float32", "float64")
    wider = max(order.index(a), order.index(b)) if a in order and b in order else 3  # int32 x: float64
    return "float32" if order[wider] == "bfloat16" else order[wider]


def _saturate(ctx, y, target: str):
    """Round ``y`` (a float array) half to even and saturate it into the integer ``target``."""
    ops = ctx.ops
    low, high = _RANGES[target]
    return ops.cast(ops.clip(ops.round(y), low, high), target)


@handler("QuantizeLinear", since=10)
def quantize_linear(ctx, node, x, scale, zero_point=None):
    ops = ctx.ops
    target = (
        ops.dtype(zero_point)
        if zero_point is not None
        else onnx_dtype(node.attr("output_dtype", 0))
        if node.attr("output_dtype", 0)
        else "uint8"
    )
    axis, block_size = node.attr("axis", 1), node.attr("block_size", 0)
    # the division runs in the precision attribute's type, by default numpy's for x and the scale
    precision = (
        onnx_dtype(node.attr("precision"))
        if node.attr("precision", 0)
        else _quotient_dtype(ops.dtype(x), ops.dtype(scale))
    )
    shape = ops.shape(x)
    y = _divide(ctx, x, _broadcastable(ctx, node, scale, shape, axis, block_size), precision)
    if target in _FLOAT8_MAX:  # float targets: no zero point is added (ONNX's reference)
        if node.attr("saturate", 1) or target == "float4_e2m1fn":
            y = ops.clip(y, -_FLOAT8_MAX[target], _FLOAT8_MAX[target])
        return ops.cast(y, target)
    if target not in _RANGES:
        raise UnsupportedOp(
            message(
                f"QuantizeLinear node {node.name!r} quantizes to an unsupported type",
                received=target,
                choices=[*_RANGES, *_FLOAT8_MAX],
            )
        )
    y = ops.round(y)
    if ops.dtype(y) in _HALF:  # 16-bit targets do not fit in float16's integers
        y = ops.cast(y, "float32")
    if zero_point is not None:
        y = ops.add(y, ops.cast(_broadcastable(ctx, node, zero_point, shape, axis, block_size), ops.dtype(y)))
    return _saturate(ctx, y, target)


@handler("DequantizeLinear", since=10)
def dequantize_linear(ctx, node, x, scale, zero_point=None):
    ops = ctx.ops
    axis, block_size = node.attr("axis", 1), node.attr("block_size", 0)
    output = onnx_dtype(node.attr("output_dtype")) if node.attr("output_dtype", 0) else ops.dtype(scale)
    shape = ops.shape(x)
    y = ops.cast(x, "float32")
    if zero_point is not None and ops.dtype(x) not in _FLOAT8_MAX:  # float8 zero points are 0
        y = ops.subtract(y, ops.cast(_broadcastable(ctx, node, zero_point, shape, axis, block_size), "float32"))
    y = ops.multiply(y, ops.cast(_broadcastable(ctx, node, scale, shape, axis, block_size), "float32"))
    return ops.cast(y, output)


@handler("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx, node, x):
    """uint8 quantization with the scale and zero point that span ``[min(x, 0), max(x, 0)]``."""
    ops = ctx.ops
    x = ops.cast(x, "float32")
    high, low = ops.maximum(ops.max(x), 0.0), ops.minimum(ops.min(x), 0.0)
    span = ops.subtract(high, low)
    scale = ops.divide(ops.where(ops.equal(span, 0.0), 1.0, span), 255.0)
    zero_point = ops.round(ops.clip(ops.subtract(0.0, ops.divide(low, scale)), 0.0, 255.0))
    y = _saturate(ctx, ops.add(ops.round(_divide(ctx, x, scale, "float32")), zero_point), "uint8")
    return y, scale, ops.cast(zero_point, "uint8")


def _centred(ctx, value, zero_point, channel_axis: int | None = None):
    """``value - zero_point`` as int32; a 1-D zero point applies along ``channel_axis``."""
    ops = ctx.ops
    value = ops.cast(value, "int32")
    if zero_point is None:
        return value
    zero_point = ops.cast(zero_point, "int32")
    if channel_axis is not None and len(ops.shape(zero_point)) == 1 and ops.shape(zero_point)[0] > 1:
        rank = len(ops.shape(value))
        zero_point = ops.reshape(zero_point, tuple(-1 if i == channel_axis else 1 for i in range(rank)))
    elif len(ops.shape(zero_point)) == 1 and channel_axis is not None:
        zero_point = ops.reshape(zero_point, ())
    return ops.subtract(value, zero_point)


def _requantize(ctx, accumulated, scale, y_scale, y_zero_point, target: str):
    """``round(accumulated * scale / y_scale) + y_zero_point`` saturated into ``target``."""
    ops = ctx.ops
    factor = ops.divide(ops.cast(scale, "float64"), ops.cast(y_scale, "float64"))
    y = ops.multiply(ops.cast(accumulated, "float64"), factor)
    if y_zero_point is not None:
        y = ops.add(y, ops.cast(y_zero_point, "float64"))
    return _saturate(ctx, y, target)


@handler("MatMulInteger", since=10)
def matmul_integer(ctx, node, a, b, a_zero_point=None, b_zero_point=None):
    # b's zero point may be per column (its last axis); a's per row (its second-to-last)
    ops = ctx.ops
    if a_zero_point is not None and len(ops.shape(a_zero_point)) == 1 and ops.shape(a_zero_point)[0] > 1:
        a_zero_point = ops.reshape(a_zero_point, (-1, 1))
    return ops.matmul(_centred(ctx, a, a_zero_point), _centred(ctx, b, b_zero_point))


@handler("QLinearMatMul", since=10)
def qlinear_matmul(ctx, node, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    ops = ctx.ops
    accumulated = ops.matmul(_centred(ctx, a, a_zero_point), _centred(ctx, b, b_zero_point))
    scale = ops.multiply(ops.cast(a_scale, "float64"), ops.cast(b_scale, "float64"))
    target = ops.dtype(y_zero_point) if y_zero_point is not None else ops.dtype(a)
    return _requantize(ctx, accumulated, scale, y_scale, y_zero_point, target)


def _integer_conv(ctx, node, x, w):
    """An exact convolution of int32 ``x`` and ``w``: float64 holds every int32 product sum
    of these sizes exactly, and not every framework convolves integers."""
    ops = ctx.ops
    strides, pads, dilations = conv_settings(ops, node, x, w)
    y = ops.conv(
        ops.cast(x, "float64"),
        ops.cast(w, "float64"),
        stride=strides,
        padding=pads,
        dilation=dilations,
        groups=node.attr("group", 1),
    )
    return ops.cast(y, "int32")


@handler("ConvInteger", since=10)
def conv_integer(ctx, node, x, w, x_zero_point=None, w_zero_point=None):
    return _integer_conv(ctx, node, _centred(ctx, x, x_zero_point), _centred(ctx, w, w_zero_point, 0))


@handler("QLinearConv", since=10)
def qlinear_conv(ctx, node, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
    ops = ctx.ops
    accumulated = _integer_conv(ctx, node, _centred(ctx, x, x_zero_point), _centred(ctx, w, w_zero_point, 0))
    rank = len(ops.shape(accumulated))
    if b is not None:
        accumulated = ops.add(accumulated, ops.reshape(ops.cast(b, "int32"), (-1,) + (1,) * (rank - 2)))
    scale = ops.multiply(ops.cast(x_scale, "float64"), ops.cast(w_scale, "float64"))
    if len(ops.shape(scale)) == 1:  # per output channel
        scale = ops.reshape(scale, (-1,) + (1,) * (rank - 2))
    target = ops.dtype(y_zero_point) if y_zero_point is not None else ops.dtype(x)
    return _requantize(ctx, accumulated, scale, y_scale, y_zero_point, target)
