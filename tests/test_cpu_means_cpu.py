"""Code that means a device says so: JAX and TensorFlow compute on GPU 0 when there is one
(TensorFlow even on CPU tensors), so an imported model, parity and export verification enter
the framework's scope for the device they mean (DESIGN.md, "Say the device, every time").

Tested on the CPU: the tests run with 4 virtual CPU devices (pyproject.toml), and ``cpu:1``
made the framework's default stands in for "the default is a GPU". PyTorch and numpy have
one CPU device, so there is nothing to stand in with on them.
"""

from __future__ import annotations

import numpy as np
import pytest

import xdevice
from xdevice import Device
from xdevice.converters import export, from_onnx
from xdevice.testing import assert_parity

CPU0, CPU1 = Device("cpu", 0), Device("cpu", 1)


@pytest.fixture
def virtual(backend):
    """A backend whose framework splits the CPU into several devices (JAX, TensorFlow)."""
    if not backend.supports_virtual_devices:
        pytest.skip(f"{backend.name} has one CPU device: no other default to stand in for a GPU")
    return backend


def _matmul_and_shape():
    """An ONNX model with a weight, ``y = x @ w``, and a value the graph computes from no
    tensor at all, ``shape = Shape(x)`` (a new array, made wherever the default device is)."""
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(3, 4), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Shape", ["x"], ["shape"])],
        "matmul_and_shape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10  # what the ONNX Runtime here reads
    return model


def test_an_imported_model_meant_for_cpu_0_computes_there_whatever_the_default(virtual):
    model = from_onnx(_matmul_and_shape(), backend=virtual.name, device="cpu:0")
    x = np.ones((2, 3), np.float32)
    with virtual.default_device(CPU1):
        called = model(x)
        interpreted = model.apply(model.params, x)
    assert [virtual.device_of(y) for y in (*called, *interpreted)] == [CPU0] * 4
    np.testing.assert_array_equal(virtual.to_numpy(called[0]), x @ np.arange(12, dtype=np.float32).reshape(3, 4))


def test_an_imported_model_meant_for_cpu_1_computes_there(virtual):
    model = from_onnx(_matmul_and_shape(), backend=virtual.name, device="cpu:1")
    y, shape = model(np.ones((2, 3), np.float32))
    assert virtual.device_of(y) == virtual.device_of(shape) == Device("cpu", 1)


def test_assert_parity_computes_on_cpu_0_whatever_the_default(virtual):
    where = []

    def product(ops, x):
        y = ops.matmul(x, x)
        if ops is virtual.ops:
            where.append(virtual.device_of(y))
        return y

    with virtual.default_device(CPU1):
        assert_parity(product, [np.eye(3)], backends=[virtual.name])
    assert where == [CPU0]


def test_parity_runs_every_tensorflow_op_on_cpu_0_whatever_the_default():
    pytest.importorskip("tensorflow")
    tensorflow = xdevice.backend("tensorflow")
    # TensorFlow's op callbacks see each eagerly run op and its outputs: the one way to see
    # where parity's forward and backward passes ran (it hands back only numpy)
    from tensorflow.python.framework import op_callbacks

    ran: set[str] = set()

    def record(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        ran.update(str(xdevice.device_of(y)) for y in outputs or () if getattr(y, "device", ""))

    op_callbacks.add_op_callback(record)
    try:
        with tensorflow.default_device(CPU1):
            report = xdevice.parity("mlp", backends=["tensorflow"])
    finally:
        op_callbacks.remove_op_callback(record)
    assert report.ok and ran == {"cpu:0"}


def test_the_reference_of_a_model_without_weights_is_computed_on_cpu_0(virtual):
    where = []

    def double(x):
        where.append(virtual.device_of(virtual.zeros((1,))))
        return x * 2

    with virtual.default_device(CPU1):
        (y,) = virtual.native_outputs(double, (np.ones((2, 3), np.float32),))
    assert where == [CPU0] and y.tolist() == [[2.0] * 3] * 2
    assert virtual.reference_device(double) == CPU0


def test_a_jax_reference_is_computed_where_the_params_live():
    pytest.importorskip("jax")
    jax = xdevice.backend("jax")
    params = {"w": xdevice.to_device(jax.ops.asarray(np.eye(3, dtype=np.float32)), "cpu:1")}
    where = []

    def apply(params, x):
        y = x @ params["w"] + jax.zeros((3,))  # a new array too: made where the params are
        where.append(jax.device_of(y))
        return y

    (y,) = jax.native_outputs((apply, params), (np.ones((2, 3), np.float32),))
    assert jax.reference_device((apply, params)) == CPU1 and where == [CPU1]
    assert y.tolist() == [[1.0] * 3] * 2


def test_a_tensorflow_reference_is_computed_where_the_variables_live():
    tf = pytest.importorskip("tensorflow")
    backend = xdevice.backend("tensorflow")
    where = []

    class Linear(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(np.eye(3, dtype=np.float32))

        def __call__(self, x):
            y = tf.matmul(x, self.w)  # TensorFlow would run it on the default device
            where.append(xdevice.device_of(y))
            return y

    with backend.default_device(CPU1):
        linear = Linear()
    (y,) = backend.native_outputs(linear, (np.ones((2, 3), np.float32),))
    assert backend.reference_device(linear) == CPU1 and where == [CPU1]
    assert y.tolist() == [[1.0] * 3] * 2


def test_an_imported_model_is_verified_on_its_own_device(virtual):
    model = from_onnx(_matmul_and_shape(), backend=virtual.name, device="cpu:1")
    result = export(model, example_inputs=np.ones((2, 3), np.float32), dynamic_batch=False)
    assert {check.device for check in result.verification} == {"cpu:1"}


def test_a_tensorflow_zoo_module_keeps_its_variables_on_the_models_device():
    """``to_native`` of a TensorFlow zoo model on cpu:1 makes its variables there, not on
    TensorFlow's default device (GPU 0 wherever there is one; cpu:0 here)."""
    pytest.importorskip("tensorflow")
    from xdevice import models

    model = models.build("mlp", backend="tensorflow", device="cpu:1", inputs=4, hidden=[3])
    module = models.to_native(model)
    assert {xdevice.device_of(variable) for variable in module.weights.values()} == {CPU1}
