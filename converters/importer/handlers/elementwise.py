"""ONNX handlers: elementwise math, comparisons, logic, bit operations, activations, casts.

ONNX arithmetic keeps its inputs' type (integer ``Div`` truncates, ``Pow`` returns the
base's type), where numpy would promote; the handlers restore ONNX's rule.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import UnsupportedOp, message
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


def _cast(ctx, x, to: str, saturate: int = 1, round_mode: str = "up"):
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
    source = ops.dtype(x)
    if source in _NARROW_INTS:  # widened first: the backends need not compute in 2 or 4 bits
        x = ops.cast(x, _NARROW_INTS[source][1])
        source = ops.dtype(x)
    if to in _NARROW_INTS:
        return _wrap_narrow_int(ctx, x, to)
    if to in _FLOAT8_LIMITS and source in _FLOATS:
        x = _float8_range(ctx, x, to, saturate)
    if to == "float8_e8m0fnu" and source != to:
        x = _power_of_two(ctx, x, saturate, round_mode)
    return ops.cast(x, to)


#: The narrow integers by width and the byte-wide type that holds every value of each.
_NARROW_INTS = {"int4": (4, "int8"), "uint4": (4, "uint8"), "int2": (2, "int8"), "uint2": (2, "uint8")}
_FLOATS = ("float16", "bfloat16", "float32", "float64")
#: Each float8 format's largest finite value; the halfway point to the next step, where
#: round-to-nearest-even overflows ("above" it where the largest value's mantissa is even and
#: keeps the tie, "from" it where it is odd); what an overflow becomes without ``saturate``.
_FLOAT8_LIMITS = {
    "float8_e4m3fn": (448.0, 464.0, "above", math.nan),
    "float8_e4m3fnuz": (240.0, 248.0, "from", math.nan),
    "float8_e5m2": (57344.0, 61440.0, "from", math.inf),
    "float8_e5m2fnuz": (57344.0, 61440.0, "from", math.nan),
}


def _wrap_narrow_int(ctx, x, to: str):
    """``x`` cast to a 2- or 4-bit integer as ONNX's reference does (C's cast: floats
    truncate toward zero, NaN and infinities give 0, the low bits are kept), computed in
    int64 and handed to the backend in range, so no backend needs arithmetic in ``to``."""
    ops = ctx.ops
    bits, wide = _NARROW_INTS[to]
    if ops.dtype(x) in _FLOATS:
        finite = ops.logical_not(ops.logical_or(ops.isnan(x), ops.isinf(x)))
        x = ops.where(finite, ops.where(ops.less(x, 0), ops.ceil(x), ops.floor(x)), 0)
    low_bits = ops.mod(ops.cast(x, "int64"), 2**bits)  # floor-mod: two's complement's low bits
    if wide == "int8":  # sign-extend the top bit
        low_bits = ops.where(ops.greater_equal(low_bits, 2 ** (bits - 1)), ops.subtract(low_bits, 2**bits), low_bits)
    return ops.cast(ops.cast(low_bits, wide), to)


def _float8_range(ctx, x, to: str, saturate: int):
    """``x`` with what lies beyond a float8 format's range settled before the backend's
    round-to-nearest-even cast: with ``saturate`` clamped to the largest finite value
    (infinities too), without it NaN (or infinity for e5m2) where rounding overflows, since
    frameworks differ there (torch saturates e4m3fn even when ONNX asks for NaN)."""
    ops = ctx.ops
    largest, overflow, side, becomes = _FLOAT8_LIMITS[to]
    if saturate:
        return ops.clip(x, -largest, largest)
    if ops.dtype(x) in ("float16", "bfloat16"):
        x = ops.cast(x, "float32")  # holds the overflow value (e5m2's 61440 is past float16's grid)
    too_big = (ops.greater if side == "above" else ops.greater_equal)(ops.abs(x), overflow)
    if math.isinf(becomes):
        return ops.where(too_big, ops.where(ops.less(x, 0), -math.inf, math.inf), x)
    return ops.where(too_big, math.nan, x)


def _power_of_two(ctx, x, saturate: int, round_mode: str):
    """``x`` (read as float32) rounded to the power of two float8_e8m0fnu holds, as float32,
    by ONNX's reference (``onnx.numpy_helper.to_float8e8m0``): its sign is dropped, NaN and
    infinities become NaN, ``round_mode`` "up" goes to the next power when any fraction is
    left, "down" drops it, "nearest" rounds half up; ``saturate`` stops at 2**127 rather
    than overflowing to NaN. The exponent is found in float64 from a logarithm, then made
    exact by comparing with powers of two."""
    ops = ctx.ops
    if round_mode not in ("up", "down", "nearest"):
        raise UnsupportedOp(message("Unknown Cast round_mode", received=round_mode, choices=["up", "down", "nearest"]))
    x = ops.cast(ops.cast(x, "float32"), "float64")
    special = ops.logical_or(ops.isnan(x), ops.isinf(x))
    size = ops.where(special, 1.0, ops.abs(x))
    smallest_normal = 2.0**-126
    normal = ops.greater_equal(size, smallest_normal)
    clamped = ops.maximum(size, smallest_normal)
    power = ops.floor(ops.divide(ops.log(clamped), math.log(2.0)))
    power = ops.where(ops.greater(ops.power(2.0, power), clamped), ops.subtract(power, 1.0), power)
    power = ops.where(ops.less_equal(ops.power(2.0, ops.add(power, 1.0)), clamped), ops.add(power, 1.0), power)
    exponent = ops.where(normal, ops.add(power, 127.0), 0.0)  # the 8-bit field; 0 is 2**-127
    if round_mode == "up":
        step = ops.where(normal, ops.not_equal(size, ops.power(2.0, power)), ops.greater(size, 0.0))
    elif round_mode == "nearest":  # half or more of the next power's step (below normals: more)
        half = ops.where(normal, ops.multiply(ops.power(2.0, power), 1.5), 2.0**-127)
        step = ops.where(normal, ops.greater_equal(size, half), ops.greater(size, half))
    else:
        step = ops.less(size, 0.0)  # never
    if saturate:
        step = ops.logical_and(step, ops.less(exponent, 254.0))
    exponent = ops.add(exponent, ops.cast(step, "float64"))
    nan = ops.logical_or(special, ops.greater(exponent, 254.0))
    # 2**-127 is subnormal in float32, and XLA's arithmetic flushes it to 0: chosen, not computed
    value = ops.cast(ops.power(2.0, ops.subtract(ops.maximum(exponent, 1.0), 127.0)), "float32")
    return ops.where(nan, math.nan, ops.where(ops.equal(exponent, 0.0), 2.0**-127, value))


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
    return _cast(ctx, x, onnx_dtype(node.attr("to")), node.attr("saturate", 1), node.attr("round_mode", "up"))


@handler("BitCast", since=26)
def bitcast(ctx, node, x):
    """The same bits read as another type of the same width (float32 1.0 is int32 1065353216)."""
    to = onnx_dtype(node.attr("to"))
    if isinstance(x, np.ndarray):  # known while the graph is built: numpy reinterprets it
        return x.view(numpy_dtype(to))
    return ctx.ops.bitcast(x, to)


@handler("CastLike", since=15)
def cast_like(ctx, node, x, like):
    target = like.dtype.name if isinstance(like, np.ndarray) and like.dtype.kind in "OSU" else None
    return _cast(
        ctx,
        x,
        "string" if target or (isinstance(like, np.ndarray) and like.dtype.kind == "O") else ctx.ops.dtype(like),
        node.attr("saturate", 1),
        node.attr("round_mode", "up"),
    )
