"""Every op of every backend against the numpy float64 reference: values and gradients.

Cases live in op_cases.py as data; each runs once per backend (``test_x[torch-conv2d]``).
Gradients come from each framework's own autodiff and are compared with the numpy tape,
which test_numpy_autodiff.py checks against finite differences.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import xdevice
from xdevice._tolerance import compare
from xdevice.backends.opset import Ops

from .op_cases import CASES

REFERENCE = xdevice.backend("numpy")


def to_backend(ops, value, dtype="float32"):
    """A case input for the backend under test: float arrays in ``dtype``, others as is."""
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return [to_backend(ops, v, dtype) for v in value]
    if isinstance(value, np.ndarray):
        return ops.asarray(value.astype(dtype) if value.dtype.kind == "f" else value)
    return value


def outputs(result) -> list:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def differentiable(args, positions) -> dict:
    """The inputs to differentiate as a flat dict (a list input gives one entry per item)."""
    params = {}
    for i in positions:
        if isinstance(args[i], list):
            params.update({f"{i}.{j}": item for j, item in enumerate(args[i])})
        else:
            params[str(i)] = args[i]
    return params


def substitute(args, params) -> list:
    """``args`` with the differentiated entries taken from ``params``."""
    given = []
    for i, arg in enumerate(args):
        if isinstance(arg, list):
            given.append([params.get(f"{i}.{j}", item) for j, item in enumerate(arg)])
        else:
            given.append(params.get(str(i), arg))
    return given


def run(backend, case, inputs, dtype):
    ops = backend.ops
    return outputs(getattr(ops, case.op)(*[to_backend(ops, v, dtype) for v in inputs], **case.kwargs))


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_op_matches_the_numpy_reference(backend, case):
    inputs = case.inputs(np.random.default_rng(0))
    expected = run(REFERENCE, case, inputs, "float64")
    actual = run(backend, case, inputs, "float32")
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = backend.ops.to_numpy(a)
        if np.asarray(e).dtype.kind in "iu":  # index types vary (int32 vs int64); values must not
            assert np.asarray(a).dtype.kind in "iu", f"output {i}: {a.dtype}"
        result = compare(a, e, case.dtype)
        assert result.ok, f"{backend.name} {case.id} output {i}: {result.describe()}"


GRAD_CASES = [c for c in CASES if c.grad]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_op_gradient_matches_the_numpy_reference(backend, case):
    inputs = case.inputs(np.random.default_rng(0))
    cotangents = [
        np.random.default_rng(1 + i).normal(size=np.shape(e))
        for i, e in enumerate(run(REFERENCE, case, inputs, "float64"))
    ]

    def gradients(target, dtype):
        ops = target.ops
        args = [to_backend(ops, v, dtype) for v in inputs]
        params = differentiable(args, case.grad)

        def loss(params):
            given = substitute(args, params)
            total = 0.0
            for out, cot in zip(outputs(getattr(ops, case.op)(*given, **case.kwargs)), cotangents):
                total = ops.add(total, ops.sum(ops.multiply(out, ops.asarray(cot.astype(dtype)))))
            return total

        return target.value_and_grad(loss, params)[1]

    expected = gradients(REFERENCE, "float64")
    actual = gradients(backend, "float32")
    assert set(actual) == set(expected)
    for key in expected:
        result = compare(backend.ops.to_numpy(actual[key]), expected[key])
        assert result.ok, f"{backend.name} {case.id} gradient of input {key}: {result.describe()}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "bool"])
def test_arrays_round_trip_their_dtype(backend, dtype):
    x = backend.ops.cast(backend.ops.asarray(np.array([0, 1, 1, 0])), dtype)
    assert backend.ops.dtype(x) == dtype and backend.ops.shape(x) == (4,)


def test_creation_ops_make_the_asked_shape_dtype_and_values(backend):
    ops = backend.ops
    assert ops.to_numpy(ops.zeros((2, 3), "float32")).tolist() == [[0.0] * 3] * 2
    assert ops.to_numpy(ops.ones((2,), "int32")).tolist() == [1, 1]
    assert ops.to_numpy(ops.full((2,), 0.5)).tolist() == [0.5, 0.5]
    assert ops.to_numpy(ops.arange(2, 11, 3)).tolist() == [2, 5, 8]
    assert ops.dtype(ops.arange(4, dtype="float32")) == "float32"


def test_random_bits_are_the_same_on_every_backend(backend):
    ops = backend.ops
    key = ops.random_key(1234)
    bits = ops.to_numpy(ops.random_bits(key, (3, 5))).astype(np.uint64)
    reference = REFERENCE.ops.to_numpy(REFERENCE.ops.random_bits(REFERENCE.ops.random_key(1234), (3, 5)))
    assert bits.tolist() == reference.astype(np.uint64).tolist()
    assert len(set(bits.ravel().tolist())) == 15  # distinct words


def test_uniform_normal_and_dropout_match_the_reference(backend):
    ops, ref = backend.ops, REFERENCE.ops
    for name, kwargs in [("uniform", {}), ("normal", {})]:
        got = ops.to_numpy(getattr(ops, name)(ops.random_key(7), (4, 6), **kwargs))
        want = ref.to_numpy(getattr(ref, name)(ref.random_key(7), (4, 6), **kwargs))
        assert compare(got, want).ok, name
    x = np.ones((50, 40))
    dropped = ops.to_numpy(ops.dropout(ops.random_key(3), ops.asarray(x.astype("float32")), 0.25))
    kept = dropped[dropped != 0]
    assert np.allclose(kept, 1 / 0.75) and 0.2 < (dropped == 0).mean() < 0.3
    assert compare(dropped, ref.to_numpy(ref.dropout(ref.random_key(3), x, 0.25))).ok


def test_split_keys_differ_from_each_other_and_their_parent(backend):
    ops = backend.ops
    key = ops.random_key(0)
    words = [tuple(ops.to_numpy(k).tolist()) for k in [key, *ops.split_key(key, 3)]]
    assert len(set(words)) == 4


def test_the_ops_class_implements_the_whole_op_set(backend):
    assert isinstance(backend.ops, Ops)
    assert not type(backend.ops).__abstractmethods__


@pytest.mark.parametrize("method", sorted(Ops.__abstractmethods__))
def test_each_op_has_the_contract_signature(backend, method):
    expected = inspect.signature(getattr(Ops, method))
    actual = inspect.signature(getattr(type(backend.ops), method))
    assert [(p.name, p.kind, p.default) for p in actual.parameters.values()] == [
        (p.name, p.kind, p.default) for p in expected.parameters.values()
    ]


def test_a_wide_dilated_max_pool_runs_as_one_window_reduction(backend):
    """A 60x80 window with dilation 10 (4,800 taps): once a slice per tap on JAX, for minutes."""
    x = np.random.default_rng(0).normal(size=(1, 2, 640, 840)).astype(np.float32)
    settings = dict(window=(60, 80), stride=5, dilation=10)
    expected = REFERENCE.ops.max_pool(x, **settings)
    got = backend.ops.to_numpy(backend.ops.max_pool(backend.ops.asarray(x), **settings))
    assert got.shape == expected.shape == (1, 2, 10, 10)
    np.testing.assert_array_equal(got, expected)
