"""A recurrent layer's weight preparation (ONNX's gate order put in the op set's, the biases
summed) runs once per state of the weights, not in every call, and a Gather with constant
indices puts them in range once: the calls give what the layer computes, and follow a weight
that changes."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper

from xdevice.converters.importer import from_onnx

_STEPS, _BATCH, _IN, _HIDDEN, _DIRS = 5, 2, 3, 4, 2


def _recurrent(op: str, gates: int, lengths: bool = False, **attrs):
    """A bidirectional ``op`` node reading its W, R and B from initializers (the weights),
    and ``sequence_lens`` from an input where ``lengths``."""
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.normal(size=(_DIRS, gates * _HIDDEN, _IN)),
        "R": rng.normal(size=(_DIRS, gates * _HIDDEN, _HIDDEN)),
        "B": rng.normal(size=(_DIRS, 2 * gates * _HIDDEN)),
    }
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [_STEPS, _BATCH, _IN])]
    if lengths:
        inputs.append(helper.make_tensor_value_info("lengths", TensorProto.INT32, [_BATCH]))
    node = helper.make_node(
        op, ["x", "W", "R", "B", "lengths" if lengths else ""], ["y", "y_h"], direction="bidirectional", **attrs
    )
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [_STEPS, _DIRS, _BATCH, _HIDDEN]),
        helper.make_tensor_value_info("y_h", TensorProto.FLOAT, [_DIRS, _BATCH, _HIDDEN]),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.float32) * 0.5, name) for name, v in weights.items()]
    graph = helper.make_graph([node], "g", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    model.ir_version = 8
    return model


_LSTM = {"op": "LSTM", "gates": 4}
_GRU = {"op": "GRU", "gates": 3, "linear_before_reset": 1}


def _x(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(_STEPS, _BATCH, _IN)).astype(np.float32)


def _reference(model, *inputs) -> list[np.ndarray]:
    """What the numpy backend computes: every step in the handler, no preparation."""
    return [np.asarray(y) for y in from_onnx(model, backend="numpy")(*inputs)]


@pytest.mark.parametrize("layer", [_LSTM, _GRU], ids=["LSTM", "GRU"])
def test_the_captured_torch_call_prepares_no_weights_and_gives_what_the_handler_computes(layer):
    torch = pytest.importorskip("torch")
    imported = from_onnx(_recurrent(**layer), backend="torch")
    x = torch.as_tensor(_x())
    got = imported(x)
    served = next(iter(imported._known.values()))  # the program a call runs
    # the gates were reordered once (split and concatenated), before the call
    # (a call's program names its common ops by torch's bindings, torch.cat, not aten's overloads)
    assert not any(op in served.code for op in ("aten.cat.default", "torch.cat(", "aten.split", "torch.split"))
    assert "aten.cat.default" in imported.traced(x).code  # apply (what training differentiates) does it itself
    for prepared, step_by_step in zip(got, imported.apply(imported.params, x)):
        np.testing.assert_array_equal(prepared.numpy(), step_by_step.numpy())


@pytest.mark.parametrize("layer", [_LSTM, _GRU], ids=["LSTM", "GRU"])
def test_calls_follow_a_replaced_recurrent_weight_on_every_backend(backend, layer):
    model = _recurrent(**layer)
    imported = from_onnx(model, backend=backend.name)
    x = _x()
    xin = backend.ops.asarray(x)
    for _ in range(2):
        imported(xin)
    changed = numpy_helper.to_array(model.graph.initializer[1]) * -2.0  # R
    imported.params["R"] = backend.ops.asarray(changed)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(changed, "R"))
    for got, expected in zip(imported(xin), _reference(model, x)):
        np.testing.assert_allclose(backend.ops.to_numpy(got), expected, rtol=1e-4, atol=1e-5)


def test_a_torch_recurrent_bias_written_in_place_is_seen_by_the_next_call():
    torch = pytest.importorskip("torch")
    model = _recurrent(**_LSTM)
    imported = from_onnx(model, backend="torch")
    x = torch.as_tensor(_x())
    before = imported(x)[0].clone()
    with torch.no_grad():
        imported.params["B"].add_(1.0)  # what an optimizer's step does
    after = imported(x)[0]
    model.graph.initializer[2].CopyFrom(numpy_helper.from_array(imported.params["B"].numpy(), "B"))
    np.testing.assert_allclose(after.numpy(), _reference(model, x.numpy())[0], rtol=1e-4, atol=1e-5)
    assert not np.allclose(after.numpy(), before.numpy())


def test_a_layer_with_sequence_lengths_steps_through_time_unprepared():
    torch = pytest.importorskip("torch")
    model = _recurrent(**_LSTM, lengths=True)
    imported = from_onnx(model, backend="torch")
    x, lengths = _x(), np.array([5, 3], np.int32)
    got = imported(torch.as_tensor(x), torch.as_tensor(lengths))
    assert imported._prepared_inputs == {}  # the fused layer's preparation does not apply
    for g, expected in zip(got, _reference(model, x, lengths)):
        np.testing.assert_allclose(g.numpy(), expected, rtol=1e-4, atol=1e-5)


def _gather(index: int):
    """``y = x[..., index, :]`` with ``index`` an initializer (a constant), on axis 1."""
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=1)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([node], "g", [x], [y], [numpy_helper.from_array(np.array(index, np.int64), "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("index", [3, -2])
def test_a_gather_of_a_constant_index_picks_that_row_on_every_backend(backend, index):
    x = np.arange(30, dtype=np.float32).reshape(2, 5, 3)
    got = from_onnx(_gather(index), backend=backend.name)(backend.ops.asarray(x))
    np.testing.assert_array_equal(backend.ops.to_numpy(got), x[:, index, :])


def test_a_captured_gather_of_a_constant_index_checks_no_sign_in_the_call():
    torch = pytest.importorskip("torch")
    imported = from_onnx(_gather(-2), backend="torch")
    imported(torch.zeros(2, 5, 3))
    served = next(iter(imported._known.values()))
    assert "where" not in served.code and "index_select" not in served.code
