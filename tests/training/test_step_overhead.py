"""A fit step does no work a hand-written loop does not: JAX's compiled step on its default CPU
takes the numpy batches as they are (``jax.jit`` places them itself, for less), and the
trainer places them only where the step runs elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import Trainer, models


class _CountingBackend:
    """The trainer's backend, counting the arrays the trainer places on a device itself."""

    def __init__(self, backend):
        self._backend, self.placed = backend, 0

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def to_device(self, x, device):
        self.placed += 1
        return self._backend.to_device(x, device)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int64")


def _trainer(device=None) -> Trainer:
    model = models.build("mlp", backend="jax", seed=1, hidden=[4], inputs=6, classes=2)
    return Trainer(model, "cross_entropy", "adam", device=device, lr=0.05)


def test_jax_on_its_default_cpu_trains_on_numpy_batches_the_trainer_never_places():
    pytest.importorskip("jax")
    x, y = _data()
    direct, placing = _trainer(), _trainer()
    placing._host_batches = False  # the batches placed by the trainer, as on any other device
    counting = direct.backend = _CountingBackend(direct.backend)

    losses = direct.fit((x, y), epochs=2, batch_size=16, verbose=0).steps

    assert counting.placed == 0
    assert losses == placing.fit((x, y), epochs=2, batch_size=16, verbose=0).steps


def test_jax_on_a_cpu_other_than_its_default_places_each_batch_where_the_step_runs(jax_devices):
    import jax

    x, y = _data()
    trainer = _trainer(device="cpu:1")
    counting = trainer.backend = _CountingBackend(trainer.backend)

    trainer.fit((x, y), epochs=1, batch_size=16, verbose=0)

    assert counting.placed == 2 * 3  # x and y of each of the 3 batches
    assert trainer.model.params["out.weight"].devices() == {jax.devices("cpu")[1]}
