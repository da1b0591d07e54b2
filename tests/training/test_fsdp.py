"""Sharded data parallel (``strategy="fsdp"``): the same math as one device, about 1/N of the
weights and optimizer state per device, and a refusal by name where an engine cannot shard."""

from __future__ import annotations

import json

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, Trainer, estimate_memory, models

SPEC = {"hidden": [16], "inputs": 6, "classes": 2, "seed": 0}
STEPS = 20


def data(rows: int = STEPS * 8):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def train(devices, strategy="replicate"):
    model = models.build("mlp", backend="jax", **SPEC)
    trainer = Trainer(model, optimizer="adam", lr=0.01, devices=devices, strategy=strategy)
    history = trainer.fit(data(), epochs=1, batch_size=8, verbose=0, seed=0)
    return trainer, history, model


def shard_bytes_on_first_device(arrays: dict) -> int:
    """What device 0 holds of ``arrays``: each array's shard there, as JAX reports it."""
    return sum(
        shard.data.nbytes for value in arrays.values() for shard in value.addressable_shards if shard.device.id == 0
    )


@pytest.mark.multi_device
@pytest.mark.parametrize("count", [2, 4])
def test_fsdp_on_n_devices_trains_as_one_device_for_20_steps(jax_devices, count):
    _, one, one_model = train(None)
    trainer, many, many_model = train(jax_devices[:count], "fsdp")
    assert len(many.steps) == STEPS
    np.testing.assert_allclose(many.steps, one.steps, rtol=1e-5)
    one_params, many_params = one_model.numpy_params(), many_model.numpy_params()
    for key, value in one_params.items():
        np.testing.assert_allclose(many_params[key], value, rtol=0, atol=1e-5, err_msg=key)
    # and it was sharded: the weight's 16 hidden units are split over the devices
    weight = trainer.program.params["dense0.weight"]
    assert [shard.data.shape for shard in weight.addressable_shards] == [(6, 16 // count)] * count


@pytest.mark.multi_device
def test_params_and_optimizer_state_stay_sharded_after_fit_until_gathered(jax_devices):
    trainer, history, model = train(jax_devices[:2], "fsdp")
    kept = trainer.program.params["dense0.weight"]
    slot = trainer.state["m/dense0.weight"]
    assert tuple(kept.sharding.spec) == tuple(slot.sharding.spec) == (None, "data")
    handed = model.params["dense0.weight"]  # the model fit returned holds the shards, not a copy
    assert len(handed.sharding.device_set) == 2 and not handed.is_fully_replicated
    gathered = trainer.gather().params["dense0.weight"]
    assert gathered.sharding.device_set == {xdevice.backend("jax").native_device(xdevice.device("cpu:0"))}
    np.testing.assert_array_equal(np.asarray(gathered), np.asarray(kept))


@pytest.mark.multi_device
def test_a_checkpoint_of_a_sharded_run_holds_whole_arrays(jax_devices, tmp_path):
    trainer, _, _ = train(jax_devices[:4], "fsdp")
    trainer.save(str(tmp_path))
    resumed = Trainer(models.build("mlp", backend="jax", **SPEC), optimizer="adam", lr=0.01)
    resumed.load(str(tmp_path))  # on one device
    for key, value in trainer.weights().items():
        np.testing.assert_array_equal(resumed.weights()[key], value)


@pytest.mark.multi_device
def test_a_checkpoint_saved_on_four_devices_resumes_sharded_on_two(jax_devices, tmp_path):
    """Saved from 4 shards, loaded into a 2-device fsdp trainer: split in 2, and the next
    epoch (optimizer state included) goes as it would have gone on the 4 devices."""
    trainer, _, _ = train(jax_devices[:4], "fsdp")
    trainer.save(str(tmp_path))
    model = models.build("mlp", backend="jax", **SPEC)
    resumed = Trainer(model, optimizer="adam", lr=0.01, devices=jax_devices[:2], strategy="fsdp").load(str(tmp_path))
    on_two = resumed.fit(data(), epochs=2, batch_size=8, verbose=0, seed=0)
    on_four = trainer.fit(data(), epochs=2, batch_size=8, verbose=0, seed=0)
    assert len(on_two.steps) == len(on_four.steps) == 2 * STEPS  # the checkpoint's history, then epoch 2
    np.testing.assert_allclose(on_two.steps[STEPS:], on_four.steps[STEPS:], rtol=1e-5)
    weight = resumed.program.params["dense0.weight"]
    assert [shard.data.shape for shard in weight.addressable_shards] == [(6, 8)] * 2
    for key, value in trainer.weights().items():
        np.testing.assert_allclose(resumed.weights()[key], value, rtol=0, atol=1e-5, err_msg=key)


@pytest.mark.multi_device
@pytest.mark.parametrize("count", [1, 2, 4])
def test_the_memory_estimate_is_what_each_device_holds_under_fsdp(jax_devices, count):
    trainer, _, _ = train(jax_devices[:count], "fsdp")
    estimate = estimate_memory(
        "mlp", batch=8, optimizer="adam", measure=False, strategy="fsdp", devices=count, **SPEC
    ).parts
    held = shard_bytes_on_first_device(trainer.program.params)
    slots = {k: v for k, v in trainer.state.items() if "/" in k}  # m/ and v/; not the step count
    assert held == estimate["parameters"] == estimate["gradients"]
    assert shard_bytes_on_first_device(slots) == estimate["optimizer state"]


def test_fsdp_holds_about_one_nth_of_the_weights_in_the_estimate():
    whole = estimate_memory("mlp", batch=8, measure=False, hidden=[256, 256], inputs=64, classes=8).parts
    for count in (2, 4):
        shard = estimate_memory(
            "mlp", batch=8, measure=False, strategy="fsdp", devices=count, hidden=[256, 256], inputs=64, classes=8
        ).parts
        for part in ("parameters", "gradients", "optimizer state"):
            assert whole[part] / count <= shard[part] < 1.01 * whole[part] / count, (part, count)


def test_estimate_memory_on_the_command_line_takes_the_strategy(capsys):
    from xdevice.cli import main

    main(
        [
            "estimate-memory",
            "mlp",
            "--batch",
            "8",
            "--backend",
            "numpy",
            "--strategy",
            "fsdp",
            "--devices",
            "2",
            "--json",
        ]
    )
    found = json.loads(capsys.readouterr().out)
    assert (found["strategy"], found["devices"]) == ("fsdp", 2)
    whole = estimate_memory("mlp", batch=8, backend="numpy").parts["parameters"]
    assert found["parts"]["parameters"] < whole


def test_an_unknown_strategy_is_refused_with_the_choices():
    with pytest.raises(ConfigurationError, match="replicate.*fsdp"):
        Trainer(models.build("mlp", backend="numpy", **SPEC), strategy="zero3")


@pytest.mark.parametrize("name", ["tensorflow", "torch"])
def test_an_engine_that_cannot_shard_in_one_process_refuses_by_name(name):
    if name not in xdevice.backends():  # type: ignore[operator]  # the package is callable
        pytest.skip(f"{name} is not installed")
    engine = xdevice.backend(name)
    if engine.supports_replication and len(xdevice.devices(backend=name)) < 2:
        pytest.skip(f"{name} sees one CPU device here")
    model = models.build("mlp", backend=name, **SPEC)
    with pytest.raises(ConfigurationError) as refused:
        Trainer(model, devices=["cpu:0", "cpu:1"], strategy="fsdp")
    said = str(refused.value)
    assert "fsdp" in said and (
        "xdevice launch" in said if name == "torch" else "Keras' distribution API shards on the JAX backend" in said
    )
