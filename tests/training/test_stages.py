"""Model parallelism: a sequential model split layer-wise over devices trains exactly as the
whole model on one device (virtual CPU devices stand in for GPUs)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from xdevice import ConfigurationError, Trainer, fit

FIT = {"optimizer": "adam", "lr": 0.01, "epochs": 2, "batch_size": 16, "verbose": 0}


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def weights(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        {"w": (rng.normal(size=(6, 16)) * 0.3).astype("float32"), "b": np.zeros(16, "float32")},
        {"w": (rng.normal(size=(16, 2)) * 0.3).astype("float32"), "b": np.zeros(2, "float32")},
    )


def jax_stages():
    """Two JAX stages, a dense layer with ReLU and a dense layer, as ``(apply, params)`` pairs."""
    jax = pytest.importorskip("jax")

    def first(p, x):
        return jax.nn.relu(x @ p["w"] + p["b"])

    def second(p, x):
        return x @ p["w"] + p["b"]

    a, b = weights()
    return (first, a), (second, b)


@pytest.mark.multi_device
def test_jax_stages_on_two_devices_train_as_the_whole_model():
    jax = pytest.importorskip("jax")
    (first, a), (second, b) = jax_stages()
    whole = fit((lambda p, x: second(p["b"], first(p["a"], x)), {"a": a, "b": b}), data(), **FIT)
    split = fit([(first, a), (second, b)], data(), stages=["cpu:0", "cpu:1"], **FIT)
    assert len(split.steps) == 8
    np.testing.assert_allclose(split.steps, whole.steps, rtol=1e-5, atol=1e-6)
    (_, a_trained), (_, b_trained) = split.model
    _, both = whole.model
    for trained, expected in ((a_trained, both["a"]), (b_trained, both["b"])):
        for key in ("w", "b"):
            np.testing.assert_allclose(np.asarray(trained[key]), np.asarray(expected[key]), rtol=1e-5, atol=1e-6)
    assert {d.id for d in b_trained["w"].devices()} == {jax.devices("cpu")[1].id}  # stage 1 stayed on cpu:1


@pytest.mark.multi_device
def test_keras_stages_built_on_two_devices_train_as_one_model():
    tf = pytest.importorskip("tensorflow")
    keras = pytest.importorskip("keras")

    def stages(where):
        with tf.device(where[0]):
            first = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu")])
        with tf.device(where[1]):
            second = keras.Sequential([keras.Input((16,)), keras.layers.Dense(2)])
        (a, b) = weights()
        first.set_weights([a["w"], a["b"]])
        second.set_weights([b["w"], b["b"]])
        return first, second

    first, second = stages(["/CPU:0", "/CPU:0"])
    whole = keras.Sequential([keras.Input((6,)), *first.layers, *second.layers])
    expected = fit(whole, data(), **FIT)
    with pytest.raises(ConfigurationError, match="Stage 1: The TensorFlow model's variables are not on the device"):
        Trainer(list(stages(["/CPU:0", "/CPU:0"])), stages=["cpu:0", "cpu:1"])
    split = fit(list(stages(["/CPU:0", "/CPU:1"])), data(), stages=["cpu:0", "cpu:1"], **FIT)
    np.testing.assert_allclose(split.steps, expected.steps, rtol=1e-5, atol=1e-6)
    assert split.model[1].trainable_variables[0].value.device.endswith("CPU:1")
    for got, want in zip(split.model[0].get_weights() + split.model[1].get_weights(), whole.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_torch_sequential_is_cut_by_parameter_count_and_trains_as_itself():
    torch = pytest.importorskip("torch")
    from xdevice.backends.torch.training import _balanced

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
    )
    cut = _balanced(model, 2)
    assert [len(stage) for stage in cut] == [2, 3]  # 448 parameters, then 1040 + 34
    assert [len(stage) for stage in _balanced(model, 5)] == [1, 1, 1, 1, 1]
    split = copy.deepcopy(model)
    whole = fit(model, data(), **FIT)
    staged = fit(split, data(), stages=["cpu", "cpu"], **FIT)
    np.testing.assert_allclose(staged.steps, whole.steps, rtol=1e-6, atol=1e-7)
    assert staged.model is split  # trained in place, and still runs as one module
    x = torch.tensor(data()[0][:4])
    torch.testing.assert_close(split(x), model(x))


def test_what_cannot_be_split_says_why():
    torch = pytest.importorskip("torch")
    with pytest.raises(ConfigurationError, match="needs a sequential model"):
        Trainer(torch.nn.Linear(6, 2), stages=["cpu", "cpu"])
    with pytest.raises(ConfigurationError, match="More stages than layers"):
        Trainer(torch.nn.Sequential(torch.nn.Linear(6, 2)), stages=["cpu", "cpu"])
    with pytest.raises(ConfigurationError, match="One device per stage"):
        Trainer([torch.nn.Linear(6, 4), torch.nn.Linear(4, 2)], stages=["cpu"])
    with pytest.raises(ConfigurationError, match="Pass one of device="):
        Trainer(torch.nn.Sequential(torch.nn.Linear(6, 2)), devices=["cpu"], stages=["cpu"])
