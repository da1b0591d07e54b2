"""The op test cases, declared once as data and expanded per backend by test_ops.py.

Each case builds numpy inputs from a seeded generator; floats are made in float64 for the
reference and cast to float32 for the backend under test. ``grad`` lists the positions of
inputs to differentiate. Inputs avoid points where a gradient is undefined (ties for
max/min, 0 for abs, integers for round...), so every framework's convention agrees.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    op: str
    inputs: Callable[[np.random.Generator], tuple]
    kwargs: dict = dataclasses.field(default_factory=dict)
    grad: tuple[int, ...] = ()
    dtype: str = "float32"  # the tolerance row


def normal(*shape):
    return lambda rng: rng.normal(size=shape)


def positive(*shape):
    return lambda rng: rng.uniform(0.5, 2.0, size=shape)


def away_from_zero(*shape):
    return lambda rng: rng.choice([-1, 1], size=shape) * rng.uniform(0.2, 2.0, size=shape)


def ints(low, high, *shape, dtype="int32"):
    return lambda rng: rng.integers(low, high, size=shape).astype(dtype)


def bools(*shape):
    return lambda rng: rng.random(size=shape) < 0.5


def args(*makers):
    """Inputs from makers; a non-callable is passed as is (Python numbers, lists)."""
    return lambda rng: tuple(m(rng) if callable(m) else m for m in makers)


CASES: list[Case] = []


def case(id, op, *makers, grad=(), dtype="float32", **kwargs):
    CASES.append(Case(id, op, args(*makers), kwargs, tuple(grad), dtype))


# -- elementwise, one input ------------------------------------------------------------------
for name in ("negative", "exp", "sin", "cos", "tanh", "sigmoid", "erf", "gelu", "square", "softplus"):
    case(name, name, normal(3, 4), grad=[0])
for name in ("log", "sqrt", "reciprocal", "rsqrt"):
    case(name, name, positive(3, 4), grad=[0])
for name in ("asin", "acos", "atanh"):
    case(name, name, lambda rng: rng.uniform(-0.9, 0.9, (3, 4)), grad=[0])
for name in ("atan", "sinh", "cosh", "asinh"):
    case(name, name, normal(3, 4), grad=[0])
case("acosh", "acosh", lambda rng: rng.uniform(1.1, 3.0, (3, 4)), grad=[0])
case("bitwise_not-int", "bitwise_not", ints(-100, 100, 3, 4))
case("bitwise_not-bool", "bitwise_not", bools(3, 4))
case("fmod-float", "fmod", lambda rng: rng.uniform(-5, 5, (3, 4)), away_from_zero(3, 4), grad=[0])
case("fmod-int", "fmod", ints(-20, 20, 3, 4), lambda rng: rng.choice([-5, -3, 2, 7], size=(3, 4)).astype("int32"))
case("cumprod", "cumprod", away_from_zero(3, 4), grad=[0], axis=1)
case(
    "cumprod-with-zero",
    "cumprod",
    lambda rng: np.array([[1.5, 0.0, 2.0, -3.0], [0.5, 2.0, 0.0, 1.0]]),
    grad=[0],
    axis=1,
)
case("sort", "sort", normal(3, 5), grad=[0], axis=1)
case("sort-descending-ties", "sort", lambda rng: np.array([[2.0, 1.0, 2.0, 0.5, 1.0]]), axis=-1, descending=True)
case("sort-ascending-ties-axis0", "sort", lambda rng: np.array([[1.0, 2.0], [1.0, 0.0], [0.5, 2.0]]), axis=0)
case(
    "scatter",
    "scatter",
    normal(3, 5),
    lambda rng: np.array([[0, 4], [2, -1], [1, 3]]),
    normal(3, 2),
    grad=[0, 2],
    axis=1,
)
case(
    "scatter-add-duplicates",
    "scatter",
    normal(3, 5),
    lambda rng: np.array([[0, 0], [2, 2], [1, 3]]),
    normal(3, 2),
    grad=[0, 2],
    axis=1,
    reduction="add",
)
case(
    "scatter-duplicates-last-wins",
    "scatter",
    normal(2, 4),
    lambda rng: np.array([[1, 1, -3], [0, 2, 0]]),
    normal(2, 3),
    grad=[0, 2],
    axis=1,
)
for reduction in ("mul", "max", "min"):
    case(
        f"scatter-{reduction}",
        "scatter",
        normal(4, 3),
        lambda rng: np.array([[1, 0, 2], [3, 3, 0]]),
        normal(2, 3),
        axis=0,
        reduction=reduction,
    )
case("det", "det", lambda rng: rng.normal(size=(2, 3, 3)) + 3 * np.eye(3), grad=[0])
case("tan", "tan", lambda rng: rng.uniform(-1, 1, (3, 4)), grad=[0])
case("abs", "abs", away_from_zero(3, 4), grad=[0])
case("relu", "relu", away_from_zero(3, 4), grad=[0])
case("gelu-tanh", "gelu", normal(3, 4), grad=[0], approximate=True)
for name in ("sign", "floor", "ceil"):
    case(name, name, lambda rng: rng.uniform(-3, 3, (3, 4)))
case("round-half-even", "round", lambda rng: np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.3, -0.7]))
case("logical_not", "logical_not", bools(3, 4))
case("isnan", "isnan", lambda rng: np.array([1.0, np.nan, np.inf, -np.inf]))
case("isinf", "isinf", lambda rng: np.array([1.0, np.nan, np.inf, -np.inf]))

# -- elementwise, two inputs -------------------------------------------------------------------
for name in ("add", "subtract", "multiply"):
    case(f"{name}-broadcast", name, normal(2, 3, 4), normal(3, 1), grad=[0, 1])
case("divide", "divide", normal(2, 3), away_from_zero(3), grad=[0, 1])
case("power", "power", positive(2, 3), normal(2, 3), grad=[0, 1])
case("maximum", "maximum", normal(3, 4), normal(3, 4), grad=[0, 1])
case("minimum", "minimum", normal(3, 4), normal(1, 4), grad=[0, 1])
case("mod-float", "mod", lambda rng: rng.uniform(-5, 5, (3, 4)), away_from_zero(3, 4), grad=[0])
case("add-scalar", "add", normal(3, 4), 2.0, grad=[0])
case("subtract-scalar-first", "subtract", 1.0, normal(3, 4), grad=[1])
case("divide-scalar-first", "divide", 1.0, positive(3, 4), grad=[1])
case("multiply-scalar", "multiply", 0.5, normal(3, 4), grad=[1])
case("mod-int", "mod", ints(-20, 20, 3, 4), ints(1, 7, 3, 4))
case("mod-int-negative-divisor", "mod", ints(-20, 20, 3, 4), ints(-7, -1, 3, 4))
case("floor_divide-int", "floor_divide", ints(-20, 20, 3, 4), ints(1, 7, 3, 4))
case("floor_divide-float", "floor_divide", lambda rng: rng.uniform(-5, 5, (3, 4)), away_from_zero(3, 4))
for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    case(name, name, ints(0, 1 << 20, 3, 4), ints(0, 1 << 20, 3, 4))
case("left_shift", "left_shift", ints(0, 1 << 10, 3, 4), ints(0, 8, 3, 4))
case("right_shift", "right_shift", ints(0, 1 << 20, 3, 4), ints(0, 8, 3, 4))
for name in ("logical_and", "logical_or", "logical_xor"):
    case(name, name, bools(3, 4), bools(3, 4))
for name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    case(name, name, ints(0, 3, 3, 4), ints(0, 3, 4))
case("where", "where", bools(3, 4), normal(3, 4), normal(1, 4), grad=[1, 2])
case("where-scalar", "where", bools(3, 4), normal(3, 4), 0.0, grad=[1])
case("clip", "clip", normal(3, 4), grad=[0], low=-0.5, high=0.5)

# -- linear algebra -------------------------------------------------------------------------
case("matmul", "matmul", normal(3, 4), normal(4, 5), grad=[0, 1])
case("matmul-batched-broadcast", "matmul", normal(2, 3, 4, 5), normal(5, 6), grad=[0, 1])
case("matmul-batch-of-one", "matmul", normal(3, 4, 5), normal(1, 5, 2), grad=[0, 1])
case("matmul-vector-left", "matmul", normal(4), normal(4, 5), grad=[0, 1])
case("matmul-vector-right", "matmul", normal(3, 4), normal(4), grad=[0, 1])
case("matmul-vector-vector", "matmul", normal(4), normal(4), grad=[0, 1])
case("einsum-matmul", "einsum", "ij,jk->ik", normal(3, 4), normal(4, 5), grad=[1, 2])
case("einsum-attention", "einsum", "bhqd,bhkd->bhqk", normal(2, 2, 3, 4), normal(2, 2, 5, 4), grad=[1, 2])
case("einsum-sum-out", "einsum", "ij->j", normal(3, 4), grad=[1])
case("einsum-ellipsis", "einsum", "...ij,...jk->...ik", normal(2, 3, 4), normal(2, 4, 5), grad=[1, 2])

# -- reductions -------------------------------------------------------------------------------
for name in ("sum", "mean", "max", "min"):
    case(f"{name}-all", name, normal(3, 4), grad=[0])
    case(f"{name}-axis", name, normal(3, 4, 5), grad=[0], axis=1)
    case(f"{name}-axes-keepdims", name, normal(3, 4, 5), grad=[0], axis=(0, 2), keepdims=True)
case("max-ties-split-evenly", "max", lambda rng: np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]]), grad=[0], axis=1)
case("prod", "prod", positive(3, 4), grad=[0], axis=1)
case("argmax", "argmax", normal(3, 4, 5), axis=1)
case("argmin-keepdims", "argmin", normal(3, 4, 5), axis=-1, keepdims=True)
case("cumsum", "cumsum", normal(3, 4), grad=[0], axis=1)
case("logsumexp", "logsumexp", normal(3, 4), grad=[0], axis=-1)
case("var", "var", normal(3, 4), grad=[0], axis=1)
case("var-unbiased", "var", normal(3, 4), grad=[0], axis=0, correction=1)
case("softmax", "softmax", normal(3, 5), grad=[0])
case("log_softmax", "log_softmax", normal(3, 5), grad=[0], axis=0)

# -- shape ------------------------------------------------------------------------------------
case("reshape", "reshape", normal(2, 3, 4), (6, -1), grad=[0])
case("transpose", "transpose", normal(2, 3, 4), (2, 0, 1), grad=[0])
case("transpose-reverse", "transpose", normal(2, 3, 4), grad=[0])
case("expand_dims", "expand_dims", normal(2, 3), -1, grad=[0])
case("squeeze", "squeeze", normal(2, 1, 3, 1), grad=[0], axis=1)
case("broadcast_to", "broadcast_to", normal(3, 1), (2, 3, 4), grad=[0])
case(
    "concat",
    "concat",
    lambda rng: [rng.normal(size=(2, 3)), rng.normal(size=(2, 1)), rng.normal(size=(2, 2))],
    grad=[0],
    axis=1,
)
case("stack", "stack", lambda rng: [rng.normal(size=(2, 3)) for _ in range(3)], grad=[0], axis=1)
case("split-equal", "split", normal(2, 6), 3, grad=[0], axis=1)
case("split-sizes", "split", normal(6, 2), [1, 2, 3], grad=[0], axis=0)
case("slice", "slice", normal(5, 6), [1, 0], [4, 6], grad=[0], steps=[2, 3])
case("slice-negative-step", "slice", normal(5, 6), [4], [-6], grad=[0], axes=[1], steps=[-1])
case("slice-clamped-negative-ends", "slice", normal(5, 6), [-3, 2], [100, -1], grad=[0])
case("take-int", "take", normal(3, 4), 2, grad=[0], axis=1)
case("take-array", "take", normal(5, 4), lambda rng: np.array([[0, 4], [4, 1]]), grad=[0], axis=0)
case("take-negative", "take", normal(5, 4), lambda rng: np.array([-1, 0]), grad=[0], axis=0)
case("take_along_axis", "take_along_axis", normal(3, 5), ints(0, 5, 3, 2), grad=[0], axis=1)
case("take_along_axis-broadcast", "take_along_axis", normal(3, 4, 5), ints(0, 5, 1, 1, 3), grad=[0], axis=2)
case("pad-constant", "pad", normal(2, 3), [(1, 2), (0, 1)], grad=[0], value=0.5)
case("pad-reflect", "pad", normal(2, 5), [(0, 0), (2, 3)], grad=[0], mode="reflect")
case("pad-edge", "pad", normal(3, 2), [(2, 1), (1, 0)], grad=[0], mode="edge")
case("flip", "flip", normal(2, 3, 4), (0, 2), grad=[0])
case("tile", "tile", normal(2, 3), (2, 1, 3), grad=[0])
case("flatten", "flatten", normal(2, 3, 4, 5), grad=[0])

# -- arrays -----------------------------------------------------------------------------------
case("cast-to-int", "cast", lambda rng: np.array([-2.7, -0.5, 0.5, 2.7]), "int32")
case("cast-to-float16", "cast", normal(3, 4), "float16", dtype="float16")
case("cast-int-to-float", "cast", ints(-5, 5, 3), "float32")
case("one_hot", "one_hot", ints(0, 5, 6), 5)

# -- neural network -----------------------------------------------------------------------------
case("conv2d", "conv", normal(2, 3, 7, 6), normal(4, 3, 3, 3), normal(4), grad=[0, 1, 2])
case("conv2d-stride-pad", "conv", normal(2, 3, 8, 7), normal(4, 3, 3, 2), None, grad=[0, 1], stride=2, padding=1)
case("conv2d-dilated", "conv", normal(1, 2, 9, 9), normal(3, 2, 3, 3), grad=[0, 1], dilation=2)
case("conv2d-groups", "conv", normal(2, 4, 6, 6), normal(6, 2, 3, 3), normal(6), grad=[0, 1, 2], groups=2, padding=1)
case("conv2d-depthwise", "conv", normal(1, 3, 5, 5), normal(3, 1, 3, 3), grad=[0, 1], groups=3, padding=1)
case(
    "conv2d-depthwise-strided-dilated-multiplier",
    "conv",
    normal(2, 3, 9, 8),
    normal(6, 1, 3, 2),
    normal(6),
    grad=[0, 1, 2],
    groups=3,
    stride=2,
    dilation=(2, 1),
    padding=[(1, 2), (0, 1)],
)
case("conv2d-same", "conv", normal(1, 2, 7, 6), normal(3, 2, 3, 3), grad=[0, 1], stride=2, padding="same")
case("conv2d-valid", "conv", normal(1, 2, 7, 6), normal(3, 2, 2, 3), grad=[0, 1], padding="valid")
case("conv2d-asymmetric-pad", "conv", normal(1, 2, 5, 5), normal(3, 2, 3, 3), grad=[0, 1], padding=[(1, 0), (0, 2)])
case("conv1d", "conv", normal(2, 3, 11), normal(5, 3, 3), normal(5), grad=[0, 1, 2], stride=2, padding=1)
case("conv3d", "conv", normal(1, 2, 5, 4, 6), normal(3, 2, 2, 3, 2), grad=[0, 1], padding=1)
case("max_pool2d", "max_pool", normal(2, 3, 8, 8), grad=[0], window=2)
case("max_pool2d-stride-pad", "max_pool", normal(2, 3, 9, 8), grad=[0], window=3, stride=2, padding=1)
case("max_pool2d-ceil", "max_pool", normal(1, 2, 9, 9), grad=[0], window=2, ceil_mode=True)
case("max_pool2d-dilated", "max_pool", normal(1, 2, 9, 9), grad=[0], window=2, stride=1, dilation=2)
case(
    "max_pool2d-dilated-strided-padded",
    "max_pool",
    normal(2, 2, 12, 11),
    grad=[0],
    window=(3, 2),
    stride=2,
    dilation=(2, 3),
    padding=1,
)
case("max_pool1d", "max_pool", normal(2, 3, 10), grad=[0], window=3, stride=2)
case("avg_pool2d", "avg_pool", normal(2, 3, 8, 8), grad=[0], window=2)
case("avg_pool2d-pad-excluded", "avg_pool", normal(1, 2, 7, 7), grad=[0], window=3, stride=2, padding=1)
case(
    "avg_pool2d-pad-included",
    "avg_pool",
    normal(1, 2, 7, 7),
    grad=[0],
    window=3,
    stride=2,
    padding=1,
    count_include_pad=True,
)
case("avg_pool2d-ceil", "avg_pool", normal(1, 2, 9, 9), grad=[0], window=2, ceil_mode=True)
case("avg_pool2d-window-all-padding", "avg_pool", normal(1, 1, 3, 3), window=2, stride=1, padding=2)
case("avg_pool1d", "avg_pool", normal(2, 3, 10), grad=[0], window=3, stride=2)
case("linear", "linear", normal(4, 5), normal(5, 3), normal(3), grad=[0, 1, 2])
case("layer_norm", "layer_norm", normal(2, 3, 6), normal(6), normal(6), grad=[0, 1, 2])
case("layer_norm-two-axes", "layer_norm", normal(2, 3, 4), normal(3, 4), normal(3, 4), grad=[0, 1, 2], axis=-2)
case("batch_norm", "batch_norm", normal(4, 3, 5, 5), normal(3), normal(3), normal(3), positive(3), grad=[0, 1, 2])
case("batch_norm_train", "batch_norm_train", normal(4, 3, 5, 5), normal(3), normal(3), grad=[0, 1, 2])
case(
    "write_slots-one", "write_slots", normal(2, 3, 7, 4), normal(2, 3, 1, 4), lambda rng: np.array(5, np.int32), axis=2
)
case(
    "write_slots-several",
    "write_slots",
    normal(2, 3, 7, 4),
    normal(2, 3, 3, 4),
    lambda rng: np.array(2, np.int32),
    grad=[0, 1],
    axis=2,
)
case("write_slots-start-int", "write_slots", normal(5, 6), normal(2, 6), lambda rng: 3, grad=[0, 1], axis=0)
case("attention", "attention", normal(2, 2, 5, 4), normal(2, 2, 6, 4), normal(2, 2, 6, 3), grad=[0, 1, 2])
case(
    "attention-mask",
    "attention",
    normal(2, 2, 5, 4),
    normal(2, 2, 6, 4),
    normal(2, 2, 6, 3),
    lambda rng: np.concatenate([np.ones((2, 1, 1, 3), bool), rng.random((2, 1, 1, 3)) < 0.5], -1),
    grad=[0, 1, 2],
)
case(
    "attention-fully-masked-row",
    "attention",
    normal(1, 1, 2, 4),
    normal(1, 1, 3, 4),
    normal(1, 1, 3, 2),
    lambda rng: np.array([[[[True, False, True], [False, False, False]]]]),
    grad=[0, 1, 2],
)
case(
    "lstm_cell",
    "lstm_cell",
    normal(3, 4),
    normal(3, 5),
    normal(3, 5),
    normal(4, 20),
    normal(5, 20),
    normal(20),
    grad=[0, 1, 2, 3, 4, 5],
)
case(
    "lstm",
    "lstm",
    normal(2, 6, 4),
    normal(2, 5),
    normal(2, 5),
    normal(4, 20),
    normal(5, 20),
    normal(20),
    grad=[0, 1, 2, 3, 4, 5],
)
case(
    "gru_cell",
    "gru_cell",
    normal(3, 4),
    normal(3, 5),
    normal(4, 15),
    normal(5, 15),
    normal(15),
    normal(15),
    grad=[0, 1, 2, 3, 4, 5],
)
case(
    "gru",
    "gru",
    normal(2, 6, 4),
    normal(2, 5),
    normal(4, 15),
    normal(5, 15),
    normal(15),
    normal(15),
    grad=[0, 1, 2, 3, 4, 5],
)
case("cross_entropy", "cross_entropy", normal(6, 5), ints(0, 5, 6), grad=[0])
