"""ONNX handlers: elementwise math, comparisons, logic, bit operations, activations, casts.

ONNX arithmetic keeps its inputs' type (integer ``Div`` truncates, ``Pow`` returns the
base's type), where numpy would promote; the handlers restore ONNX's rule.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice.backends.opset import numpy_dtype
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler

_INTEGER = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")


def _unary(op: str, since: int, method: str) -> None:
    handler(op, since)(lambda ctx, node, x: getattr(ctx.ops, method)(x))


for _op, _since, _method in [
    ("Abs", 6, "abs"),
    ("Neg", 6, "negative"),
    ("Exp", 6, "exp"),
    ("Log", 6, "log"),
    ("Sqrt", 6, "sqrt"),
    ("Floor", 6, "floor"),
    ("Ceil", 6, "ceil"),
    ("Round", 11, "round"),
    ("Sign", 9, "sign"),
    ("Sin", 7, "sin"),
    ("Cos", 7, "cos"),
    ("Tan", 7, "tan"),
    ("Asin", 7, "asin"),
    ("Acos", 7, "acos"),
    ("Atan", 7, "atan"),
    ("Sinh", 9, "sinh"),
    ("Cosh", 9, "cosh"),
    ("Asinh", 9, "asinh"),
    ("Acosh", 9, "acosh"),
    ("Atanh", 9, "atanh"),
    ("Tanh", 6, "tanh"),
    ("Sigmoid", 6, "sigmoid"),
    ("Erf", 9, "erf"),
    ("Relu", 6, "relu"),
    ("Not", 1, "logical_not"),
    ("IsNaN", 9, "isnan"),
    ("BitwiseNot", 18, "bitwise_not"),
    ("Softplus", 1, "softplus"),
    ("Reciprocal", 6, "reciprocal"),
]:
    _unary(_op, _since, _method)


def _binary(op: str, since: int, method: str) -> None:
    handler(op, since)(lambda ctx, node, a, b: getattr(ctx.ops, method)(a, b))


for _op, _since, _method in [
    ("Add", 7, "add"),
    ("Sub", 7, "subtract"),
    ("Mul", 7, "multiply"),
    ("Equal", 7, "equal"),
    ("Greater", 7, "greater"),
    ("Less", 7, "less"),
    ("GreaterOrEqual", 12, "greater_equal"),
    ("LessOrEqual", 12, "less_equal"),
    ("And", 7, "logical_and"),
    ("Or", 7, "logical_or"),
    ("Xor", 7, "logical_xor"),
    ("BitwiseAnd", 18, "bitwise_and"),
    ("BitwiseOr", 18, "bitwise_or"),
    ("BitwiseXor", 18, "bitwise_xor"),
]:
    _binary(_op, _since, _method)


def _legacy(ctx, node, a, b):
    """``b`` lined up with ``a`` under opset 1-6 arithmetic: without ``broadcast=1`` their
    shapes match; with it, ``b``'s dims match ``a``'s from ``axis`` on (by default its last
    dims, as numpy aligns them), so trailing ones are added to ``b``."""
    axis = node.attr("axis", None)
    if not node.attr("broadcast", 0) or axis is None:
        return b
    ops = ctx.ops
    rank_a, rank_b = len(ops.shape(a)), len(ops.shape(b))
    trailing = rank_a - axis % max(rank_a, 1) - rank_b
    return ops.reshape(b, (*ops.shape(b), *([1] * trailing))) if trailing > 0 else b


def _legacy_binary(op: str, method: str) -> None:
    handler(op, 1)(lambda ctx, node, a, b: getattr(ctx.ops, method)(a, _legacy(ctx, node, a, b)))


for _op, _method in [
    ("Add", "add"),
    ("Sub", "subtract"),
    ("Mul", "multiply"),
    ("Equal", "equal"),
    ("Greater", "greater"),
    ("Less", "less"),
    ("And", "logical_and"),
    ("Or", "logical_or"),
    ("Xor", "logical_xor"),
]:
    _legacy_binary(_op, _method)


@handler("Div", since=1)
def div_legacy(ctx, node, a, b):
    return div(ctx, node, a, _legacy(ctx, node, a, b))


@handler("Pow", since=1)
def pow_legacy(ctx, node, base, exponent):
    return pow_(ctx, node, base, _legacy(ctx, node, base, exponent))


@handler("Div", since=7)
def div(ctx, node, a, b):
    ops = ctx.ops
    if ops.dtype(a) == "object":  # symbolic sizes of a traced shape: positive integers
        return ops.floor_divide(a, b)
    if ops.dtype(a) in _INTEGER:  # C's integer division: truncate toward zero
        return ops.floor_divide(ops.subtract(a, ops.fmod(a, b)), b)
    return ops.divide(a, b)


@handler("Pow", since=7)
def pow_(ctx, node, base, exponent):
    ops = ctx.ops
    result = ops.power(base, ops.cast(exponent, ops.dtype(base)) if ops.dtype(base) in _INTEGER else exponent)
    return ops.cast(result, ops.dtype(base)) if ops.dtype(result) != ops.dtype(base) else result


@handler("Mod", since=10)
def mod(ctx, node, a, b):
    return ctx.ops.fmod(a, b) if node.attr("fmod", 0) else ctx.ops.mod(a, b)


@handler("BitShift", since=11)
def bit_shift(ctx, node, x, shift):
    return ctx.ops.left_shift(x, shift) if node.attr("direction") == "LEFT" else ctx.ops.right_shift(x, shift)


@handler("IsInf", since=10)
def is_inf(ctx, node, x):
    ops = ctx.ops
    inf = ops.isinf(x)
    negative, positive = node.attr("detect_negative", 1), node.attr("detect_positive", 1)
    if negative and positive:
        return inf
    if negative:
        return ops.logical_and(inf, ops.less(x, 0))
    if positive:
        return ops.logical_and(inf, ops.greater(x, 0))
    return ops.logical_and(inf, ops.logical_not(inf))


def _variadic(ctx, combine, values):
    out = values[0]
    for value in values[1:]:
        out = combine(out, value)
    return out


@handler("Sum", since=1)  # before 8: inputs of one shape, a case of the same math
@handler("Sum", since=8)
def sum_(ctx, node, *values):
    return _variadic(ctx, ctx.ops.add, values)


@handler("Mean", since=1)  # before 8: inputs of one shape, a case of the same math
@handler("Mean", since=8)
def mean(ctx, node, *values):
    return ctx.ops.divide(_variadic(ctx, ctx.ops.add, values), float(len(values)))


@handler("Max", since=1)  # before 8: inputs of one shape, a case of the same math
@handler("Max", since=8)
def max_(ctx, node, *values):
    return _variadic(ctx, ctx.ops.maximum, values)


@handler("Min", since=1)  # before 8: inputs of one shape, a case of the same math
@handler("Min", since=8)
def min_(ctx, node, *values):
    return _variadic(ctx, ctx.ops.minimum, values)


@handler("Where", since=9)
def where(ctx, node, condition, x, y):
    return ctx.ops.where(condition, x, y)


@handler("Clip", since=6)
def clip_6(ctx, node, x):
    return ctx.ops.clip(x, node.attr("min", -3.4028234663852886e38), node.attr("max", 3.4028234663852886e38))


@handler("Clip", since=11)
def clip_11(ctx, node, x, low=None, high=None):
    ops = ctx.ops
    if low is not None:
        x = ops.maximum(x, low)
    if high is not None:
        x = ops.minimum(x, high)
    return x


@handler("Identity", since=1)
def identity(ctx, node, x):
    return x


# -- activations ---------------------------------------------------------------------------


@handler("LeakyRelu", since=6)
def leaky_relu(ctx, node, x):
    ops = ctx.ops
    return ops.where(ops.less(x, 0), ops.multiply(x, node.attr("alpha", 0.01)), x)


@handler("PRelu", since=1)
def prelu_legacy(ctx, node, x, slope):
    """Before opset 7 a slope of one value per channel applies along axis 1."""
    ops = ctx.ops
    shape, slope_shape = ops.shape(x), ops.shape(slope)
    if len(slope_shape) == 1 and len(shape) > 2 and slope_shape[0] == shape[1]:
        slope = ops.reshape(slope, (slope_shape[0], *([1] * (len(shape) - 2))))
    return prelu(ctx, node, x, slope)


@handler("PRelu", since=7)
def prelu(ctx, node, x, slope):
    ops = ctx.ops
    return ops.where(ops.less(x, 0), ops.multiply(x, slope), x)


@handler("Elu", since=6)
def elu(ctx, node, x):
    ops = ctx.ops
    return ops.where(ops.less(x, 0), ops.multiply(ops.subtract(ops.exp(x), 1.0), node.attr("alpha", 1.0)), x)


@handler("Selu", since=6)
def selu(ctx, node, x):
    ops = ctx.ops
    alpha, gamma = node.attr("alpha", 1.67326319217681884765625), node.attr("gamma", 1.05070102214813232421875)
    negative = ops.multiply(ops.subtract(ops.exp(x), 1.0), alpha)
    return ops.multiply(ops.where(ops.less_equal(x, 0), negative, x), gamma)


@handler("Celu", since=12)
def celu(ctx, node, x):
    ops = ctx.ops
    alpha = node.attr("alpha", 1.0)
    return ops.add(ops.relu(x), ops.minimum(0.0, ops.multiply(ops.subtract(ops.exp(ops.divide(x, alpha)), 1.0), alpha)))


@handler("ThresholdedRelu", since=10)
def thresholded_relu(ctx, node, x):
    ops = ctx.ops
    return ops.where(ops.greater(x, node.attr("alpha", 1.0)), x, 0.0)


@handler("HardSigmoid", since=6)
def hard_sigmoid(ctx, node, x):
    ops = ctx.ops
    return ops.clip(ops.add(ops.multiply(x, node.attr("alpha", 0.2)), node.attr("beta", 0.5)), 0.0, 1.0)


@handler("HardSwish", since=14)
def hard_swish(ctx, node, x):
    ops = ctx.ops
    return ops.multiply(x, ops.clip(ops.add(ops.multiply(x, 1 / 6), 0.5), 0.0, 1.0))


@handler("Softsign", since=1)
def softsign(ctx, node, x):
    ops = ctx.ops
    return ops.divide(x, ops.add(ops.abs(x), 1.0))


@handler("Mish", since=18)
def mish(ctx, node, x):
    ops = ctx.ops
    return ops.multiply(x, ops.tanh(ops.softplus(x)))


@handler("Swish", since=24)
def swish(ctx, node, x):
    ops = ctx.ops
    return ops.multiply(x, ops.sigmoid(ops.multiply(x, node.attr("alpha", 1.0))))


@handler("Gelu", since=20)
def gelu(ctx, node, x):
    return ctx.ops.gelu(x, approximate=node.attr("approximate", "none") == "tanh")


@handler("Shrink", since=9)
def shrink(ctx, node, x):
    ops = ctx.ops
    bias, lambd = node.attr("bias", 0.0), node.attr("lambd", 0.5)
    out = ops.where(ops.less(x, -lambd), ops.add(x, bias), ops.where(ops.greater(x, lambd), ops.subtract(x, bias), 0))
    return ops.cast(out, ops.dtype(x))


# -- types ------------------------------------------------------------------------------------


def _cast(ctx, x, to: str, saturate: int = 1):
    ops = ctx.ops
    if (
        isinstance(x, np.ndarray)
        and x.dtype == object
        and to.startswith(("int", "uint"))
        and not any(isinstance(v, str) for v in x.reshape(-1))
    ):
        return x  # sizes, some symbolic (a traced shape): integers already, and kept symbolic
    if isinstance(x, np.ndarray) and (to == "string" or x.dtype.kind in "OSU"):
        return _cast_strings(x, to)  # strings exist only as static numpy values
    if to.startswith("float8") and saturate and ops.dtype(x) in ("float16", "bfloat16", "float32", "float64"):
        limit = _FLOAT8_MAX[to]  # saturate: clamp finite values to the format's range
        x = ops.where(ops.isinf(x), x, ops.clip(x, -limit, limit))
    return ops.cast(x, to)


_FLOAT8_MAX = {"float8_e4m3fn": 448.0, "float8_e4m3fnuz": 240.0, "float8_e5m2": 57344.0, "float8_e5m2fnuz": 57344.0}


def _cast_strings(x: np.ndarray, to: str) -> np.ndarray:
    if to == "string":
        return np.vectorize(_format_number, otypes=[object])(x) if x.dtype.kind not in "OSU" else x.astype(object)
    return x.astype(str).astype(numpy_dtype(to) if to != "bool" else bool)


def _format_number(value) -> str:
    if isinstance(value, (float, np.floating)):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "INF" if value > 0 else "-INF"
        return np.format_float_positional(value, trim="-") if abs(value) < 1e16 else repr(float(value))
    return str(value)


@handler("Cast", since=6)
def cast(ctx, node, x):
    return _cast(ctx, x, onnx_dtype(node.attr("to")), node.attr("saturate", 1))


@handler("CastLike", since=15)
def cast_like(ctx, node, x, like):
    target = like.dtype.name if isinstance(like, np.ndarray) and like.dtype.kind in "OSU" else None
    return _cast(
        ctx,
        x,
        "string" if target or (isinstance(like, np.ndarray) and like.dtype.kind == "O") else ctx.ops.dtype(like),
        node.attr("saturate", 1),
    )
