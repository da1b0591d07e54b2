"""ONNX import: any graph on any backend, every unsupported op named up front, safe loading."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")
import onnx
from onnx import TensorProto, helper, numpy_helper

import xdevice
from xdevice import ConversionError, UnsupportedOp
from xdevice._tolerance import compare
from xdevice.converters.importer import from_onnx


def _model(nodes, inputs, outputs, initializers=(), opset=18, ir=10):
    """A model; IR 10 by default, which ONNX Runtime (the reference here) reads."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir
    return model


def _dense_model():
    """y = relu(x * w + b) with float initializers w, b: parameters once imported."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(size=(4,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["z"]),
        helper.make_node("Relu", ["z"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    return _model(nodes, [x], [y], [w, b])


def _reference(model, x):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_a_graph_runs_on_every_backend_and_matches_onnxruntime(backend):
    model = _dense_model()
    x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    imported = from_onnx(model, backend=backend.name)
    y = imported(x)
    assert xdevice.backend_of(y) == backend.name
    assert compare(backend.ops.to_numpy(y), _reference(model, x)).ok


def test_float_initializers_become_trainable_parameters(backend):
    imported = from_onnx(_dense_model(), backend=backend.name)
    assert set(imported.params) == {"w", "b"} and all(
        xdevice.backend_of(v) == backend.name for v in imported.params.values()
    )
    x = backend.ops.asarray(np.ones((2, 4), np.float32))
    loss = lambda params: backend.ops.sum(imported.apply(params, x)[0])
    _, grads = backend.value_and_grad(loss, imported.params)
    # d sum(relu(x*w + b)) / d b is 1 where the unit is active, 0 where not
    active = (backend.ops.to_numpy(imported.params["w"]) + backend.ops.to_numpy(imported.params["b"])) > 0
    assert (backend.ops.to_numpy(grads["b"]) == 2.0 * active).all()


def test_the_imported_function_compiles_with_its_shape_arithmetic(backend):
    if backend.jit(len) is len:
        pytest.skip(f"{backend.name} runs eagerly: nothing is compiled")
    # y = relu(x * w + b) reshaped to (batch, 2, 2), the new shape computed from Shape(x) in the graph
    model = _dense_model()
    shape_nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Slice", ["s", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["n", "two_two"], ["new_shape"], axis=0),
        helper.make_node("Reshape", ["y", "new_shape"], ["out"]),
    ]
    model.graph.node.extend(shape_nodes)
    model.graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(v, np.int64), name)
            for name, v in (("zero", [0]), ("one", [1]), ("two_two", [2, 2]))
        ]
    )
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 2, 2]))
    imported = from_onnx(model, backend=backend.name)
    x = np.random.default_rng(2).normal(size=(5, 4)).astype(np.float32)
    compiled = backend.jit(lambda params, x: imported.apply(params, x)[0])
    got = backend.ops.to_numpy(compiled(imported.params, backend.ops.asarray(x)))
    assert got.shape == (5, 2, 2)
    assert compare(got, _reference(model, x)).ok


def test_a_loop_counting_with_a_carried_counter_compiles(backend):
    """tf2onnx writes a Keras RNN as a Loop whose condition compares a counter carried through
    the loop: the counter stays known while the graph is built, so the loop unrolls under
    jax.jit and tf.function (before, the carried counter became a traced array)."""
    if backend.jit(_probe) is _probe:
        pytest.skip(f"{backend.name} runs eagerly: nothing is compiled")
    node, info = helper.make_node, helper.make_tensor_value_info
    body = helper.make_graph(
        [
            node("Add", ["i_in", "one"], ["i_out"]),
            node("Less", ["i_out", "five"], ["going"]),
            node("Mul", ["h_in", "two"], ["h_out"]),
        ],
        "body",
        [
            info("iteration", TensorProto.INT64, []),
            info("cond_in", TensorProto.BOOL, []),
            info("i_in", TensorProto.INT64, []),
            info("h_in", TensorProto.FLOAT, ["batch", 3]),
        ],
        [
            info("going", TensorProto.BOOL, []),
            info("i_out", TensorProto.INT64, []),
            info("h_out", TensorProto.FLOAT, ["batch", 3]),
        ],
        [
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array(5, np.int64), "five"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        ],
    )
    inits = [
        numpy_helper.from_array(np.array(100, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "cond"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
    ]
    model = _model(
        [node("Loop", ["trips", "cond", "zero", "x"], ["count", "y"], body=body)],
        [info("x", TensorProto.FLOAT, ["batch", 3])],
        [info("count", TensorProto.INT64, []), info("y", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    imported = from_onnx(model, backend=backend.name)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    count, y = backend.jit(imported.apply)(imported.params, backend.ops.asarray(x))
    assert int(backend.ops.to_numpy(count)) == 5
    np.testing.assert_array_equal(backend.ops.to_numpy(y), x * 32)


def _probe(*args):
    return args


def test_every_unsupported_op_is_listed_before_anything_runs():
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], name="first", domain="com.example"),
        helper.make_node("Frobnicate", ["a"], ["b"], name="second", domain="com.example"),
        helper.make_node("Wobble", ["b"], ["y"], name="third", domain="com.example"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    model = helper.make_model(
        helper.make_graph(nodes, "g", [x], [y]),
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(UnsupportedOp) as caught:
        from_onnx(model, check=False)
    text = str(caught.value)
    assert "2 ONNX op(s)" in text and "com.example::Frobnicate" in text and "first, second" in text
    assert "com.example::Wobble" in text and "third" in text


def test_a_model_stamped_with_the_newest_ir_and_opset_loads(backend):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])], [x], [y], opset=onnx.defs.onnx_opset_version(), ir=onnx.IR_VERSION
    )
    out = from_onnx(model, backend=backend.name)(np.array([-1.0, 0.5, 2.0], np.float32))
    assert backend.ops.to_numpy(out).tolist() == [0.0, 0.5, 2.0]


def test_wrong_number_of_inputs_names_them():
    with pytest.raises(ConversionError, match="Expected 1: x"):
        from_onnx(_dense_model())(np.ones((1, 4), np.float32), np.ones(1))


def _two_inputs_model():
    """y = a[batch, seq, 4] + b[batch, seq, 4], c: int64[batch] unused by the math."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["batch", "seq", 4])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["batch", "seq", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])
    return _model([helper.make_node("Add", ["a", "b"], ["y"])], [a, b], [y])


@pytest.mark.parametrize(
    "a_shape, b_shape, dtype, says",
    [
        ((2, 3, 4), (2, 3, 4), np.float64, r"Input 'a' has dtype float64, but the model declares float32.*astype"),
        ((3, 4), (2, 3, 4), np.float32, r"Input 'a' has 2 dimension\(s\), but the model declares 3.*\[batch, seq, 4\]"),
        ((2, 3, 5), (2, 3, 5), np.float32, r"Input 'a' has size 5 in dimension 2, which the model fixes at 4"),
        # b's seq of 1 would broadcast silently: the graph's names say it must equal a's
        ((2, 3, 4), (2, 1, 4), np.float32, r"Input 'b' has size 1 in dimension 1 \('seq'\), but input 'a' gave 'seq'"),
    ],
)
def test_inputs_are_checked_against_the_graph_before_any_op_runs(backend, a_shape, b_shape, dtype, says):
    model = from_onnx(_two_inputs_model(), backend=backend.name)
    a, b = np.ones(a_shape, dtype), np.ones(b_shape, np.float32)
    with pytest.raises(xdevice.InputError, match=says):
        model(a, b)
    native = backend.ops.asarray(a), backend.ops.asarray(b)
    if backend.ops.dtype(native[0]) == a.dtype.name:  # JAX without x64 holds float64 as float32
        with pytest.raises(xdevice.InputError, match=says.split(" has ")[0]):  # the backend's own arrays too
            model(*native)
    good = model(np.ones((2, 3, 4), np.float32), np.ones((2, 3, 4), np.float32))
    np.testing.assert_array_equal(backend.ops.to_numpy(good), np.full((2, 3, 4), 2.0, np.float32))


def test_int64_inputs_as_the_backend_holds_them_are_accepted(backend):
    """JAX without x64 holds int64 as int32: token ids placed on JAX first are still right."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, ["batch", 3])
    model = from_onnx(_model([helper.make_node("Identity", ["ids"], ["y"])], [ids], [y]), backend=backend.name)
    placed = backend.ops.asarray(np.arange(6, dtype=np.int64).reshape(2, 3))
    np.testing.assert_array_equal(backend.ops.to_numpy(model(placed)), np.arange(6).reshape(2, 3))
    with pytest.raises(xdevice.InputError, match="has dtype float32, but the model declares int64"):
        model(np.zeros((2, 3), np.float32))


def test_apply_checks_shapes_but_computes_in_the_precision_it_is_given():
    """``apply`` is the pure function people differentiate: float64 inputs give a float64
    result (a reference run), while shapes are still checked."""
    model = from_onnx(_two_inputs_model(), backend="numpy")
    (y,) = model.apply(model.params, np.ones((1, 2, 4)), np.ones((1, 2, 4)))
    assert y.dtype == np.float64
    with pytest.raises(xdevice.InputError, match="Input 'b' has size 3 in dimension 0"):
        model.apply(model.params, np.ones((1, 2, 4)), np.ones((3, 2, 4)))


@pytest.mark.parametrize("opset", [1, 6])
def test_old_opsets_with_legacy_broadcast_run_on_every_backend(backend, opset):
    """Opsets 1-6 broadcast only with ``broadcast=1``, lining the second input up with the
    first from ``axis`` on; their PRelu applies one slope per channel (axis 1)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, size=(2, 3, 4, 5)).astype(np.float32)
    column = rng.normal(size=(3, 4)).astype(np.float32)
    row = rng.normal(size=(5,)).astype(np.float32)
    slope = rng.normal(size=(3,)).astype(np.float32)
    exponent = np.array([2.0], np.float32)
    nodes = [
        helper.make_node("Add", ["x", "column"], ["a"], broadcast=1, axis=1),  # column over dims 1-2
        helper.make_node("Mul", ["a", "row"], ["m"], broadcast=1),  # row over the last dim
        helper.make_node("Sub", ["m", "x"], ["s"]),  # same shapes: no broadcast needed
        helper.make_node("Div", ["s", "x"], ["d"]),
        helper.make_node("Pow", ["x", "exponent"], ["p"], broadcast=1),
        helper.make_node("Sum", ["d", "p"], ["t"]),
        helper.make_node("Max", ["t", "x"], ["u"]),
        helper.make_node("PRelu", ["u", "slope"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(v, n)
        for n, v in [("column", column), ("row", row), ("slope", slope), ("exponent", exponent)]
    ]
    info = helper.make_tensor_value_info
    declared = [info("x", TensorProto.FLOAT, [2, 3, 4, 5])]  # before IR 4, initializers are inputs too
    declared += [info(t.name, TensorProto.FLOAT, list(t.dims)) for t in inits]
    model = _model(nodes, declared, [info("y", TensorProto.FLOAT, [2, 3, 4, 5])], inits, opset=opset, ir=3)
    a = (x + column[:, :, None]) * row
    t = (a - x) / x + x**2.0
    u = np.maximum(t, x)
    want = np.where(u < 0, u * slope[:, None, None], u)
    got = backend.ops.to_numpy(from_onnx(model, backend=backend.name)(x))
    assert compare(got, want, "float32").ok


def _gelu_mlp_model():
    """x[batch, 6] -> Linear -> tanh-GELU written out as exporters write it (a Pow with the
    exponent 3 as an initializer, scalar coefficients) -> Linear -> logits[batch, 2]."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.normal(size=(6, 16)) * 0.5,
        "b1": np.zeros(16),
        "w2": rng.normal(size=(16, 2)) * 0.5,
        "b2": np.zeros(2),
    }
    constants = {
        "three": np.array(3.0),
        "c": np.array(0.044715),
        "k": np.array(0.7978846),
        "one": np.array(1.0),
        "half": np.array(0.5),
    }
    inits = [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in {**weights, **constants}.items()]
    node = helper.make_node
    nodes = [
        node("MatMul", ["x", "w1"], ["m"]),
        node("Add", ["m", "b1"], ["h"]),
        node("Pow", ["h", "three"], ["h3"]),
        node("Mul", ["h3", "c"], ["ch3"]),
        node("Add", ["h", "ch3"], ["s"]),
        node("Mul", ["s", "k"], ["ks"]),
        node("Tanh", ["ks"], ["t"]),
        node("Add", ["t", "one"], ["t1"]),
        node("Mul", ["h", "t1"], ["ht"]),
        node("Mul", ["ht", "half"], ["g"]),
        node("MatMul", ["g", "w2"], ["m2"]),
        node("Add", ["m2", "b2"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])
    return _model(nodes, [x], [y], inits)


def test_only_weights_are_parameters_and_an_imported_model_trains_on_every_backend(backend):
    """The exponent and the scalar coefficients are constants: trained, the Pow's exponent
    would get a NaN gradient for every negative input (ln of a negative base)."""
    from xdevice import fit

    model = from_onnx(_gelu_mlp_model(), backend=backend.name)
    assert sorted(model.params) == ["b1", "b2", "w1", "w2"]
    assert sorted(model.constants) == ["c", "half", "k", "one", "three"] and model.shared == {}
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 6)).astype(np.float32)
    y = (x[:, 0] - x[:, 1] > 0).astype(np.int64)
    history = fit(model, (x, y), optimizer="adam", lr=0.03, epochs=4, batch_size=32, verbose=0)
    losses = history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < 0.6 * losses[0], losses
    assert history.model is model
    trained = backend.ops.to_numpy(model(x))  # the trained weights are the model's own now
    assert ((trained[:, 1] > trained[:, 0]) == y).mean() > 0.9


def test_weights_that_several_nodes_read_are_reported():
    """An exporter merges equal initializers (every fresh LayerNorm's ones): one weight,
    several readers, trained as one."""
    ones = numpy_helper.from_array(np.ones(4, np.float32), "ones")
    node = helper.make_node
    nodes = [node("Mul", ["x", "ones"], ["a"]), node("Mul", ["a", "ones"], ["y"])]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    model = from_onnx(_model(nodes, [x], [y], [ones]))
    assert model.shared == {"ones": 2} and "1 read by several nodes" in repr(model)


# -- safe loading -------------------------------------------------------------------------------


def _with_external(tmp_path, location: str):
    model = _dense_model()
    for tensor in model.graph.initializer:
        tensor.data_location = TensorProto.EXTERNAL
        del tensor.external_data[:]
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", location
        tensor.ClearField("raw_data")
        tensor.ClearField("float_data")
    path = tmp_path / "model" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(model.SerializeToString())
    return path


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/passwd", "sub/../../secret.bin"])
def test_external_data_outside_the_model_folder_is_refused(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    with pytest.raises(ConversionError, match="points outside the model's folder"):
        from_onnx(_with_external(tmp_path, location))


def test_external_data_inside_the_folder_loads(tmp_path):
    model = _dense_model()
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="weights.bin",
        size_threshold=0,
    )
    assert (path.parent / "weights.bin").exists()
    x = np.ones((2, 4), np.float32)
    assert compare(from_onnx(path)(x), _reference(_dense_model(), x)).ok  # save_model emptied model


def test_a_link_leading_out_of_the_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 64)
    path = _with_external(tmp_path, "weights.bin")
    (path.parent / "weights.bin").symlink_to(tmp_path / "secret.bin")
    with pytest.raises(ConversionError, match="points outside the model's folder"):
        from_onnx(path)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_a_damaged_file_gives_a_clear_error(tmp_path, damage):
    data = _dense_model().SerializeToString()
    path = tmp_path / "bad.onnx"
    path.write_bytes({"truncate": data[: len(data) // 2], "garbage": b"\x12\x34" * 50, "empty": b""}[damage])
    with pytest.raises(ConversionError, match="truncated or not ONNX|Not an ONNX model"):
        from_onnx(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConversionError, match="No ONNX model at this path"):
        from_onnx(tmp_path / "nope.onnx")
