"""to_native / from_native: real framework objects that train, and exact round trips."""

from __future__ import annotations

import numpy as np
import pytest

from xdevice import ConversionError, models
from xdevice._tolerance import compare
from xdevice.testing.pytest_plugin import selected_backends


def _needs(*names):
    missing = [n for n in names if n not in selected_backends()]
    if missing:
        pytest.skip(f"needs backends {missing}")


def test_torch_native_is_a_module_with_registered_parameters_and_buffers():
    _needs("torch")
    import torch

    model = models.build("resnet")
    module = models.to_native(model, "torch")
    assert isinstance(module, torch.nn.Module)
    assert sorted(n for n, _ in module.named_parameters()) == sorted(model.trainable)
    assert sorted(n for n, _ in module.named_buffers()) == sorted(model.buffers)
    assert sorted(module.state_dict()) == sorted(model.params)


def test_tensorflow_native_is_a_module_of_variables():
    _needs("tensorflow")
    import tensorflow as tf

    model = models.build("resnet")
    module = models.to_native(model, "tensorflow")
    assert isinstance(module, tf.Module)
    assert sorted(v.name.split(":")[0] for v in module.trainable_variables) == sorted(model.trainable)
    assert len(module.variables) == len(model.params)


def test_jax_native_is_a_pure_function_and_a_pytree():
    _needs("jax")
    import jax

    model = models.build("mlp", hidden=[32])
    apply_fn, params = models.to_native(model, "jax")
    x = model.example_input(4)
    grads = jax.grad(lambda p: apply_fn(p, x).sum())(params)
    assert set(grads) == set(params) and jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(params)
    assert compare(np.asarray(jax.jit(apply_fn)(params, x)), model(x)).ok


def _train_torch(name: str, steps: int = 20):
    import torch

    model = models.build(name, seed=1)
    module = models.to_native(model, "torch")
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    rng = np.random.default_rng(2)
    losses = []
    for _ in range(steps):
        x = torch.as_tensor(model.example_input(8, seed=int(rng.integers(1 << 30))))
        labels = torch.as_tensor(rng.integers(0, 10, size=8))
        loss = torch.nn.functional.cross_entropy(module(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return model, module, losses


@pytest.mark.parametrize("name", ["cnn", "resnet", "transformer"])
@pytest.mark.parametrize("target", ["jax", "tensorflow", "numpy"])
def test_a_model_trained_with_torch_gives_the_same_outputs_elsewhere(name, target):
    _needs("torch", target)
    model, module, losses = _train_torch(name)
    trained = models.from_native(module)
    assert any((trained.numpy_params()[k] != model.numpy_params()[k]).any() for k in model.trainable)
    module.eval()
    x = model.example_input(4, seed=9)
    import torch

    with torch.no_grad():
        expected = module(torch.as_tensor(x)).numpy()
    native = models.to_native(trained, target)
    if target == "tensorflow":
        actual = native(x).numpy()
    else:
        apply_fn, params = native
        actual = np.asarray(apply_fn(params, x))
    result = compare(actual, expected)
    assert result.ok, result.describe()


def test_torch_training_lowers_the_loss():
    _needs("torch")
    _, _, losses = _train_torch("mlp", steps=30)
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_from_native_round_trips_exactly(backend):
    model = models.build("transformer", seed=4)
    back = models.from_native(models.to_native(model, backend.name))
    assert back.backend == backend.name
    assert all((back.numpy_params()[k] == model.numpy_params()[k]).all() for k in model.params)


def test_from_native_of_a_foreign_object_says_what_it_takes():
    with pytest.raises(ConversionError, match="Not a model made by xdevice.models.to_native"):
        models.from_native(object())
