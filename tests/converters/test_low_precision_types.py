"""ONNX's narrow types (float8, float4, int4, int2, e8m0), BitCast and unsigned arithmetic on
every backend, against ONNX's reference evaluator on small graphs."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX type tests need onnx (pip install onnx)")
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import xdevice
from tests.converters.graphs import onnx_model
from xdevice import UnsupportedOp
from xdevice.converters.importer import from_onnx

node, info = helper.make_node, helper.make_tensor_value_info

# values on both sides of each format's rounding ties, its largest value and its overflow
TRICKY = np.array(
    [0.0, -0.0, 0.25, 0.75, 1.25, -1.7, 2.5, 3.5, 5.0, 7.6, 8.0, -9.0, 15.5, 17.0, -100.3, 239.9, 241.0, 248.0]
    + [250.0, 449.0, 464.0, 470.0, 57344.0, 61000.0, 61440.0, 1e6, 2.0**-127, 3e-39, 1.5 * 2.0**-10, 1e-5]
    + [np.inf, -np.inf, np.nan],
    np.float32,
)
NARROW = {
    "int4": TensorProto.INT4,
    "uint4": TensorProto.UINT4,
    "int2": TensorProto.INT2,
    "uint2": TensorProto.UINT2,
    "float8_e4m3fn": TensorProto.FLOAT8E4M3FN,
    "float8_e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
    "float8_e5m2": TensorProto.FLOAT8E5M2,
    "float8_e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
    "float4_e2m1fn": TensorProto.FLOAT4E2M1,
    "float8_e8m0fnu": TensorProto.FLOAT8E8M0,
}
# TensorFlow has no kernels for these: its ops hold them as codes, one to a byte (a marked uint8 tensor)
TENSORFLOW_HOLDS = ("int2", "uint2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float4_e2m1fn", "float8_e8m0fnu")


def _model(nodes, inputs, outputs, opset=25):
    return onnx_model(nodes, inputs, outputs, opset=opset, ir=11)


def _run(backend, model, *inputs):
    imported = from_onnx(model, backend=backend.name, check=False)
    outputs = imported.apply(imported.params, *(backend.ops.asarray(x) for x in inputs))
    return [backend.ops.to_numpy(y) for y in outputs]


def _assert_same(got, want):
    """Same dtype and values; any NaN matches any NaN (their sign and payload bits may differ)."""
    assert got.dtype == want.dtype
    with np.errstate(invalid="ignore"):  # a signalling NaN's payload is no concern here
        got, want = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.nan_to_num(got), np.nan_to_num(want))


CASTS = [(to, 1, "up") for to in NARROW] + [
    ("float8_e4m3fn", 0, "up"),
    ("float8_e4m3fnuz", 0, "up"),
    ("float8_e5m2", 0, "up"),
    ("float8_e5m2fnuz", 0, "up"),
    ("float8_e8m0fnu", 0, "up"),
    ("float8_e8m0fnu", 1, "nearest"),
    ("float8_e8m0fnu", 0, "nearest"),
    ("float8_e8m0fnu", 1, "down"),
]


@pytest.mark.parametrize(("to", "saturate", "round_mode"), CASTS, ids=lambda v: str(v))
def test_cast_from_float_rounds_and_saturates_as_the_onnx_reference(backend, to, saturate, round_mode):
    cast = node("Cast", ["x"], ["y"], to=NARROW[to], saturate=saturate, round_mode=round_mode)
    model = _model([cast], [info("x", TensorProto.FLOAT, [len(TRICKY)])], [info("y", NARROW[to], None)])
    x = TRICKY
    if backend.name in ("jax", "tensorflow"):  # their CPU arithmetic flushes float32 subnormals to zero
        x = np.where(np.abs(x) < 2.0**-126, np.float32(0), x)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run(backend, model, x)
    _assert_same(got, want)


@pytest.mark.parametrize("source", list(NARROW))
def test_cast_from_a_narrow_type_gives_its_values(backend, source):
    x = TRICKY.astype(helper.tensor_dtype_to_np_dtype(NARROW[source]))
    cast = node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)
    model = _model([cast], [info("x", NARROW[source], [len(x)])], [info("y", TensorProto.FLOAT, None)])
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run(backend, model, x)
    _assert_same(got, want)


def test_cast_between_integers_keeps_the_low_bits_of_int4(backend):
    x = np.array([7, 8, 9, 17, -9, 300, -129], np.int32)
    model = _model(
        [node("Cast", ["x"], ["y"], to=TensorProto.INT4)],
        [info("x", TensorProto.INT32, [len(x)])],
        [info("y", TensorProto.INT4, None)],
    )
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run(backend, model, x)
    _assert_same(got, want)


BITCASTS = [
    (np.array([1.0, -2.5, np.inf], np.float32), TensorProto.INT32),
    (np.array([[1065353216, -1]], np.int32), TensorProto.FLOAT),
    (np.array([True, False]), TensorProto.UINT8),
    (np.array([65535, 1], np.uint16), TensorProto.INT16),
    (np.array([-1.0], np.float64), TensorProto.INT64),
]


@pytest.mark.parametrize(("x", "to"), BITCASTS, ids=lambda v: str(getattr(v, "dtype", v)))
def test_bitcast_reads_the_same_bits_as_another_type(backend, x, to):
    model = _model(
        [node("BitCast", ["x"], ["y"], to=to)],
        [info("x", helper.np_dtype_to_tensor_dtype(x.dtype), list(x.shape))],
        [info("y", to, None)],
        opset=26,
    )
    if backend.name == "jax" and x.dtype.itemsize == 8 and backend.ops.asarray(x).dtype.itemsize != 8:
        pytest.skip("JAX without x64 holds 64-bit values in 32 bits")
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = _run(backend, model, x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


UNSIGNED_OPS = [
    ("Add", {}),
    ("Sub", {}),
    ("Mul", {}),
    ("Div", {}),
    ("Mod", {}),
    ("Max", {}),
    ("Min", {}),
    ("Less", {}),
    ("LessOrEqual", {}),
    ("Greater", {}),
    ("GreaterOrEqual", {}),
    ("BitShift", {"direction": "RIGHT"}),
    ("BitShift", {"direction": "LEFT"}),
]


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.uint64])
@pytest.mark.parametrize(
    ("op", "attrs"), UNSIGNED_OPS, ids=lambda v: str(v.get("direction", "")) if isinstance(v, dict) else v
)
def test_unsigned_arithmetic_wraps_and_orders_as_unsigned(backend, op, attrs, dtype):
    top = np.iinfo(dtype).max
    a = np.array([top, top // 2 + 7, 5, 1000, 3], dtype)
    b = np.array([3, top // 2 + 1, 7, top, 1], dtype)
    if op == "BitShift":
        b = np.array([1, 3, 0, 9, np.iinfo(dtype).bits - 1], dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    out = TensorProto.BOOL if op in ("Less", "LessOrEqual", "Greater", "GreaterOrEqual") else elem
    model = _model(
        [node(op, ["a", "b"], ["y"], **attrs)],
        [info("a", elem, [5]), info("b", elem, [5])],
        [info("y", out, None)],
    )
    (want,) = ReferenceEvaluator(model).run(None, {"a": a, "b": b})
    (got,) = _run(backend, model, a, b)
    if backend.name == "jax" and dtype is np.uint64 and got.dtype == np.uint32:
        pytest.skip("JAX without x64 holds uint64 as uint32")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", TENSORFLOW_HOLDS)
def test_tensorflow_holds_the_formats_it_has_no_kernels_for_as_codes(name):
    """TensorFlow's ops keep such a value as its ml_dtypes byte, report the format's name, survive
    a reshape, and hand the same ml_dtypes array back."""
    pytest.importorskip("tensorflow")
    ops = xdevice.backend("tensorflow").ops
    x = TRICKY.astype(helper.tensor_dtype_to_np_dtype(NARROW[name])).reshape(3, -1)
    held = ops.reshape(ops.asarray(x), (-1,))
    assert ops.dtype(held) == name
    back = ops.to_numpy(held)
    assert back.dtype == x.dtype
    np.testing.assert_array_equal(back.view(np.uint8), x.reshape(-1).view(np.uint8))
    _assert_same(ops.to_numpy(ops.cast(held, "float32")), x.reshape(-1).astype(np.float32))


def test_tensorflow_refuses_a_bitcast_narrower_than_a_byte():
    pytest.importorskip("tensorflow")
    ops = xdevice.backend("tensorflow").ops
    with pytest.raises(UnsupportedOp, match="narrower than a byte"):
        ops.bitcast(ops.asarray(np.array([1, 2], np.uint8)), "int2")
