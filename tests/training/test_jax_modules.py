"""Flax NNX and equinox modules train with ``fit`` and come back in the form they came in."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import fit
from xdevice.training import Trainer

jax = pytest.importorskip("jax", reason="the JAX modules need JAX")


def blobs(rows: int = 96):
    """Three separable classes in four features."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=rows)
    x = (rng.normal(size=(rows, 4)) + 2.0 * np.eye(3, 4)[y]).astype("float32")
    return x, y.astype("int32")


def cross_entropy(logits, y):
    logits = np.asarray(logits, dtype="float64")
    shifted = logits - logits.max(axis=1, keepdims=True)
    return float(np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(len(y)), y]))


def trained(module):
    """Three epochs of Adam; the trainer (its own parameters) and the loss per epoch."""
    x, y = blobs()
    trainer = Trainer(module, optimizer="adam", lr=0.01)
    history = trainer.fit((x, y), epochs=3, batch_size=16, verbose=0)
    return trainer, history, [epoch["loss"] for epoch in history.epochs]


def nnx_mlp():
    nnx = pytest.importorskip("flax.nnx", reason="the NNX test needs Flax")
    return nnx.Sequential(nnx.Linear(4, 16, rngs=nnx.Rngs(0)), nnx.relu, nnx.Linear(16, 3, rngs=nnx.Rngs(1)))


def eqx_mlp():
    eqx = pytest.importorskip("equinox", reason="the equinox test needs equinox")

    class Batched(eqx.Module):
        mlp: eqx.nn.MLP

        def __call__(self, x):
            return jax.vmap(self.mlp)(x)  # eqx.nn.MLP takes one row

    return Batched(eqx.nn.MLP(4, 3, 16, 1, key=jax.random.PRNGKey(0)))


def test_an_nnx_module_trains_in_place_and_comes_back_itself():
    module = nnx_mlp()
    x, y = blobs()
    trainer, history, losses = trained(module)
    assert history.model is module
    assert losses[-1] < losses[0]
    assert cross_entropy(module(x), y) == pytest.approx(trainer.evaluate((x, y))["loss"], rel=1e-5)


def test_an_equinox_module_trains_and_comes_back_as_a_new_module_of_its_type():
    module = eqx_mlp()
    x, y = blobs()
    before = np.asarray(module(x))
    trainer, history, losses = trained(module)
    assert type(history.model) is type(module)
    assert losses[-1] < losses[0]
    np.testing.assert_array_equal(np.asarray(module(x)), before)  # equinox modules are immutable
    assert cross_entropy(history.model(x), y) == pytest.approx(trainer.evaluate((x, y))["loss"], rel=1e-5)


def test_an_apply_pair_over_a_partitioned_equinox_module_trains_and_comes_back_as_a_pair():
    eqx = pytest.importorskip("equinox", reason="the equinox test needs equinox")
    params, static = eqx.partition(eqx_mlp(), eqx.is_inexact_array)

    def apply(p, x):
        return eqx.combine(p, static)(x)

    x, y = blobs()
    history = fit((apply, params), (x, y), optimizer="adam", lr=0.01, epochs=3, batch_size=16, verbose=0)
    trained_apply, trained_params = history.model
    assert trained_apply is apply and type(trained_params) is type(params)
    assert history.epochs[-1]["loss"] < history.epochs[0]["loss"]


@pytest.mark.parametrize("build", [nnx_mlp, eqx_mlp], ids=["nnx", "equinox"])
def test_a_module_checkpoint_loads_into_a_fresh_module_of_the_same_build(build, tmp_path):
    x, y = blobs()
    trainer, history, _ = trained(build())
    trainer.save(str(tmp_path))
    fresh = Trainer(build(), optimizer="adam", lr=0.01).load(str(tmp_path))
    np.testing.assert_allclose(np.asarray(fresh.model(x)), np.asarray(history.model(x)), rtol=1e-6, atol=1e-6)
