"""An imported graph is planned once (handlers bound, chains fused, shape arithmetic kept per
input signature) and captured as the framework's own program: none of it changes an answer."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import compare, models
from xdevice.converters import export
from xdevice.converters.importer import from_onnx
from xdevice.converters.importer.interpreter import Context, Graph, run_graph


@pytest.fixture(scope="module")
def transformer_onnx():
    """The zoo transformer from torch: shape arithmetic, MatMul+Add and erf-GELU chains."""
    pytest.importorskip("torch")
    model = models.build("transformer", seed=0)
    return export(model.to("torch"), example_inputs=model.example_input(4)).model, model


def unplanned(proto, backend, x):
    """The graph as written (no fusion, no plan), interpreted node by node."""
    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in proto.opset_import}
    graph = Graph(proto.graph, opsets)
    graph.bind()
    [y] = run_graph(graph, Context(backend), {graph.inputs[0]: backend.ops.asarray(x)})
    return backend.ops.to_numpy(y)


@pytest.mark.realworld_on("jax")  # 15 s of JAX compiling each op; the plan is the same on every backend
def test_the_plan_gives_the_same_answers_as_the_graph_as_written(backend, transformer_onnx):
    proto, model = transformer_onnx
    imported = from_onnx(proto, backend=backend.name)
    assert imported.fused == 12  # per block: 4 linear layers (qkv, out, fc1, fc2), one GELU, one attention
    x = model.example_input(3, seed=2)
    first = backend.ops.to_numpy(imported.apply(imported.params, x)[0])  # records the plan
    second = backend.ops.to_numpy(imported.apply(imported.params, x)[0])  # runs it
    assert len(imported._plans) == 1 and next(iter(imported._plans.values())).folded
    np.testing.assert_array_equal(first, second)
    assert compare(first, unplanned(proto, backend, x), "float32").ok
    other = model.example_input(5, seed=3)  # another signature: its own plan, still right
    assert compare(
        backend.ops.to_numpy(imported.apply(imported.params, other)[0]), unplanned(proto, backend, other), "float32"
    ).ok
    assert len(imported._plans) == 2


def test_compiled_and_captured_runs_give_the_eager_answers(backend, transformer_onnx):
    proto, model = transformer_onnx
    imported = from_onnx(proto, backend=backend.name)
    x = model.example_input(3, seed=2)
    eager = backend.ops.to_numpy(imported.apply(imported.params, x)[0])
    compiled = backend.jit(imported.apply)(imported.params, backend.ops.asarray(x))[0]  # jax.jit, tf.function
    called = imported(x)  # captured: jax.jit, tf.function, a torch.fx graph
    for got in (compiled, called):
        assert compare(backend.ops.to_numpy(got), eager, "float32").ok


def test_torch_compile_and_export_take_the_captured_graph(transformer_onnx):
    torch = pytest.importorskip("torch")
    proto, model = transformer_onnx
    imported = from_onnx(proto, backend="torch")
    x = torch.as_tensor(model.example_input(3, seed=2))
    program = imported.traced(x)
    assert isinstance(program, torch.fx.GraphModule)
    eager = imported.apply(imported.params, x)[0]
    compiled = torch.compile(program, backend="eager")(imported.params, x)[0]
    exported = torch.export.export(program, (imported.params, x)).module()(imported.params, x)[0]
    for got in (compiled, exported):
        torch.testing.assert_close(got, eager)


def test_a_graph_that_needs_data_while_it_is_built_still_runs():
    """NonZero's output shape depends on the data: the call is interpreted, and right."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NonZero", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [1, None])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    for backend in ("jax", "torch"):
        pytest.importorskip(backend)
        imported = from_onnx(proto, backend=backend)
        for x in (np.array([0, 1, 0, 2], np.float32), np.array([3, 0, 0, 0], np.float32)):
            got = np.asarray(imported.backend.ops.to_numpy(imported(x)))
            np.testing.assert_array_equal(got, np.nonzero(x)[0][None])
