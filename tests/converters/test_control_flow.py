"""Control flow on values known only at run time: ``If`` and ``Loop`` become the framework's
own branch and loop (``lax.cond``/``lax.while_loop``, ``tf.cond``/``tf.while_loop``, torch's
``cond``/``while_loop`` operators), so compiled functions and every saved format take them.
Answers are compared with ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX control-flow tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper

import xdevice
from xdevice import ConversionError
from xdevice.converters.formats import FORMATS, convert_model
from xdevice.converters.importer import from_onnx

node, info = helper.make_node, helper.make_tensor_value_info


def _const(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _model(nodes, inputs, outputs, initializers=()):
    model = helper.make_model(
        helper.make_graph(nodes, "g", inputs, outputs, list(initializers)), opset_imports=[helper.make_opsetid("", 18)]
    )
    model.ir_version = 10
    return model


def branch_model(else_width: int = 3):
    """y = x * 2 if sum(x) > 0 else x - 1: the branch depends on the input's values."""
    then = helper.make_graph(
        [node("Mul", ["x", "two"], ["a"])],
        "then",
        [],
        [info("a", TensorProto.FLOAT, ["batch", 3])],
        [_const("two", 2.0, np.float32)],
    )
    other = helper.make_graph(
        [node("Sub", ["x", "one"], ["b0"]), node("Slice", ["b0", "start", "width", "last"], ["b"])],
        "else",
        [],
        [info("b", TensorProto.FLOAT, ["batch", else_width])],
        [
            _const("one", 1.0, np.float32),
            _const("start", [0], np.int64),
            _const("width", [else_width], np.int64),
            _const("last", [1], np.int64),
        ],
    )
    return _model(
        [
            node("ReduceSum", ["x"], ["total"], keepdims=0),
            node("Greater", ["total", "zero"], ["positive"]),
            node("If", ["positive"], ["y"], then_branch=then, else_branch=other, name="choose"),
        ],
        [info("x", TensorProto.FLOAT, ["batch", 3])],
        [info("y", TensorProto.FLOAT, ["batch", 3])],
        [_const("zero", 0.0, np.float32)],
    )


def while_model():
    """Double h until its sum reaches 100, counting the doublings: no trip count, and a
    condition computed from the carried values."""
    body = helper.make_graph(
        [
            node("Mul", ["h_in", "two"], ["h_out"]),
            node("Add", ["n_in", "one"], ["n_out"]),
            node("ReduceSum", ["h_out"], ["s"], keepdims=0),
            node("Less", ["s", "hundred"], ["going"]),
        ],
        "body",
        [
            info("i", TensorProto.INT64, []),
            info("c", TensorProto.BOOL, []),
            info("n_in", TensorProto.INT64, []),
            info("h_in", TensorProto.FLOAT, ["batch", 3]),
        ],
        [
            info("going", TensorProto.BOOL, []),
            info("n_out", TensorProto.INT64, []),
            info("h_out", TensorProto.FLOAT, ["batch", 3]),
        ],
        [_const("two", 2.0, np.float32), _const("one", 1, np.int64), _const("hundred", 100.0, np.float32)],
    )
    return _model(
        [
            node("ReduceSum", ["x"], ["s0"], keepdims=0),
            node("Less", ["s0", "hundred"], ["start"]),
            node("Loop", ["", "start", "zero", "x"], ["count", "y"], body=body, name="double"),
        ],
        [info("x", TensorProto.FLOAT, ["batch", 3])],
        [info("count", TensorProto.INT64, []), info("y", TensorProto.FLOAT, ["batch", 3])],
        [_const("zero", 0, np.int64), _const("hundred", 100.0, np.float32)],
    )


def running_sum_model(scan_read: bool = True, trip_count: str = "seq"):
    """Running sums over the sequence axis of x[batch, seq, 4], as a Loop whose trip count is
    the sequence length (a shape): the final sum and every partial sum (seq, batch, 4)."""
    body = helper.make_graph(
        [
            node("Gather", ["x", "i"], ["row"], axis=1),
            node("Add", ["acc_in", "row"], ["acc_out"]),
            node("Identity", ["c"], ["c_out"]),
            node("Identity", ["acc_out"], ["partial"]),
        ],
        "body",
        [
            info("i", TensorProto.INT64, []),
            info("c", TensorProto.BOOL, []),
            info("acc_in", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            info("c_out", TensorProto.BOOL, []),
            info("acc_out", TensorProto.FLOAT, ["batch", 4]),
            info("partial", TensorProto.FLOAT, ["batch", 4]),
        ],
    )
    outputs = [info("total", TensorProto.FLOAT, ["batch", 4])]
    if scan_read:
        outputs.append(info("partials", TensorProto.FLOAT, ["seq", "batch", 4]))
    return _model(
        [
            node("Shape", ["x"], ["shape"]),
            node("Gather", ["shape", "one"], ["seq"], axis=0),
            node("ReduceSum", ["x", "one_axis"], ["summed"], keepdims=0),
            node("Mul", ["summed", "nought"], ["acc0"]),
            node("Loop", [trip_count, "", "acc0"], ["total", "partials"], body=body, name="accumulate"),
        ],
        [info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        outputs,
        [_const("one", 1, np.int64), _const("one_axis", [1], np.int64), _const("nought", 0.0, np.float32)],
    )


def scan_model():
    """The running sums as a Scan over axis 1 of x[batch, seq, 4], its partial sums stacked
    on axis 1 in reverse order: a length that is a symbolic size when traced."""
    body = helper.make_graph(
        [node("Add", ["acc_in", "row"], ["acc_out"]), node("Identity", ["acc_out"], ["partial"])],
        "body",
        [info("acc_in", TensorProto.FLOAT, ["batch", 4]), info("row", TensorProto.FLOAT, ["batch", 4])],
        [info("acc_out", TensorProto.FLOAT, ["batch", 4]), info("partial", TensorProto.FLOAT, ["batch", 4])],
    )
    return _model(
        [
            node("ReduceSum", ["x", "one_axis"], ["summed"], keepdims=0),
            node("Mul", ["summed", "nought"], ["acc0"]),
            node(
                "Scan",
                ["acc0", "x"],
                ["total", "partials"],
                body=body,
                num_scan_inputs=1,
                scan_input_axes=[1],
                scan_output_axes=[1],
                scan_output_directions=[1],
                name="sums",
            ),
        ],
        [info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [info("total", TensorProto.FLOAT, ["batch", 4]), info("partials", TensorProto.FLOAT, ["batch", "seq", 4])],
        [_const("one_axis", [1], np.int64), _const("nought", 0.0, np.float32)],
    )


def _onnxruntime(model, x):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


CASES = {  # model, inputs that take each way through it
    "branch": (branch_model, [np.ones((2, 3), np.float32), -np.ones((5, 3), np.float32)]),
    "while": (while_model, [np.full((2, 3), 0.5, np.float32), np.full((4, 3), 50.0, np.float32)]),
    "running sum": (
        running_sum_model,
        [np.arange(24, dtype=np.float32).reshape(2, 3, 4), np.ones((3, 7, 4), np.float32)],
    ),
    "scan": (
        scan_model,
        [
            np.arange(24, dtype=np.float32).reshape(2, 3, 4),
            np.random.default_rng(0).normal(size=(3, 7, 4)).astype(np.float32),
        ],
    ),
}


def _matches(got, want) -> bool:
    return len(got) == len(want) and all(np.shape(g) == np.shape(w) and np.allclose(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("case", list(CASES))
def test_control_flow_on_traced_values_compiles_and_matches_onnxruntime(backend, case):
    build, inputs = CASES[case]
    model = build()
    imported = from_onnx(model, backend=backend.name)
    compiled = backend.jit(imported.apply)
    for x in inputs:
        for run in (imported.apply, compiled):
            got = [backend.ops.to_numpy(y) for y in run(imported.params, backend.ops.asarray(x))]
            assert _matches(got, _onnxruntime(model, x)), f"{case} at {x.shape}"


@pytest.mark.parametrize("framework", list(FORMATS))
def test_control_flow_on_traced_values_saves_in_every_format_with_its_dims_free(framework, tmp_path):
    if framework not in xdevice.backends():
        pytest.skip(f"{framework} is not installed")
    from tests.realworld.test_realworld import load_and_run

    for case, (build, inputs) in CASES.items():
        model = build()
        path = tmp_path / f"{case.replace(' ', '_')}{FORMATS[framework]}"
        converted = convert_model(model, to=framework, output=path)
        assert converted.note == "" and converted.inputs[0][2][0] == "batch", (case, converted)
        for x in inputs:
            assert _matches(load_and_run(framework, converted.path, [x]), _onnxruntime(model, x)), f"{case} {x.shape}"


def test_branches_that_differ_in_shape_compile_where_the_framework_allows_it(backend):
    """ONNX lets an If's branches give different shapes: tf.cond keeps them (the result's
    shape is known at run time); lax.cond cannot, and the error names the node."""
    if backend.jit(_probe) is _probe:
        pytest.skip(f"{backend.name} runs eagerly: both branches are never traced")
    model = branch_model(else_width=2)
    imported = from_onnx(model, backend=backend.name, check=False)
    compiled = backend.jit(imported.apply)
    if backend.name == "jax":
        with pytest.raises(ConversionError, match=r"If node 'choose'.*same shapes and dtypes"):
            compiled(imported.params, backend.ops.asarray(np.ones((2, 3), np.float32)))
    else:
        for x in (np.ones((2, 3), np.float32), -np.ones((2, 3), np.float32)):
            got = [backend.ops.to_numpy(y) for y in compiled(imported.params, backend.ops.asarray(x))]
            assert _matches(got, _onnxruntime(model, x))
    y = imported(-np.ones((2, 3), np.float32))  # eagerly only the branch taken runs, as in ONNX Runtime
    assert backend.ops.to_numpy(y).tolist() == [[-2.0] * 2] * 2


def _probe(*args):
    return args


def test_scan_outputs_of_a_loop_without_trip_count_are_refused_under_compilation_unless_unread(backend):
    """Without a trip count the scan outputs' length is not a shape: refused by name, unless
    nothing reads them (they are then never built)."""
    if backend.jit(_probe) is _probe:
        pytest.skip(f"{backend.name} runs eagerly: nothing is compiled")
    x = backend.ops.asarray(np.ones((2, 3, 4), np.float32))
    model = running_sum_model(trip_count="")
    # a condition computed from x, and no trip count: traced, it never ends (only the error is tested)
    model.graph.node.insert(0, node("ReduceSum", ["x"], ["s"], keepdims=0))
    model.graph.node.insert(1, node("Less", ["s", "big"], ["small"]))
    model.graph.initializer.append(numpy_helper.from_array(np.array(1e9, np.float32), "big"))
    model.graph.node[-1].input[1] = "small"
    imported = from_onnx(model, backend=backend.name)
    with pytest.raises(ConversionError, match=r"Loop node 'accumulate' stacks scan outputs"):
        backend.jit(imported.apply)(imported.params, x)
    unread = running_sum_model(scan_read=False)
    imported = from_onnx(unread, backend=backend.name)
    (total,) = backend.jit(imported.apply)(imported.params, x)
    np.testing.assert_allclose(backend.ops.to_numpy(total), np.full((2, 4), 3.0))
