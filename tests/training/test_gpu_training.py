"""Training on a GPU (run by `make test-gpu`; skipped without an NVIDIA GPU): one GPU trains as
the CPU does, and a model split over the GPU and the CPU trains as the whole model."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import xdevice
from xdevice import fit, models

from .test_stages import FIT, data, jax_stages

pytestmark = pytest.mark.gpu
GPU_BACKENDS = [name for name in ("torch", "jax") if name in xdevice.backends()]


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_a_zoo_model_trains_on_the_gpu_as_on_the_cpu(name):
    spec = {"hidden": [16], "inputs": 6, "classes": 2, "seed": 0}
    on_cpu, on_gpu = models.build("mlp", backend=name, **spec), models.build("mlp", backend=name, **spec)
    expected = fit(on_cpu, data(), device="cpu", **FIT)
    got = fit(on_gpu, data(), device="gpu:0", **FIT)
    assert on_gpu.device == xdevice.Device("gpu", 0)
    np.testing.assert_allclose(got.steps, expected.steps, rtol=1e-4, atol=1e-5)  # GPU kernels round differently


def test_a_torch_sequential_split_over_gpu_and_cpu_trains_as_the_whole_model():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    whole = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    split = copy.deepcopy(whole)
    expected = fit(whole, data(), **FIT)
    got = fit(split, data(), stages=["gpu:0", "cpu"], **FIT)
    assert split[0].weight.device.type == "cuda" and split[2].weight.device.type == "cpu"
    np.testing.assert_allclose(got.steps, expected.steps, rtol=1e-4, atol=1e-5)
    x = torch.tensor(data()[0][:4])
    torch.testing.assert_close(split(x.cuda()).cpu(), whole(x), rtol=1e-4, atol=1e-5)  # runs as one module


def test_jax_stages_on_gpu_and_cpu_train_as_the_whole_model():
    (first, a), (second, b) = jax_stages()
    cpu = xdevice.find("cpu", backend="jax")
    expected = fit((lambda p, x: second(p["b"], first(p["a"], x)), {"a": a, "b": b}), data(), device=cpu, **FIT)
    got = fit([(first, a), (second, b)], data(), stages=["gpu:0", "cpu"], **FIT)
    np.testing.assert_allclose(got.steps, expected.steps, rtol=1e-4, atol=1e-5)
    (_, a_trained), (_, b_trained) = got.model
    assert a_trained["w"].devices().pop().platform == "gpu"
    assert b_trained["w"].devices().pop().platform == "cpu"
