"""``xdevice convert``: an ONNX model in each framework's own format, loaded with no xdevice."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import xdevice
from xdevice import ConversionError, models
from xdevice._tolerance import compare
from xdevice.converters import export
from xdevice.converters.formats import FORMATS, convert_model

# Loads the saved program in a fresh interpreter where `import xdevice` fails, runs it on
# x.npy and writes y.npy: what a user with only the framework installed would do.
LOADER = """
import sys
sys.modules["xdevice"] = None
import numpy as np
fmt, path, folder = sys.argv[1:]
x = np.load(folder + "/x.npy")
if fmt == "torch":
    import torch
    y = torch.export.load(path).module()(torch.as_tensor(x)).numpy()
elif fmt == "tensorflow":
    import tensorflow as tf
    loaded = tf.saved_model.load(path)
    y = loaded.serve(x).numpy()
else:
    import jax.export
    y = np.asarray(jax.export.deserialize(bytearray(open(path, "rb").read())).call(x))
np.save(folder + "/y.npy", y)
"""


@pytest.fixture(scope="module")
def cnn_onnx(tmp_path_factory):
    if "torch" not in xdevice.backends():
        pytest.skip("needs torch to export the example model")
    folder = tmp_path_factory.mktemp("cnn")
    model = models.build("cnn", seed=0, backend="torch")
    return export(model, folder / "cnn.onnx").path


def _onnxruntime(path, x):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"input": x})[0]


@pytest.mark.slow
@pytest.mark.parametrize("framework", list(FORMATS))
def test_a_converted_model_loads_without_xdevice_and_matches_at_any_batch(framework, cnn_onnx, tmp_path):
    if framework not in xdevice.backends():
        pytest.skip(f"{framework} is not installed")
    converted = convert_model(cnn_onnx, to=framework, output=tmp_path / f"cnn{FORMATS[framework]}")
    assert converted.path.exists() and converted.dynamic_batch, converted.note
    for batch in (3, 6):
        x = models.build("cnn").example_input(batch, seed=batch)
        np.save(tmp_path / "x.npy", x)
        done = subprocess.run(
            [sys.executable, "-c", LOADER, framework, str(converted.path), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        )
        assert done.returncode == 0, done.stderr[-2000:]
        result = compare(np.load(tmp_path / "y.npy"), _onnxruntime(cnn_onnx, x))
        assert result.ok, f"{framework} batch {batch}: {result}"


def test_an_unknown_format_lists_the_choices(tmp_path):
    with pytest.raises(
        ConversionError, match=r"Unknown target format(?=.*'onnx2')(?=.*torch)(?=.*tensorflow)(?=.*jax)"
    ):
        convert_model(tmp_path / "model.onnx", to="onnx2")


def _shape_arithmetic_model():
    """y[batch, seq, 4] = (x[batch, seq, 8] reshaped to [batch*seq, 8] @ w, reshaped back) +
    mask[batch, seq, 1]: Reshape targets computed from Shape (cast to int32 and back), as
    exporters write them."""
    from onnx import TensorProto, helper, numpy_helper

    node, const = helper.make_node, lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)
    w = numpy_helper.from_array(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32), "w")
    nodes = [
        node("Shape", ["x"], ["shape64"]),
        node("Cast", ["shape64"], ["shape32"], to=TensorProto.INT32),
        node("Cast", ["shape32"], ["shape"], to=TensorProto.INT64),  # tf2onnx casts shapes to int32 and back
        node("Gather", ["shape", "zero"], ["b"], axis=0),
        node("Gather", ["shape", "one"], ["s"], axis=0),
        node("Mul", ["b", "s"], ["bs"]),
        node("Concat", ["bs", "eight"], ["flat_shape"], axis=0),
        node("Reshape", ["x", "flat_shape"], ["flat"]),
        node("MatMul", ["flat", "w"], ["h"]),
        node("Concat", ["b", "s", "four"], ["back"], axis=0),
        node("Reshape", ["h", "back"], ["h3"]),
        node("Unsqueeze", ["mask", "minus_one"], ["m"]),
        node("Add", ["h3", "m"], ["y"]),
    ]
    inits = [
        w,
        const("zero", [0]),
        const("one", [1]),
        const("eight", [8]),
        const("four", [4]),
        const("minus_one", [-1]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("framework", list(FORMATS))
def test_every_symbolic_dim_stays_symbolic_in_every_saved_format(framework, tmp_path):
    """Shapes computed from the input's shape are symbolic under tracing, not frozen: the
    saved program takes any batch and sequence, and says so."""
    if framework not in xdevice.backends():
        pytest.skip(f"{framework} is not installed")
    from tests.realworld.test_realworld import load_and_run
    from xdevice.converters import from_onnx

    model = _shape_arithmetic_model()
    converted = convert_model(model, to=framework, output=tmp_path / f"m{FORMATS[framework]}")
    assert converted.inputs == [("x", "float32", ("batch", "seq", 8)), ("mask", "float32", ("batch", "seq"))]
    assert converted.dynamic_batch and converted.note == ""
    reference = from_onnx(model)
    for batch, seq in [(2, 16), (5, 23)]:
        rng = np.random.default_rng(batch)
        x, mask = rng.normal(size=(batch, seq, 8)).astype(np.float32), rng.normal(size=(batch, seq)).astype(np.float32)
        (got,) = load_and_run(framework, converted.path, [x, mask])
        assert got.shape == (batch, seq, 4) and compare(got, reference(x, mask)).ok
    # "seq" is one size across the inputs: every saved format refuses a mask of another length
    refusal = {
        "torch": r"Guard failed: inputs_1.size\(\)\[1\] == inputs_0.size\(\)\[1\]",
        "jax": r"inconsistency between dimension size args\[1\].shape\[1\] \(= \d+\) and the specification 'seq'",
        "tensorflow": r"dimension seq has one size across inputs: mask\[1\] differs from x\[1\]",
    }
    with pytest.raises(Exception, match=refusal[framework]):
        load_and_run(framework, converted.path, [x, mask[:, :-1]])


def _lstm_model():
    """An ONNX LSTM over x[seq, batch, 4] with the sequence left symbolic: torch's and
    TensorFlow's unrolled recurrences need a static time axis, so they scan instead."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.normal(size=shape).astype(np.float32) * 0.3, name)
        for name, shape in [("w", (1, 20, 4)), ("r", (1, 20, 5)), ("b", (1, 40))]
    ]
    graph = helper.make_graph(
        [helper.make_node("LSTM", ["x", "w", "r", "b"], ["y", "h"], hidden_size=5)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", "batch", 4])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["seq", 1, "batch", 5]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, "batch", 5]),
        ],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("framework", list(FORMATS))
def test_a_recurrence_over_a_symbolic_sequence_saves_with_the_sequence_free(framework, tmp_path):
    if framework not in xdevice.backends():
        pytest.skip(f"{framework} is not installed")
    from tests.realworld.test_realworld import load_and_run
    from xdevice.converters import from_onnx

    model = _lstm_model()
    converted = convert_model(model, to=framework, output=tmp_path / f"m{FORMATS[framework]}")
    assert converted.inputs == [("x", "float32", ("seq", "batch", 4))] and converted.note == ""
    reference = from_onnx(model)
    for seq, batch in [(3, 2), (11, 5)]:
        x = np.random.default_rng(seq).normal(size=(seq, batch, 4)).astype(np.float32)
        got = load_and_run(framework, converted.path, [x])
        want = [np.asarray(v) for v in reference(x)]
        assert [g.shape for g in got] == [w.shape for w in want] and all(compare(g, w).ok for g, w in zip(got, want))


def _loop_over_the_sequence():
    """x[batch, seq] plus a row 0, 1, ..., seq - 1 that an ONNX Loop stacks while a counter is
    below the sequence length: a number of iterations known only at run time, which JAX
    (and TensorFlow, without a trip count) cannot give a scan output."""
    from onnx import TensorProto, checker, helper

    body = helper.make_graph(
        [
            helper.make_node("Add", ["i", "one"], ["next"]),
            helper.make_node("Less", ["next", "n"], ["again"]),
            helper.make_node("Cast", ["i"], ["step"], to=TensorProto.FLOAT),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("c", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("again", TensorProto.BOOL, []),
            helper.make_tensor_value_info("step", TensorProto.FLOAT, []),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["shape"]),
            helper.make_node("Gather", ["shape", "one"], ["n"], axis=0),
            helper.make_node("Loop", ["", "true"], ["steps"], body=body, name="count"),
            helper.make_node("Unsqueeze", ["steps", "zero"], ["row"]),
            helper.make_node("Add", ["x", "row"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])],
        [
            helper.make_tensor("one", TensorProto.INT64, [], [1]),
            helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
            helper.make_tensor("true", TensorProto.BOOL, [], [True]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    checker.check_model(model, full_check=True)
    return model


def test_a_dimension_the_tracer_cannot_keep_is_refused_by_node_then_fixed_on_request(tmp_path):
    """Never frozen behind a note: the refusal names the node and the fix; ``fixed=`` fixes the
    dimension at the size asked for, and the batch stays free."""
    if "jax" not in xdevice.backends():
        pytest.skip("jax is not installed")
    from tests.realworld.test_realworld import load_and_run

    model = _loop_over_the_sequence()
    with pytest.raises(ConversionError, match=r"cannot keep the symbolic dimensions .*Loop node 'count'") as refused:
        convert_model(model, to="jax", output=tmp_path / "free.jax")
    assert "fixed={'seq': <size>}" in str(refused.value)
    converted = convert_model(model, to="jax", output=tmp_path / "fixed.jax", fixed={"seq": 5})
    assert converted.inputs == [("x", "float32", ("batch", 5))] and converted.note == "fixed on request: seq=5"
    for batch in (2, 4):
        x = np.random.default_rng(batch).normal(size=(batch, 5)).astype(np.float32)
        (got,) = load_and_run("jax", converted.path, [x])
        np.testing.assert_allclose(got, x + np.arange(5, dtype=np.float32))
    with pytest.raises(ConversionError, match=r"fixed= names symbolic dimensions.*length.*choices: batch, seq"):
        convert_model(model, to="jax", output=tmp_path / "wrong.jax", fixed={"length": 5})


def test_position_ids_from_the_input_shape_stay_symbolic_in_a_savedmodel(tmp_path):
    """``torch.arange(ids.shape[1])`` (every transformer's position ids), exported with a free
    ``seq``: the SavedModel runs at other lengths and matches torch."""
    if not {"torch", "tensorflow"} <= set(xdevice.backends()):
        pytest.skip("needs torch and tensorflow")
    import torch

    from tests.realworld.test_realworld import load_and_run

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = torch.nn.Embedding(10, 4), torch.nn.Embedding(16, 4)

        def forward(self, ids):
            return self.tokens(ids) + self.positions(torch.arange(ids.shape[1]))[None]

    torch.manual_seed(0)
    net = Positions().eval()
    ids = np.array([[1, 2, 3], [4, 5, 6]], np.int64)
    onnx_path = export(net, tmp_path / "positions.onnx", example_inputs=ids, dynamic_axes={1: "seq"}).path
    converted = convert_model(onnx_path, to="tensorflow")
    assert converted.inputs == [("input", "int64", ("batch", "seq"))] and converted.note == ""
    for length in (3, 7):
        x = np.arange(2 * length, dtype=np.int64).reshape(2, length) % 10
        (got,) = load_and_run("tensorflow", converted.path, [x])
        np.testing.assert_allclose(got, net(torch.as_tensor(x)).detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_an_output_path_without_the_formats_suffix_gets_it_and_no_warning(framework, cnn_onnx, tmp_path):
    if framework not in xdevice.backends():
        pytest.skip(f"{framework} is not installed")
    suffix = FORMATS[framework]
    converted = convert_model(cnn_onnx, to=framework, output=tmp_path / "cnn")  # filterwarnings = error
    assert converted.path == tmp_path / f"cnn{suffix}" and converted.path.exists()
    assert convert_model(cnn_onnx, to=framework, output=tmp_path / "cnn.v2").path == tmp_path / f"cnn.v2{suffix}"
