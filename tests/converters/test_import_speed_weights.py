"""Nodes that compute on the weights alone run once, not in every call: an imported model's
call hands their results to the captured program, and runs them again only when a weight
they read changes (replaced, or written in place)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper

from xdevice.converters.importer import from_onnx

_RNG = np.random.default_rng(0)
_W = _RNG.normal(size=(6, 3)).astype(np.float32)
_B = _RNG.normal(size=(4,)).astype(np.float32)


def _model():
    """y = x @ transpose(concat(w[2:6], w[0:2]))[:, :4] + b: the Slice/Concat/Transpose/Slice
    chain reads the weight w and constants only (an exporter's gate reordering looks like
    this); the MatMul and Add read the input."""
    ints = {
        name: numpy_helper.from_array(np.array(v, np.int64), name)
        for name, v in {"s0": [0], "s2": [2], "s4": [4], "s6": [6], "ax0": [0], "ax1": [1]}.items()
    }
    nodes = [
        helper.make_node("Slice", ["w", "s2", "s6", "ax0"], ["low"]),
        helper.make_node("Slice", ["w", "s0", "s2", "ax0"], ["high"]),
        helper.make_node("Concat", ["low", "high"], ["reordered"], axis=0),
        helper.make_node("Transpose", ["reordered"], ["wt"], perm=[1, 0]),
        helper.make_node("Slice", ["wt", "s0", "s4", "ax1"], ["kept"]),
        helper.make_node("MatMul", ["x", "kept"], ["z"]),
        helper.make_node("Add", ["z", "b"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    weights = [numpy_helper.from_array(_W, "w"), numpy_helper.from_array(_B, "b")]
    graph = helper.make_graph(nodes, "g", [x], [y], [*weights, *ints.values()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def _expected(x, w=_W, b=_B):
    return x @ np.concatenate([w[2:6], w[0:2]]).T[:, :4] + b


def test_the_weight_only_chain_is_found_and_the_rest_is_not():
    imported = from_onnx(_model(), backend="numpy")
    assert [imported.graph.nodes[i].op for i in imported._prepare] == ["Slice", "Slice", "Concat", "Transpose", "Slice"]


def test_the_captured_torch_call_holds_none_of_the_weight_only_ops():
    torch = pytest.importorskip("torch")
    imported = from_onnx(_model(), backend="torch")
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32))
    got = imported(x)
    served = next(iter(imported._known.values()))  # the program a call runs
    assert "cat" not in served.code and "slice" not in served.code
    assert "cat" in imported.traced(x).code  # apply (what training differentiates) keeps them
    np.testing.assert_allclose(got.numpy(), _expected(x.numpy()), rtol=1e-5, atol=1e-5)


def test_calls_follow_a_replaced_weight_on_every_backend(backend):
    imported = from_onnx(_model(), backend=backend.name)
    x = np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32)
    xin = backend.ops.asarray(x)
    for _ in range(2):
        np.testing.assert_allclose(backend.ops.to_numpy(imported(xin)), _expected(x), rtol=1e-5, atol=1e-5)
    w = _W * 3 - 1
    imported.params["w"] = backend.ops.asarray(w)
    np.testing.assert_allclose(backend.ops.to_numpy(imported(xin)), _expected(x, w=w), rtol=1e-5, atol=1e-5)


def test_a_torch_weight_written_in_place_is_seen_by_the_next_call():
    torch = pytest.importorskip("torch")
    imported = from_onnx(_model(), backend="torch")
    x = torch.as_tensor(np.random.default_rng(1).normal(size=(2, 3)).astype(np.float32))
    imported(x)
    with torch.no_grad():
        imported.params["w"].mul_(2.0)  # what an optimizer's step does
    np.testing.assert_allclose(imported(x).numpy(), _expected(x.numpy(), w=_W * 2), rtol=1e-5, atol=1e-5)
