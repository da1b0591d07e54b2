"""TensorFlow runs conv, pooling, batch norm and the elementwise ops between them channels-last
while tracing (backends/tensorflow/ops.py, ``_viewed``): a training step pays no transpose pair
per layer, and gradients stay those of the channels-first math, with respect to weights and to
any intermediate a tape is asked about."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from xdevice.backends.tensorflow.ops import TensorflowOps  # noqa: E402 - after the importorskip above

ops = TensorflowOps()
rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
W1 = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
W2 = (rng.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)
SCALE = rng.uniform(0.5, 1.5, 4).astype(np.float32)
OFFSET = rng.standard_normal(4).astype(np.float32)


def block(x, w1, w2, scale, offset):
    """conv -> batch norm (training) -> relu -> conv -> add the first conv -> relu -> max pool:
    ResNet's chain, every op channels-first at the API."""
    h = ops.conv(x, w1, padding=1)
    y, _, _ = ops.batch_norm_train(h, scale, offset)
    z = ops.conv(ops.relu(y), w2, padding=1)
    return ops.max_pool(ops.relu(ops.add(z, h)), 2), h


def loss_and_grads(traced: bool):
    weights = [tf.Variable(v) for v in (W1, W2, SCALE, OFFSET)]

    def step():
        with tf.GradientTape() as tape:
            out, h = block(tf.constant(X), *weights)
            loss = tf.reduce_sum(tf.square(out) * tf.range(1.0, 1.0 + out.shape[-1]))
        # the gradient with respect to an intermediate as well (Grad-CAM asks for it)
        return loss, tape.gradient(loss, [*weights, h])

    fn = tf.function(step) if traced else step
    return fn, step


def optimized_transposes(fn) -> list[str]:
    """The Transpose nodes left in ``fn``'s graph after Grappler, TensorFlow's graph optimizer
    that ``tf.function`` runs before executing (it cancels a transpose followed by its inverse)."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    concrete = fn.get_concrete_function()
    meta = tf.compat.v1.train.export_meta_graph(graph_def=concrete.graph.as_graph_def(), graph=concrete.graph)
    meta.collection_def["train_op"].node_list.value.extend(t.op.name for t in concrete.outputs)
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), meta)
    return [node.name for node in optimized.node if node.op == "Transpose"]


def test_traced_step_has_no_transpose_pair_per_layer():
    fn, _ = loss_and_grads(traced=True)
    # forward: the input, two conv weights, the pooled result back to channels-first; backward:
    # those four again, and h's gradient to channels-first and back (asked for, and summed over
    # its three readers). A transpose pair around each of the 7 layers would leave 20 more.
    assert len(optimized_transposes(fn)) <= 10, optimized_transposes(fn)


def test_traced_gradients_equal_eager():
    fn, step = loss_and_grads(traced=True)
    loss, grads = fn()
    eager_fn, _ = loss_and_grads(traced=False)
    eager_loss, eager_grads = eager_fn()
    np.testing.assert_allclose(loss.numpy(), eager_loss.numpy(), rtol=1e-5)
    assert all(g is not None for g in grads)
    for g, e in zip(grads, eager_grads):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=2e-4, atol=2e-5)


def test_forward_without_tape_prunes_the_chain_transposes():
    f = tf.function(lambda: block(tf.constant(X), W1, W2, SCALE, OFFSET)[0])
    assert len(optimized_transposes(f)) <= 4, optimized_transposes(f)  # input, two weights, output
    np.testing.assert_allclose(f().numpy(), block(tf.constant(X), W1, W2, SCALE, OFFSET)[0].numpy(), rtol=1e-5)


def test_weight_gradients_take_no_transposes_between_layers():
    # h is read by batch norm's statistics, its normalisation and the residual add: the tape
    # sums three channels-first gradients, which ops.py sums channels-last instead (_undone)
    weights = [tf.Variable(v) for v in (W1, W2, SCALE, OFFSET)]

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            out, _ = block(tf.constant(X), *weights)
            loss = tf.reduce_sum(tf.square(out))
        return tape.gradient(loss, weights)

    # the input, two weights, the pooled result and its gradient, two weight gradients: a sum
    # transposed back after the tape's AddN (as before _undone) leaves 10
    assert len(optimized_transposes(step)) <= 6, optimized_transposes(step)
    with tf.GradientTape() as tape:  # eager: every transpose runs, nothing is rewritten
        out, _ = block(tf.constant(X), *weights)
        loss = tf.reduce_sum(tf.square(out))
    for g, e in zip(step(), tape.gradient(loss, weights)):
        np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=2e-4, atol=2e-5)
