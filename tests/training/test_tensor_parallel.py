"""Tensor parallel (``mesh={"data": d, "model": m}``): the zoo transformers' attention and MLP
layers split over the mesh's ``model`` axis train as on one device, each device holding its
part of the split weights, and an engine without a tensor-parallel layout refuses by name."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, Trainer, estimate_memory, models

STEPS, ROWS, TOKENS = 20, 4, 8
#: the zoo's small sizes with one block; bert trains its last hidden state towards random targets (mse)
SIZES = {"bert": {"pooler": False, "layers": 1}, "gpt2": {"blocks": 1}, "llama": {"blocks": 1}}
QUERY = {"bert": "layer0.attn.qkv.weight", "gpt2": "block0.attn.qkv.weight", "llama": "block0.attn.q.weight"}


def build(name: str, backend: str = "jax"):
    return models.build(name, backend=backend, **{**models.definition(name).SMALL, **SIZES[name]}, seed=0)


def data(name: str):
    model = build(name, "numpy")
    rng = np.random.default_rng(0)
    x = rng.integers(0, model.spec["vocab"], size=(STEPS * ROWS, TOKENS)).astype("int32")
    if name == "bert":
        return x, rng.normal(size=(STEPS * ROWS, TOKENS, model.spec["width"])).astype("float32")
    return x, np.roll(x, -1, axis=1).astype("int64")  # the next token


def train(name: str, devices=None, mesh=None):
    model = build(name)
    loss = "mse" if name == "bert" else "cross_entropy"
    # The key bias (bert, gpt2) has a gradient that is zero in exact arithmetic (softmax ignores
    # a shift shared by all keys): what it gets is rounding noise, whose sign follows the order
    # of the sums, and Adam's default eps (1e-8) turns it into full-size steps. eps=1e-6 keeps
    # those steps small; the real gradients here are far above it and step as usual.
    trainer = Trainer(model, loss, "adam", lr=1e-3, eps=1e-6, devices=devices, mesh=mesh)
    history = trainer.fit(data(name), epochs=1, batch_size=ROWS, verbose=0, seed=0)
    return trainer, history


@functools.cache
def one_device(name: str):
    trainer, history = train(name)
    return history.steps, trainer.weights()


@pytest.mark.multi_device
@pytest.mark.parametrize(
    "name, mesh",
    [
        pytest.param("gpt2", {"data": 2, "model": 2}, id="gpt2-data2-model2"),
        # the other five: make test-models (each a compile of a 20-step fit on both sides)
        pytest.param("llama", {"model": 2}, id="llama-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"data": 2, "model": 2}, id="bert-data2-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"model": 2}, id="bert-model2", marks=pytest.mark.realworld),
        pytest.param("gpt2", {"model": 2}, id="gpt2-model2", marks=pytest.mark.realworld),
        pytest.param("llama", {"data": 2, "model": 2}, id="llama-data2-model2", marks=pytest.mark.realworld),
    ],
)
def test_tensor_parallel_trains_as_one_device_for_20_steps(jax_devices, name, mesh):
    count = mesh.get("data", 1) * mesh["model"]
    trainer, history = train(name, jax_devices[:count], mesh)
    steps, weights = one_device(name)
    assert len(history.steps) == STEPS
    np.testing.assert_allclose(history.steps, steps, rtol=1e-5)
    for key, value in trainer.weights().items():
        np.testing.assert_allclose(value, weights[key], rtol=0, atol=1e-5, err_msg=key)
    # and the layers were split: the query projection's output columns over "model"
    query = trainer.program.params[QUERY[name]]
    assert tuple(query.sharding.spec) == (None, "model")
    rows, columns = query.shape
    assert {shard.data.shape for shard in query.addressable_shards} == {(rows, columns // 2)}
    assert trainer.state[f"m/{QUERY[name]}"].sharding.spec == query.sharding.spec  # Adam's slots alike


@pytest.mark.multi_device
def test_a_mesh_of_four_model_devices_splits_rows_and_columns(jax_devices):
    params = Trainer(build("llama"), devices=jax_devices, mesh={"model": 4}).program.params
    assert tuple(params["block0.mlp.up.weight"].sharding.spec) == (None, "model")  # columns
    assert tuple(params["block0.mlp.down.weight"].sharding.spec) == ("model",)  # rows
    assert params["tokens.weight"].is_fully_replicated and params["norm.scale"].is_fully_replicated


def held_on_first_device(arrays: dict) -> int:
    """What device 0 holds of ``arrays``: each array's shard there, as JAX reports it."""
    return sum(
        shard.data.nbytes for value in arrays.values() for shard in value.addressable_shards if shard.device.id == 0
    )


@pytest.mark.multi_device
@pytest.mark.parametrize("model", [1, 2, 4])
def test_the_memory_estimate_is_what_each_device_holds_under_a_model_axis(jax_devices, model):
    spec = {**models.definition("gpt2").SMALL, "seed": 0}
    mesh = {"model": model}
    trainer = Trainer(models.build("gpt2", backend="jax", **spec), devices=jax_devices[:model], mesh=mesh)
    estimate = estimate_memory("gpt2", batch=2, measure=False, mesh=mesh, **spec).parts
    assert held_on_first_device(trainer.program.params) == estimate["parameters"]
    slots = {k: v for k, v in trainer.state.items() if "/" in k}
    assert held_on_first_device(slots) == estimate["optimizer state"]


def test_a_mesh_that_does_not_fit_the_devices_is_refused():
    with pytest.raises(ConfigurationError, match="multiply to the number of devices"):
        Trainer(build("gpt2", "numpy"), devices=["cpu:0", "cpu:1"], mesh={"data": 2, "model": 2})
    with pytest.raises(ConfigurationError, match="data.*model"):
        Trainer(build("gpt2", "numpy"), devices=["cpu:0", "cpu:1"], mesh={"tensor": 2})


@pytest.mark.parametrize("name", ["tensorflow"])  # torch splits across processes: test_torch_tensor_parallel
def test_an_engine_without_tensor_parallel_refuses_a_model_axis_by_name(name):
    if name not in xdevice.backends():  # type: ignore[operator]  # the package is callable
        pytest.skip(f"{name} is not installed")
    engine = xdevice.backend(name)
    with pytest.raises(ConfigurationError) as refused:
        Trainer(build("gpt2", name), devices=["cpu:0", "cpu:1"], mesh={"model": 2})
    said = str(refused.value)
    assert f"{engine.title} has no tensor-parallel layout" in said and "'model': 2" in said
