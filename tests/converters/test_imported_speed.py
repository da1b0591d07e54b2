"""What makes an imported model cheap per call: a captured torch graph without steps that
compute nothing, and a repeated call that skips the checks it already passed."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper

import xdevice
from xdevice.converters.importer import from_onnx


def _model():
    """y = reshape(expand(relu(x @ w.T + b) * c, shape), shape) with w, b weights, c a Constant:
    the reshape and expand change nothing, and c is a tensor made while tracing."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Gemm", ["x", "w", "b"], ["z"], transB=1),
        helper.make_node("Relu", ["z"], ["r"]),
        helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.array([1, 2, 3, 4], np.float32), "c")),
        helper.make_node("Mul", ["r", "c"], ["m"]),
        helper.make_node("Shape", ["m"], ["s"]),
        helper.make_node("Expand", ["m", "s"], ["e"]),
        helper.make_node("Reshape", ["e", "s"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    graph = helper.make_graph(nodes, "g", [x], [y], [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def _expected(x):
    rng = np.random.default_rng(0)
    w, b = rng.normal(size=(4, 3)).astype(np.float32), rng.normal(size=(4,)).astype(np.float32)
    return np.maximum(x @ w.T + b, 0) * np.array([1, 2, 3, 4], np.float32)


def test_the_captured_torch_graph_holds_no_step_that_computes_nothing():
    pytest.importorskip("torch")
    import torch

    from xdevice.backends.torch.autodiff import simplify

    imported = from_onnx(_model(), backend="torch")
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32))
    program = imported.traced(x)
    code = program.code
    assert "lift_fresh_copy" not in code  # the constant is read, not copied on every call
    assert "expand" not in code and "view" not in code  # shape ops to the shape it already has
    assert "aten.addmm." in code and "aten.mm." not in code and "aten.add." not in code  # the Gemm: one kernel
    assert simplify(program) == 0  # nothing left to drop
    np.testing.assert_allclose(program(imported.params, x)[0].numpy(), _expected(x.numpy()), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(imported(x).detach().numpy(), _expected(x.numpy()), rtol=1e-5, atol=1e-6)


def test_a_constant_written_in_place_keeps_its_own_copy():
    torch = pytest.importorskip("torch")
    from torch.fx.experimental.proxy_tensor import make_fx

    from xdevice.backends.torch.autodiff import simplify

    def fn(x):
        c = torch.tensor([1.0, 2.0])
        c.add_(x)  # writes into the copy lift_fresh_copy made: the constant itself must stay
        return c * 2

    program = make_fx(fn)(torch.zeros(2))
    simplify(program)
    assert "lift_fresh_copy" in program.code
    first = program(torch.ones(2))
    assert torch.equal(program(torch.ones(2)), first) and torch.equal(first, torch.tensor([4.0, 6.0]))


def test_a_repeated_call_gives_the_same_outputs_and_still_checks_new_inputs(backend):
    imported = from_onnx(_model(), backend=backend.name)
    x = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    xin = backend.ops.asarray(x)
    first, second = (backend.ops.to_numpy(imported(xin)) for _ in range(2))
    np.testing.assert_allclose(first, _expected(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(first, second)
    name = "b"
    imported.params[name] = backend.ops.asarray(np.zeros(4, np.float32))  # weights are read on every call
    np.testing.assert_allclose(
        backend.ops.to_numpy(imported(xin)),
        np.maximum(x @ np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32).T, 0) * [1, 2, 3, 4],
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises(xdevice.InputError):
        imported(backend.ops.asarray(np.zeros((2, 5), np.float32)))
