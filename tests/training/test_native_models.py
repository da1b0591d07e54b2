"""fit on the frameworks' own models: each matches a hand-written loop in that framework."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from xdevice import ConfigurationError, fit, models


def data(rows: int = 64):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype("float32")
    return x, (x[:, 0] + x[:, 1] > 0).astype("int64")


def batches(x, y, size=8):
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


def batch_norm_net(torch):
    """A small torch network with batch norm, and an identical copy."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return net, copy.deepcopy(net)


def test_a_torch_module_trains_as_a_torch_loop_would():
    torch = pytest.importorskip("torch")
    net, twin = batch_norm_net(torch)
    x, y = data()
    sgd = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    twin.train()
    expected = []
    for bx, by in batches(x, y):
        loss = torch.nn.functional.cross_entropy(twin(torch.as_tensor(bx)), torch.as_tensor(by))
        sgd.zero_grad()
        loss.backward()
        sgd.step()
        expected.append(loss.item())
    history = fit(net, (x, y), optimizer="momentum", lr=0.1, batch_size=8, shuffle=False, verbose=0)
    assert history.model is net
    np.testing.assert_allclose(history.steps, expected, rtol=1e-5, atol=1e-6)
    for (name, ours), theirs in zip(net.state_dict().items(), twin.state_dict().values()):
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_keras_model_trains_as_a_gradient_tape_loop_would():
    tf = pytest.importorskip("tensorflow")
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    twin = keras.models.clone_model(model)
    twin.set_weights(model.get_weights())
    x, y = data()
    expected = []
    for bx, by in batches(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(by, twin(bx, training=True)))
        grads = tape.gradient(loss, twin.trainable_variables)
        for variable, grad in zip(twin.trainable_variables, grads):
            variable.assign(variable - 0.1 * grad)
        expected.append(float(loss))
    history = fit(model, (x, y), optimizer="sgd", lr=0.1, batch_size=8, shuffle=False, verbose=0)
    assert history.model is model
    np.testing.assert_allclose(history.steps, expected, rtol=1e-5, atol=1e-6)
    for ours, theirs in zip(model.get_weights(), twin.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_jax_pair_with_nested_params_trains_as_a_jax_loop_would():
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    rng = np.random.default_rng(1)
    params = {
        "hidden": {"w": jnp.asarray(rng.normal(size=(6, 16)).astype("float32") * 0.3), "b": jnp.zeros(16)},
        "out": {"w": jnp.asarray(rng.normal(size=(16, 2)).astype("float32") * 0.3), "b": jnp.zeros(2)},
    }

    def apply(p, x):
        return jax.nn.relu(x @ p["hidden"]["w"] + p["hidden"]["b"]) @ p["out"]["w"] + p["out"]["b"]

    def loss_of(p, x, y):
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(apply(p, x)), y[:, None], axis=1))

    x, y = data()
    mine, expected = params, []
    for bx, by in batches(x, y):
        loss, grads = jax.value_and_grad(loss_of)(mine, bx, by)
        mine = jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, mine, grads)
        expected.append(float(loss))
    history = fit((apply, params), (x, y), optimizer="sgd", lr=0.1, batch_size=8, shuffle=False, verbose=0)
    trained_apply, trained = history.model
    assert trained_apply is apply and set(trained) == {"hidden", "out"}
    np.testing.assert_allclose(history.steps, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(trained["out"]["w"], mine["out"]["w"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["torch", "jax", "tensorflow"])
def test_bfloat16_compute_keeps_float32_master_weights(name):
    pytest.importorskip(name)
    x, y = data()
    settings = dict(hidden=[16], inputs=6, classes=2, seed=0, backend=name)
    full = fit(models.build("mlp", **settings), (x, y), epochs=3, shuffle=False, verbose=0)
    model = models.build("mlp", **settings)
    half = fit(model, (x, y), epochs=3, shuffle=False, verbose=0, precision="bfloat16")
    assert {model.ops.dtype(v) for v in model.params.values()} == {"float32"}
    assert half["loss"] != full["loss"]  # bfloat16 really ran: rounding shows in the loss
    np.testing.assert_allclose(half["loss"], full["loss"], rtol=2e-2)
    assert half["loss"][-1] < half["loss"][0]


def test_bfloat16_where_it_cannot_run_is_a_clear_error():
    with pytest.raises(ConfigurationError, match="no bfloat16"):
        fit(models.build("mlp", hidden=[4], inputs=6, classes=2), data(), precision="bfloat16", verbose=0)
    with pytest.raises(ConfigurationError, match="Valid choices: float32, bfloat16, float16"):
        fit(models.build("mlp", hidden=[4], inputs=6, classes=2), data(), precision="float8", verbose=0)


def test_a_torch_module_with_batch_norm_trains_in_bfloat16():
    torch = pytest.importorskip("torch")
    net, twin = batch_norm_net(torch)
    x, y = data()
    full = fit(twin, (x, y), epochs=3, shuffle=False, verbose=0)
    half = fit(net, (x, y), epochs=3, shuffle=False, verbose=0, precision="bfloat16")
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    assert net[1].running_mean.dtype == torch.float32 and net[1].running_mean.abs().sum() > 0
    np.testing.assert_allclose(net[1].running_mean.numpy(), twin[1].running_mean.numpy(), atol=5e-2)
    assert half["loss"] != full["loss"]
    np.testing.assert_allclose(half["loss"], full["loss"], rtol=3e-2)


@pytest.mark.multi_device
def test_a_keras_model_is_not_trained_somewhere_else_than_asked():
    """TensorFlow cannot move a variable once made: asking for another device is an error, not a silent no."""
    tf = pytest.importorskip("tensorflow")
    import keras

    with tf.device("/CPU:0"):
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(2)])
    with pytest.raises(ConfigurationError, match="variables are not on the device asked for.*cpu:1"):
        fit(model, data(), device="cpu:1", verbose=0)
    assert fit(model, data(), device="cpu:0", verbose=0).epochs  # where it was built: fine
