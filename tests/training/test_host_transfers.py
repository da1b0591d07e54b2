"""A training step's loss and metrics reach the host in one transfer, not one per value:
each transfer waits for the device to finish the step (a GPU sync)."""

from __future__ import annotations

import numpy as np

from xdevice import Trainer, models


class _CountingOps:
    """The backend's op set, counting the device-to-host copies the trainer asks for."""

    def __init__(self, ops):
        self._ops, self.transfers = ops, 0

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def to_numpy(self, x):
        self.transfers += 1
        return self._ops.to_numpy(x)


def test_one_step_brings_its_loss_and_metrics_to_the_host_in_one_transfer(backend):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    trainer = Trainer(models.build("mlp", backend=backend.name, seed=1, hidden=[4], inputs=6, classes=2))
    reference = trainer.step(x, y)  # the first step compiles; count the second
    counting = trainer.ops = _CountingOps(trainer.ops)
    loss = trainer.step(x, y)
    assert counting.transfers == 1
    assert isinstance(loss, float) and loss != reference
