"""Tensor parallel (``mesh={"data": d, "model": m}``): the zoo transformers' attention and MLP
layers split over the mesh's ``model`` axis train as on one device, each device holding whole
heads of the query, key and value (also where they are one fused ``attn.qkv``) and computing
its attention with no exchange before it; what leaves the trainer is in the saved layout; an
engine without a tensor-parallel layout refuses by name."""

from __future__ import annotations

import functools
import re

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, Trainer, estimate_memory, models
from xdevice.training import checkpoint

STEPS, ROWS, TOKENS = 20, 4, 8
#: the zoo's small sizes with one block; bert trains its last hidden state towards random targets (mse)
SIZES = {"bert": {"pooler": False, "layers": 1}, "gpt2": {"blocks": 1}, "llama": {"blocks": 1}}
#: the query projection: bert's and gpt2's fused with the key and value (``[q | k | v]``), llama's alone
QUERY = {"bert": "layer0.attn.qkv.weight", "gpt2": "block0.attn.qkv.weight", "llama": "block0.attn.q.weight"}
HEAD = 8  # the head size of the zoo's small transformers (width 32, 4 heads)


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


def assert_whole_heads(trainer, name: str, model: int) -> None:
    """Each device's part of the query projection is the same whole heads of q, k and v: the
    same ``width / model`` columns of each (heads ``i * heads / model ..``), not a block of the
    side-by-side ``[q | k | v]`` (which would give device 0 q and half of k)."""
    key = QUERY[name]
    saved = trainer.weights()[key]  # (width, 3 * width) fused, (width, heads * head size) alone
    parts = 3 if ".qkv." in key else 1
    width = saved.shape[1] // parts
    by_part = saved.reshape(saved.shape[0], parts, width)
    held = trainer.program.params[key]
    starts = set()
    for shard in held.addressable_shards:
        start, stop, _ = shard.index[-1].indices(held.shape[-1])
        assert stop - start == width // model and start % HEAD == 0, shard.index  # whole heads
        np.testing.assert_array_equal(
            np.asarray(shard.data).reshape(by_part.shape[0], parts, -1), by_part[..., start:stop]
        )
        starts.add(start)
    assert len(starts) == model  # each column of the mesh its own heads
    assert trainer.state[f"m/{key}"].sharding.spec == held.sharding.spec  # Adam's slots alike


@pytest.mark.multi_device
@pytest.mark.parametrize(
    "name, mesh",
    [
        pytest.param("gpt2", {"data": 2, "model": 2}, id="gpt2-data2-model2"),
        pytest.param("gpt2", {"model": 4}, id="gpt2-model4"),  # one head of q, k and v per device
        # the others: make test-models (each a compile of a 20-step fit on both sides)
        pytest.param("llama", {"model": 2}, id="llama-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"data": 2, "model": 2}, id="bert-data2-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"model": 2}, id="bert-model2", marks=pytest.mark.realworld),
        pytest.param("bert", {"model": 4}, id="bert-model4", marks=pytest.mark.realworld),
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
    for key, value in trainer.weights().items():  # in the saved layout, (width, 3 * width) for qkv
        assert value.shape == weights[key].shape, key
        np.testing.assert_allclose(value, weights[key], rtol=0, atol=1e-5, err_msg=key)
    # and the layers were split by heads: the query's (and key's and value's) columns over "model"
    assert_whole_heads(trainer, name, mesh["model"])


def collectives(compiled_text: str) -> dict[str, int]:
    """How many of each cross-device operation a compiled XLA program runs."""
    kinds = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")
    return {kind: len(re.findall(rf" {kind}(-start)?\(", compiled_text)) for kind in kinds}


@pytest.mark.multi_device
@pytest.mark.parametrize("name, model", [("gpt2", 2), ("bert", 4), ("llama", 2)])
def test_a_split_attention_exchanges_nothing_but_the_sums_after_its_row_layers(jax_devices, name, model):
    # Megatron-LM's layout: each device projects, attends and projects back with its own heads;
    # the only cross-device operations of a forward and backward pass are all-reduces (the sums
    # after attn.out and the MLP's closing layer, and of the input gradients), no gather or
    # shuffle of activations to line up heads
    import jax
    import jax.numpy as jnp

    trainer = Trainer(build(name), devices=jax_devices[:model], mesh={"model": model})
    program = trainer.program
    x = data(name)[0][:ROWS]

    def loss(params):
        return jnp.mean(program.forward(params, program.buffers, x, True)[0] ** 2)

    found = collectives(jax.jit(jax.grad(loss)).lower(program.params).compile().as_text())
    assert found["all-reduce"] > 0
    assert {k: v for k, v in found.items() if k != "all-reduce"} == dict.fromkeys(found.keys() - {"all-reduce"}, 0)


@pytest.mark.multi_device
def test_a_first_fit_learns_the_output_shape_without_gathering_the_split_weights(jax_devices, monkeypatch):
    # a language model declares no output width: the first fit learns it from the model, by
    # shape evaluation on the split arrays as held, not from a forward pass on gathered ones
    # (across processes that gather puts the whole model on every device)
    trainer = Trainer(build("gpt2"), "cross_entropy", "sgd", devices=jax_devices[:2], mesh={"model": 2})
    gathered = []
    whole = trainer.replicas.whole
    monkeypatch.setattr(trainer.replicas, "whole", lambda arrays: gathered.append(sorted(arrays)) or whole(arrays))
    x, y = data("gpt2")
    trainer.fit((x[:ROWS], y[:ROWS]), epochs=1, batch_size=ROWS, verbose=0, seed=0)
    assert gathered == []
    assert trainer.rules.shape == (TOKENS, build("gpt2", "numpy").spec["vocab"])


@pytest.mark.multi_device
def test_a_model_split_by_a_trainer_holds_the_split_arrays_from_the_start(jax_devices):
    # the model's whole arrays are let go of as soon as the trainer holds their parts, not after
    # the first step: across processes the whole beside the parts is a second model in each
    model = build("gpt2")
    trainer = Trainer(model, "cross_entropy", "sgd", devices=jax_devices[:2], mesh={"model": 2})
    key = QUERY["gpt2"]
    assert model.params[key] is trainer.program.params[key]
    assert not model.params[key].sharding.is_fully_replicated  # split over "model"


@pytest.mark.multi_device
def test_what_leaves_a_tensor_parallel_trainer_is_in_the_saved_layout(jax_devices, tmp_path):
    trainer = Trainer(build("gpt2"), "cross_entropy", "adam", devices=jax_devices[:2], mesh={"model": 2})
    x, y = data("gpt2")
    history = trainer.fit((x[: 2 * ROWS], y[: 2 * ROWS]), epochs=1, batch_size=ROWS, verbose=0, seed=0)
    key = QUERY["gpt2"]
    assert trainer.program.params[key].shape == (32, 3, 32)  # held by its parts while training
    model = history.model
    assert model.params[key].shape == (32, 96) and model.params[key.replace("weight", "bias")].shape == (96,)
    np.testing.assert_array_equal(np.asarray(model.params[key]), trainer.weights()[key])
    model.save(str(tmp_path / "model.safetensors"))
    assert models.load(str(tmp_path / "model.safetensors"), backend="numpy").params[key].shape == (32, 96)
    trainer.save(str(tmp_path / "checkpoint"))
    arrays, state, _ = checkpoint.read(str(tmp_path / "checkpoint"))
    assert arrays[f"param/{key}"].shape == state[f"m/{key}"].shape == state[f"v/{key}"].shape == (32, 96)
    # it loads on one device, and back into a tensor-parallel trainer
    alone = Trainer(build("gpt2"), "cross_entropy", "adam").load(str(tmp_path / "checkpoint"))
    again = Trainer(build("gpt2"), "cross_entropy", "adam", devices=jax_devices[:2], mesh={"model": 2})
    again.load(str(tmp_path / "checkpoint"))
    for key, value in trainer.weights().items():
        np.testing.assert_array_equal(alone.weights()[key], value, err_msg=key)
        np.testing.assert_array_equal(again.weights()[key], value, err_msg=key)
    assert again.program.params[QUERY["gpt2"]].shape == (32, 3, 32)


@pytest.mark.parametrize("name", ["bert", "gpt2", "transformer", "vit"])
def test_a_transformer_computes_the_same_with_its_fused_qkv_held_by_parts(name):
    model = models.build(name, backend="numpy", seed=0, **getattr(models.definition(name), "SMALL", {}))
    x = model.example_input(2)
    by_parts = dict(model.params)
    for key, value in model.params.items():
        if ".attn.qkv." in key:  # (width, 3 * width) -> (width, 3, width); (3 * width,) -> (3, width)
            by_parts[key] = value.reshape(*value.shape[:-1], 3, value.shape[-1] // 3)
    assert sum(v.shape != model.params[k].shape for k, v in by_parts.items()) == 2 * model.spec.get(
        "layers", model.spec.get("blocks")
    )
    np.testing.assert_allclose(model.apply(model.ops, by_parts, x), model(x), rtol=1e-6, atol=1e-6)


@pytest.mark.multi_device
def test_a_mesh_of_four_model_devices_splits_rows_and_columns(jax_devices):
    params = Trainer(build("llama"), devices=jax_devices, mesh={"model": 4}).program.params
    assert tuple(params["block0.mlp.up.weight"].sharding.spec) == (None, "model")  # columns
    assert tuple(params["block0.mlp.down.weight"].sharding.spec) == ("model",)  # rows
    assert params["norm.scale"].is_fully_replicated


@pytest.mark.multi_device
@pytest.mark.parametrize("name, model", [("llama", 4), ("gpt2", 2)])
def test_the_token_embedding_is_split_by_vocabulary_over_the_model_axis(jax_devices, name, model):
    # Megatron-LM's VocabParallelEmbedding: device i of the model axis holds the vocabulary's rows
    # i * vocab / m .. (i + 1) * vocab / m (and their Adam slots), not a whole copy of the table
    trainer = Trainer(build(name), "cross_entropy", "adam", devices=jax_devices[:model], mesh={"model": model})
    table, whole = trainer.program.params["tokens.weight"], build(name, "numpy").params["tokens.weight"]
    rows = whole.shape[0] // model
    starts = []
    for shard in table.addressable_shards:
        assert shard.data.shape == (rows, whole.shape[1]), shard.index
        start = shard.index[0].start or 0
        np.testing.assert_array_equal(np.asarray(shard.data), whole[start : start + rows])
        starts.append(start)
    assert sorted(starts) == [i * rows for i in range(model)]
    assert trainer.state["m/tokens.weight"].sharding.spec == table.sharding.spec


@pytest.mark.multi_device
def test_a_vocabulary_the_model_axis_does_not_divide_keeps_the_embedding_whole(jax_devices):
    vocab = models.definition("bert").SMALL["vocab"]  # 99: no even split over 2 (gpt2's real 50,257 neither)
    params = Trainer(build("bert"), devices=jax_devices[:2], mesh={"model": 2}).program.params
    assert vocab % 2 and params["tokens.weight"].is_fully_replicated


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


@pytest.mark.parametrize(
    "mesh, said",
    [
        ({"model": 2, "tensor": 2}, "A mesh names its axes and their sizes"),
        ({"modle": 2}, "Did you mean 'model'"),
        ({"model": 2.0}, "A mesh's axis sizes are positive ints"),
        ([2, 2], "A mesh names its axes and their sizes"),
    ],
    ids=["axis", "misspelt", "size", "list"],
)
def test_a_malformed_mesh_is_refused_for_what_it_is_before_anything_else(mesh, said):
    # PyTorch in one process refuses a model axis with the launch that works; a mesh that is no
    # mesh is refused for that first, whichever engine (PyTorch used to read its sizes first)
    pytest.importorskip("torch")
    with pytest.raises(ConfigurationError, match=said):
        xdevice.training.replicate(backend="torch", mesh=mesh)


@pytest.mark.parametrize("name", ["tensorflow"])  # torch splits across processes: test_torch_tensor_parallel
def test_an_engine_without_tensor_parallel_refuses_a_model_axis_by_name(name):
    if name not in xdevice.backends():  # type: ignore[operator]  # the package is callable
        pytest.skip(f"{name} is not installed")
    engine = xdevice.backend(name)
    with pytest.raises(ConfigurationError) as refused:
        Trainer(build("gpt2", name), devices=["cpu:0", "cpu:1"], mesh={"model": 2})
    said = str(refused.value)
    assert f"{engine.title} has no tensor-parallel layout" in said and "'model': 2" in said
