"""Donation on a GPU: JAX's compiled training step gives the old params and optimizer state to
the new ones (one copy in GPU memory, not two); the model's own arrays stay valid."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import Trainer, models

from .conftest import needs

pytestmark = pytest.mark.gpu


def test_a_jax_step_on_the_gpu_donates_the_old_params_and_state(gpu_device):
    needs("jax")
    model = models.build("mlp", backend="jax", hidden=[16], inputs=6, classes=3, seed=0, device=str(gpu_device))
    given = dict(model.params)
    trainer = Trainer(model, "cross_entropy", "adam")
    assert trainer._donate
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)).astype("float32"), rng.integers(0, 3, size=32)
    trainer.step(x, y)
    params, state = dict(trainer.program.params), dict(trainer.state)
    assert np.isfinite(trainer.step(x, y))
    assert all(v.is_deleted() for v in params.values())
    assert all(v.is_deleted() for v in state.values())
    assert not any(v.is_deleted() for v in given.values())  # the model's arrays: copied before the first step
