"""Small ONNX graphs built here for the serving tests, and a repository writer."""

from __future__ import annotations

import threading

import numpy as np

W = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
B = np.arange(3, dtype=np.float32)


def onnx_model(nodes, inputs, outputs, initializers=()):
    from onnx import helper

    graph = helper.make_graph(nodes, "m", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


def dense_model():
    """y = relu(x @ W + B), total = sum(x, axis=1): two outputs, batch axis free."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["xw"]),
        helper.make_node("Add", ["xw", "B"], ["z"]),
        helper.make_node("Relu", ["z"], ["y"]),
        helper.make_node("ReduceSum", ["x", "axes"], ["total"], keepdims=0),
    ]
    return onnx_model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("total", TensorProto.FLOAT, ["batch"]),
        ],
        [
            numpy_helper.from_array(W, "W"),
            numpy_helper.from_array(B, "B"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )


def strings_model():
    from onnx import TensorProto, helper

    return onnx_model(
        [helper.make_node("Identity", ["s"], ["out"])],
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("out", TensorProto.STRING, ["n"])],
    )


def pair_model():
    """Two inputs of two types, two outputs: sum = a + b (float), count = n * 2 (int64)."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["n", "two"], ["count"])]
    return onnx_model(
        nodes,
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("n", TensorProto.INT64, ["batch"]),
        ],
        [
            helper.make_tensor_value_info("sum", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("count", TensorProto.INT64, ["batch"]),
        ],
        [numpy_helper.from_array(np.array(2, np.int64), "two")],
    )


def reference(x):
    return np.maximum(x @ W + B, 0), x.sum(axis=1)


BATCHED = """max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 50000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_model(root, name, model, versions=(1, 2), config=None):
    for version in versions:
        (root / name / str(version)).mkdir(parents=True)
        (root / name / str(version) / "model.onnx").write_bytes(
            model if isinstance(model, bytes) else model.SerializeToString()
        )
    if config is not None:
        (root / name / "config.pbtxt").write_text(config)


def record_threads(owner) -> list[str]:
    """Make ``owner.run`` (a loaded model's or a batcher's) record the name of the thread each
    call runs on, in the list returned, and run as before."""
    ran_on, run = [], owner.run

    def recording(inputs):
        ran_on.append(threading.current_thread().name)
        return run(inputs)

    owner.run = recording
    return ran_on
