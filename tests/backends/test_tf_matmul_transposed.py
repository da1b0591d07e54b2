"""TensorFlow's matmul reads ``b = transpose(stored)`` as ``stored`` with ``transpose_b`` while
tracing (backends/tensorflow/ops.py, ``_matmul_transposed``): a tied head ``h @ embedding.T``
copies no embedding, and the gradients stay those of the plain product, for ``b`` too."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from xdevice.backends.tensorflow.ops import TensorflowOps  # noqa: E402 - after the importorskip above

ops = TensorflowOps()
rng = np.random.default_rng(0)
H = rng.standard_normal((2, 3, 4)).astype(np.float32)
E = rng.standard_normal((5, 4)).astype(np.float32)  # (vocab, width)


def grads(traced: bool):
    h, e = tf.Variable(H), tf.Variable(E)

    def step():
        with tf.GradientTape() as tape:
            b = ops.transpose(e)
            y = ops.matmul(h, b)
            loss = tf.reduce_sum(tf.square(y) * tf.range(1.0, 6.0))
        return y, tape.gradient(loss, [h, e, b])

    return tf.function(step)() if traced else step()


def test_traced_product_and_gradients_equal_eager():
    (y, traced), (eager_y, eager) = grads(True), grads(False)
    np.testing.assert_allclose(y.numpy(), H @ E.T, rtol=1e-5)
    np.testing.assert_allclose(y.numpy(), eager_y.numpy(), rtol=1e-5)
    for g, e in zip(traced, eager):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-4, atol=1e-5)


def test_traced_product_reads_the_stored_matrix():
    e = tf.constant(E)
    graph = tf.function(lambda h: ops.matmul(h, ops.transpose(e))).get_concrete_function(tf.constant(H)).graph
    matmuls = [op for op in graph.get_operations() if op.type == "MatMul"]
    assert len(matmuls) == 1 and matmuls[0].get_attr("transpose_b")
