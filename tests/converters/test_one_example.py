"""JAX models that take one example (batched by the user with ``jax.vmap``) export by default.

Equinox and Flax users write a model for one example and batch it with ``jax.vmap``. Export's
default, a dynamic batch on axis 0, made the example's feature axis symbolic: ONNX Runtime
failed in a ``Reshape`` and its error log reached the terminal. Now export notices that axis
0 is no batch, adds one in front with ``jax.vmap`` and says so; ``dynamic_batch=False``
exports the model exactly as called.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from xdevice import ConversionError
from xdevice.converters import export, verify

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
onnxruntime = pytest.importorskip("onnxruntime")


def _ort(result, x):
    session = onnxruntime.InferenceSession(result.model.SerializeToString())
    return session.run(None, {session.get_inputs()[0].name: x})[0]


def _features(rows: int | None = None) -> np.ndarray:
    shape = (12,) if rows is None else (rows, 12)
    return np.random.default_rng(0).standard_normal(shape).astype("float32")


def test_an_unbatched_equinox_mlp_exports_by_default_batched_by_vmap(capfd):
    eqx = pytest.importorskip("equinox")
    mlp = eqx.nn.MLP(in_size=12, out_size=3, width_size=16, depth=2, key=jax.random.PRNGKey(0))
    with pytest.warns(UserWarning, match=r"takes one example \(input \(12,\)\).*jax\.vmap.*\(batch, 12\)"):
        result = export(mlp, example_inputs=_features())
    assert result.inputs[0].shape == ("batch", 12)
    assert "jax.vmap" in result.batching and f"batch     {result.batching}" in str(result)
    assert "at batch 1" in str(result)
    rows = _features(5)
    np.testing.assert_allclose(_ort(result, rows), np.asarray(jax.vmap(mlp)(rows)), rtol=1e-5, atol=1e-6)
    assert "onnxruntime" not in capfd.readouterr().err


def test_an_unbatched_function_exports_as_called_with_dynamic_batch_off():
    weights = np.arange(36, dtype="float32").reshape(12, 3) / 36

    def one(x):
        return jnp.tanh(x @ weights)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing said: the user chose the shapes
        result = export(one, backend="jax", example_inputs=_features(), dynamic_batch=False)
    assert result.inputs[0].shape == (12,)
    assert result.batching == ""
    assert "output with input shape (12,)" in str(result)
    assert "batch" not in str(result.verification[0])
    np.testing.assert_allclose(_ort(result, _features()), np.tanh(_features() @ weights), rtol=1e-5, atol=1e-6)


def test_an_unbatched_params_pair_exports_batched():
    params = {"w": np.ones((12, 2), "float32"), "b": np.array([0.5, -0.5], "float32")}

    def apply(p, x):
        return x @ p["w"] + p["b"]

    with pytest.warns(UserWarning, match="takes one example"):
        result = export((apply, params), example_inputs=_features())
    rows = _features(3)
    np.testing.assert_allclose(_ort(result, rows), rows @ params["w"] + params["b"], rtol=1e-5, atol=1e-5)


def test_a_batched_function_keeps_its_own_batch_and_says_nothing():
    weights = np.ones((12, 3), "float32")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = export(lambda x: x @ weights, backend="jax", example_inputs=_features(4))
    assert result.inputs[0].shape == ("batch", 12)
    assert result.batching == ""


def test_a_failing_verification_raises_without_onnxruntime_logging(capfd):
    """ONNX Runtime's own error log stays off the terminal: the ConversionError says it all."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 12])
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["input", "shape"], ["output"])],
        "fixed",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 12])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model)
    with pytest.raises(ConversionError, match="ONNX Runtime failed to run"):
        verify(model, lambda x: x.reshape(1, -1), np.zeros((15,), "float32"))
    assert capfd.readouterr().err == ""
