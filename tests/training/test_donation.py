"""Donation: JAX's compiled step gives the old params, buffers and optimizer state to the new
ones on a GPU or TPU (one copy in device memory, not two), and never deletes arrays someone
else holds. JAX 0.4+ donates on the CPU too, so forcing donation on (``donating``) exercises
the real path here: the inputs are deleted, the losses are those of a step that does not
donate, and the model's own arrays stay valid."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import Trainer, fit, models
from xdevice.backends.training import donating
from xdevice.training import trainer as trainer_module

SPEC = {"hidden": [16], "inputs": 6, "classes": 3, "seed": 0}
FIT = {"loss": "cross_entropy", "optimizer": "adam", "batch_size": 16, "epochs": 2, "verbose": 0, "lr": 0.01}


def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 6)).astype("float32"), rng.integers(0, 3, size=64)


def test_only_accelerators_donate():
    assert donating(["gpu"]) and donating(["tpu"]) and donating(["gpu", "gpu"])
    assert not donating(["cpu"]) and not donating(["gpu", "cpu"]) and not donating([])


@pytest.fixture
def forced(monkeypatch):
    """Donation on, as on a GPU: the CPU client of JAX donates too."""
    pytest.importorskip("jax")
    monkeypatch.setattr(trainer_module, "donating", lambda kinds: True)


def test_a_cpu_trainer_does_not_donate():
    pytest.importorskip("jax")
    trainer = Trainer(models.build("mlp", backend="jax", **SPEC), "cross_entropy", "adam")
    assert not trainer._donate
    before = dict(trainer.program.params)
    trainer.step(*data())
    assert not any(v.is_deleted() for v in before.values())


@pytest.mark.parametrize("accumulate", [1, 2])
def test_donating_steps_train_as_before_and_leave_the_models_arrays_valid(monkeypatch, accumulate):
    pytest.importorskip("jax")
    plain = models.build("mlp", backend="jax", **SPEC)
    expected = fit(plain, data(), accumulate=accumulate, **FIT)  # a CPU trainer: no donation
    monkeypatch.setattr(trainer_module, "donating", lambda kinds: True)
    model = models.build("mlp", backend="jax", **SPEC)
    given = dict(model.params)
    trainer = Trainer(model, "cross_entropy", "adam", accumulate=accumulate, lr=0.01)
    assert trainer._donate
    history = trainer.fit(data(), epochs=2, batch_size=16, verbose=0)
    np.testing.assert_allclose(history.steps, expected.steps, rtol=1e-6)
    assert not any(v.is_deleted() for v in given.values())  # the user's arrays, copied before the first step
    trained = history.model.params
    assert not any(v.is_deleted() for v in trained.values())
    np.testing.assert_allclose(np.asarray(trained["out.weight"]), np.asarray(plain.params["out.weight"]), rtol=1e-5)


def test_a_donating_step_deletes_its_inputs_but_not_what_was_handed_out(forced):
    trainer = Trainer(models.build("mlp", backend="jax", **SPEC), "cross_entropy", "adam")
    x, y = data()
    trainer.step(x, y)
    params, state = dict(trainer.program.params), dict(trainer.state)
    trainer.step(x, y)
    assert all(v.is_deleted() for v in params.values())  # given to the new params: one copy held
    assert all(v.is_deleted() for v in state.values())
    handed = dict(trainer.model.params)
    trainer.step(x, y)
    assert not any(v.is_deleted() for v in handed.values())
    assert np.isfinite(trainer.step(x, y))
