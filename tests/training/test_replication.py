"""Data parallelism in one process: N devices train exactly as one device with the same global batch."""

from __future__ import annotations

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, Trainer, models
from xdevice.training.losses import metric_function

SPEC = {"hidden": [16], "inputs": 6, "classes": 2, "seed": 0}


def data(rows: int = 96):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def train(backend: str, devices, batch_size: int = 16):
    model = models.build("mlp", backend=backend, **SPEC)
    trainer = Trainer(model, optimizer="adam", lr=0.01, devices=devices)
    history = trainer.fit(data(), epochs=2, batch_size=batch_size, validation=data(32), verbose=0)
    return history.steps + history["val_loss"] + history["loss"], model.numpy_params()


def replicating(backend):
    if not backend.supports_replication:
        pytest.skip(f"{backend.name} does not replicate within one process")
    return backend.name


@pytest.mark.multi_device
@pytest.mark.parametrize("count", [2, 4])
def test_n_devices_match_one_device_step_for_step(backend, count):
    name = replicating(backend)
    one_losses, one_params = train(name, None)
    many_losses, many_params = train(name, [f"cpu:{i}" for i in range(count)])
    assert len(many_losses) == 12 + 2 + 2  # steps, then per-epoch validation and training loss
    np.testing.assert_allclose(many_losses, one_losses, rtol=1e-5, atol=1e-6)
    for key, value in one_params.items():
        np.testing.assert_allclose(many_params[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def where_replicas_live(name: str, devices: list[str]) -> list[str]:
    """Train on ``devices`` and read from the framework itself where each replica's arrays live.

    TensorFlow runs the step once per replica (``strategy.run``): a metric, called inside the
    step, sees each replica's outputs as traced tensors placed on that replica's device. JAX
    holds one array sharded over the mesh: every trained parameter has one shard (a full
    copy) on each replica's device.
    """
    traced = []
    accuracy = metric_function("accuracy")

    def accuracy_where(ops, out, y):  # a metric, so it runs inside each replica's step
        if isinstance(getattr(out, "device", None), str) and out.device:  # a traced TF tensor's placement
            traced.append(str(xdevice.device(out.device)))
        return accuracy(ops, out, y)

    model = models.build("mlp", backend=name, **SPEC)
    trainer = Trainer(model, optimizer="adam", lr=0.01, devices=devices, metrics=[accuracy_where])
    trainer.fit(data(32), epochs=1, batch_size=16, verbose=0)
    shards = {
        str(trainer.backend.device_of(shard.data))
        for value in trainer.program.params.values()
        for shard in getattr(value, "addressable_shards", [])
    }
    return sorted(set(traced) | shards)


@pytest.mark.multi_device
def test_each_replica_lives_on_the_device_it_was_given(backend):
    name = replicating(backend)
    devices = ["cpu:1", "cpu:3"]  # not the default device, nor the first two: ignoring them shows
    assert where_replicas_live(name, devices) == devices


@pytest.mark.multi_device
def test_a_batch_that_does_not_split_evenly_trains_as_on_one_device(backend):
    name = replicating(backend)
    # TF gives replicas 6, 5 and 5 rows, weighted by their share; JAX pads to 18 and scores the 16
    one_losses, one_params = train(name, None)
    many_losses, many_params = train(name, ["cpu:0", "cpu:1", "cpu:2"], batch_size=16)
    np.testing.assert_allclose(many_losses, one_losses, rtol=1e-5, atol=1e-6)
    for key, value in one_params.items():
        np.testing.assert_allclose(many_params[key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def fit_rows(name: str, devices, rows: int = 1347):
    model = models.build("mlp", backend=name, **SPEC)
    return xdevice.fit(model, data(rows), devices=devices, epochs=2, batch_size=64, lr=0.01, verbose=0)


@pytest.mark.multi_device
def test_an_odd_number_of_rows_trains_on_two_devices_as_on_one(backend):
    name = replicating(backend)
    one, two = fit_rows(name, None), fit_rows(name, ["cpu:0", "cpu:1"])  # 1,347 rows: the last batch 3
    np.testing.assert_allclose(two["loss"], one["loss"], rtol=1e-5)
    np.testing.assert_allclose(two.steps, one.steps, rtol=1e-5)


@pytest.mark.multi_device
def test_a_model_trained_on_two_devices_runs_and_evaluates_afterwards(backend):
    name = replicating(backend)
    one, two = fit_rows(name, None), fit_rows(name, ["cpu:0", "cpu:1"])
    x, y = data(64)
    outputs = backend.ops.to_numpy(two.model(x))  # on the model's one device, as its repr says
    np.testing.assert_allclose(outputs, backend.ops.to_numpy(one.model(x)), rtol=1e-5, atol=1e-6)
    evaluated, expected = Trainer(two.model).evaluate((x, y)), Trainer(one.model).evaluate((x, y))
    assert evaluated == pytest.approx(expected, rel=1e-5)


def test_a_backend_that_cannot_replicate_in_one_process_says_which_can(backend):
    if backend.supports_replication:
        pytest.skip(f"{backend.name} replicates")
    with pytest.raises(ConfigurationError, match="data-parallel replication") as caught:
        Trainer(models.build("mlp", backend=backend.name, **SPEC), devices=["cpu:0", "cpu:1"])
    text = str(caught.value)
    assert "backends=[...]" not in text  # Trainer has no backends=: the advice names what exists
    if backend.supports_processes:  # PyTorch: the launcher runs one replica per process
        assert "`xdevice launch --nproc-per-node 2 your_script.py`" in text
        assert "leave devices= out" in text
    else:
        assert "train on one device" in text
