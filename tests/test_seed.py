"""xdevice.seed(n): Python, NumPy and every framework seeded at once (a framework imported later
as it loads), and n the default seed of model weights and data order."""

from __future__ import annotations

import random

import numpy as np
import pytest

import xdevice
from xdevice import ConfigurationError, _seed, models


@pytest.fixture(autouse=True)
def seed_put_back():
    """seed() is process-wide: the tests after these get xdevice's default seed (0) back."""
    yield
    _seed._seed = None
    _seed._seeded.clear()


def global_draw(name: str) -> np.ndarray:
    """Three numbers from the framework's own global random state."""
    if name == "torch":
        import torch

        return torch.rand(3).numpy()
    if name == "tensorflow":
        import tensorflow as tf

        return tf.random.uniform([3]).numpy()
    return np.random.rand(3)


def test_seed_seeds_python_and_numpy():
    xdevice.seed(11)
    first = (random.random(), np.random.rand())
    xdevice.seed(11)
    assert (random.random(), np.random.rand()) == first


def test_seed_seeds_the_frameworks_global_random_state(backend):
    if backend.name == "jax":
        pytest.skip("JAX has no global random state: its keys come from xdevice's default seed")
    xdevice.seed(5)
    first = global_draw(backend.name)
    xdevice.seed(5)
    np.testing.assert_array_equal(global_draw(backend.name), first)
    xdevice.seed(6)
    assert not np.array_equal(global_draw(backend.name), first)


def test_the_seed_becomes_the_default_seed_of_a_models_weights(backend):
    xdevice.seed(5)
    drawn = models.build("mlp", backend=backend.name, hidden=[8], inputs=4, classes=3).numpy_params()
    given = models.build("mlp", backend="numpy", hidden=[8], inputs=4, classes=3, seed=5).numpy_params()
    for key, value in given.items():
        np.testing.assert_array_equal(drawn[key], value, err_msg=key)


def test_without_seed_the_default_seed_stays_0():
    drawn = models.build("mlp", hidden=[8], inputs=4, classes=3).numpy_params()
    given = models.build("mlp", hidden=[8], inputs=4, classes=3, seed=0).numpy_params()
    assert all(np.array_equal(drawn[k], v) for k, v in given.items())


def test_the_seed_becomes_the_default_data_order_of_fit():
    x, y = np.random.default_rng(0).normal(size=(32, 4)).astype("float32"), np.arange(32) % 3

    def losses(**seed):
        model = models.build("mlp", hidden=[8], inputs=4, classes=3, seed=0)
        return xdevice.fit(model, (x, y), epochs=2, batch_size=8, verbose=0, **seed).steps

    xdevice.seed(9)
    assert losses() == losses(seed=9) != losses(seed=0)


def test_a_framework_imported_after_seed_is_seeded_as_it_loads(run_python):
    result = run_python("""
        import sys, xdevice
        xdevice.seed(5)
        assert "torch" not in sys.modules
        import torch
        first = torch.rand(3)
        torch.manual_seed(5)
        print(bool((torch.rand(3) == first).all()))
    """)
    assert result.stdout.strip() == "True", result.stderr


@pytest.mark.parametrize("wrong", [-1, 2**32, 1.5, True, "0"])
def test_a_seed_that_is_no_non_negative_int_is_refused(wrong):
    with pytest.raises(ConfigurationError, match=r"Expected an int in \[0, 2\*\*32\)"):
        xdevice.seed(wrong)
