"""A seeded fit on torch is bitwise reproducible on CPU, with more than one thread and at any thread count."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import fit, models

# Wide enough that torch parallelises the embedding gradient over two threads (an index
# backward of more than 32,768 elements), with few tokens so that rows share them.
ZOO = {
    "lstm": dict(vocab=8, embedding=64, hidden=8, length=16, classes=3),
    "transformer": dict(vocab=8, length=16, width=64, heads=2, mlp=32, blocks=1, classes=3),
}


@pytest.fixture
def two_threads():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def seeded_fit(name: str) -> tuple[list[float], dict[str, np.ndarray]]:
    model = models.build(name, backend="torch", seed=1, **ZOO[name])
    x = model.example_input(256, seed=0)
    y = x.sum(axis=1) % 3
    history = fit(model, (x, y), epochs=3, batch_size=64, lr=0.01, seed=3, verbose=0)
    return history.steps, history.model.numpy_params()


@pytest.mark.parametrize("name", list(ZOO))
def test_two_seeded_torch_fits_on_two_threads_are_bitwise_equal(two_threads, name):
    first_losses, first_weights = seeded_fit(name)
    for _ in range(2):
        losses, weights = seeded_fit(name)
        assert losses == first_losses
        for key, value in first_weights.items():
            np.testing.assert_array_equal(weights[key], value, err_msg=key)


@pytest.mark.parametrize("name", ["transformer"])  # not lstm: docs/training.md, "Reproducible runs"
def test_a_seeded_torch_fit_is_bitwise_the_same_on_one_thread_and_on_two(name):
    """The thread count does not change the sums: embedding and layer-norm gradients included
    (aten's fused layer-norm affine summed its gradients in chunks set by the threads)."""
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(seeded_fit(name))
    finally:
        torch.set_num_threads(before)
    (one_losses, one_weights), (two_losses, two_weights) = runs
    assert one_losses == two_losses
    for key, value in one_weights.items():
        np.testing.assert_array_equal(two_weights[key], value, err_msg=key)
