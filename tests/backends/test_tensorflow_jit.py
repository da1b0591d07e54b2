"""The TensorFlow backend's ``jit`` calls each kind of call's trace directly: it traces once
per kind of call (not per call), gives what ``tf.function`` gives, and takes the plain
``tf.function`` path for what it cannot take apart."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from xdevice.backends.tensorflow.autodiff import Autodiff  # noqa: E402 - after the importorskip above


def _step(params, state, x, lr):
    """A pure update of the trainer's shape: new params and state, and a loss."""
    loss = tf.reduce_sum(tf.square(tf.matmul(x, params["w"]) + params["b"]))
    new = {"w": params["w"] - lr * state["m"], "b": params["b"] - lr}
    return new, {"m": state["m"] * 0.9 + 1.0, "step": state["step"] + 1}, loss


def _arguments(rows=4):
    rng = np.random.default_rng(0)
    params = {"w": tf.constant(rng.normal(size=(3, 2)), tf.float32), "b": tf.zeros([2])}
    state = {"m": tf.ones([3, 2]), "step": tf.constant(0, tf.int64)}
    return params, state, tf.constant(rng.normal(size=(rows, 3)), tf.float32)


def test_one_trace_for_many_calls_and_the_results_of_tf_function():
    traced = []

    def step(*args):
        traced.append(1)  # a Python side effect: it runs only while tracing
        return _step(*args)

    compiled, reference = Autodiff().jit(step), tf.function(_step)
    params, state, x = _arguments()
    mine, theirs = (params, state), (params, state)
    for i in range(5):
        *mine, loss = compiled(*mine, x, np.float32(0.1 * i))  # a new learning rate each call
        *theirs, expected = reference(*theirs, x, np.float32(0.1 * i))
        np.testing.assert_array_equal(loss.numpy(), expected.numpy())
    assert len(traced) == 1
    assert list(mine[0]) == ["w", "b"] and list(mine[1]) == ["m", "step"]  # the dicts' own order
    for got, want in zip(tf.nest.flatten(mine), tf.nest.flatten(theirs)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())


def test_a_new_shape_or_python_value_traces_again():
    compiled = Autodiff().jit(lambda x, k: x * k)
    compiled(tf.ones([2]), 2)
    compiled(tf.ones([2]), 2)
    assert compiled.traces == 1
    assert compiled(tf.ones([3]), 2).shape == (3,)
    np.testing.assert_array_equal(compiled(tf.ones([2]), 5).numpy(), [5.0, 5.0])  # Python values are constants
    assert compiled.traces == 3


def test_what_it_cannot_take_apart_goes_through_tf_function():
    compiled = Autodiff().jit(lambda v, x: v * x)
    variable = tf.Variable([1.0, 2.0])
    np.testing.assert_array_equal(compiled(variable, tf.constant(3.0)).numpy(), [3.0, 6.0])
    variable.assign([2.0, 2.0])  # read at each call, not baked in
    np.testing.assert_array_equal(compiled(variable, tf.constant(3.0)).numpy(), [6.0, 6.0])
    assert compiled.traces == 0


def test_gradients_flow_through_a_compiled_call():
    compiled = Autodiff().jit(lambda x: tf.reduce_sum(x * x))
    x = tf.constant([1.0, 2.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = compiled(x)
    np.testing.assert_array_equal(tape.gradient(y, x).numpy(), [2.0, 4.0])
