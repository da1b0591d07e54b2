"""The scan jax2onnx writes as an ONNX Loop (the zoo LSTM) runs on JAX as one compiled
while loop, not unrolled, and gives the zoo model's output bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import models
from xdevice.converters import export
from xdevice.converters.importer import from_onnx

pytest.importorskip("onnx")
jax = pytest.importorskip("jax")


def test_the_zoo_lstm_loop_compiles_as_one_while_loop_with_the_zoo_output():
    model = models.build("lstm", seed=0).to("jax")
    proto = export(model, example_inputs=model.example_input(4)).model
    assert "Loop" in {node.op_type for node in proto.graph.node}
    imported = from_onnx(proto, backend="jax")
    x = jax.numpy.asarray(model.example_input(3, seed=1))
    program = str(jax.make_jaxpr(imported.apply)(imported.params, x))
    assert program.count("while[") == 1 and program.count("dot_general") <= 4  # not 2 per step
    apply_fn, params = models.to_native(model, "jax")
    np.testing.assert_array_equal(np.asarray(imported(x)), np.asarray(jax.jit(apply_fn)(params, x)))
