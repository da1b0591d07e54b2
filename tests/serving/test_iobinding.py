"""IO binding in place: when a framework array is bound by its pointer, and that the binding is right.

The GPU path itself runs in tests/gpu; here the decision is checked with made-up devices,
and the binding (pointer, dtype, shape, a dense layout) on the CPU, where ORT binds the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402 - below the importorskip guard

from xdevice import Device  # noqa: E402 - below the importorskip guard
from xdevice.serving.iobinding import bind_in_place, binds_in_place, ort_device  # noqa: E402 - below the importorskip guard

GPU0, GPU1, HOST = Device("gpu", 0), Device("gpu", 1), Device("cpu", 0)


@pytest.mark.parametrize(
    ("array_device", "session_device", "dtype", "bound"),
    [
        (GPU0, GPU0, "float32", True),
        (GPU0, GPU0, "int64", True),
        (GPU0, GPU0, "float16", True),
        (GPU1, GPU0, "float32", False),  # another GPU: through the host
        (HOST, GPU0, "float32", False),  # a host array for a GPU session: ORT copies it in
        (None, GPU0, "float32", False),  # numpy, no framework device
        (GPU0, GPU0, "bool", False),  # frameworks and ORT disagree on bool across DLPack
        (GPU0, GPU0, "string", False),
        (HOST, HOST, "float32", False),  # a CPU session reads host memory anyway
    ],
)
def test_only_arrays_on_the_sessions_gpu_are_bound_by_pointer(array_device, session_device, dtype, bound):
    assert binds_in_place(array_device, session_device, dtype) is bound


def test_ort_names_a_gpu_cuda_with_its_index():
    assert ort_device(GPU1) == ("cuda", 1)
    assert ort_device(HOST) == ("cpu", 0)


@pytest.fixture(scope="module")
def scale_add():
    """y = 2 * x + b over x: float32[N, 3]."""
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "two"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "scale_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [
            helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("b", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _run(session, value):
    binding = session.io_binding()
    held = bind_in_place(binding, "x", value, HOST, "float32")
    binding.synchronize_inputs()
    binding.bind_output("y", "cpu", 0)
    session.run_with_iobinding(binding)
    del held
    return binding.copy_outputs_to_cpu()[0]


def test_a_framework_array_bound_by_pointer_gives_the_models_answer(backend, scale_add):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    with backend.default_device(HOST):
        value = backend.from_dlpack(x.copy())
    np.testing.assert_array_equal(_run(scale_add, value), 2 * x + [1.0, 2.0, 3.0])


def test_a_strided_view_is_made_dense_before_its_pointer_is_bound(scale_add):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    view = x.T  # [2, 3], column-major: ORT reads no strides
    np.testing.assert_array_equal(_run(scale_add, view), 2 * view + [1.0, 2.0, 3.0])
