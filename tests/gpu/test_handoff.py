"""Zero-copy hand-offs between frameworks on the GPU: each pair shares the buffer, a producer
still writing on a side stream is waited for, a torch tensor on a GPU other than torch's current
one exports, and a copy that must go through the host says so (HostCopyWarning)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import xdevice
from xdevice import _registry
from xdevice._tensors import HostCopyWarning

from .conftest import needs

pytestmark = pytest.mark.gpu

FRAMEWORKS = ("torch", "jax", "tensorflow")
PAIRS = [(s, t) for s in FRAMEWORKS for t in FRAMEWORKS if s != t]


def _on_gpu(name: str, values: np.ndarray, gpu: xdevice.Device):
    engine = xdevice.backend(name)
    return engine.to_device(xdevice.convert(values, to=name), gpu)


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{s}->{t}" for s, t in PAIRS])
def test_each_pair_shares_the_gpu_buffer_without_a_host_copy(source, target, gpu_device):
    needs(source, target)
    x = _on_gpu(source, np.arange(1 << 16, dtype=np.float32), gpu_device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostCopyWarning)
        y = xdevice.convert(x, to=target, copy=False)  # copy=False: a copy would raise
    assert xdevice.device_of(y) == gpu_device
    assert _registry.backend(target).to_numpy(y)[-1] == (1 << 16) - 1


@pytest.mark.parametrize("target", ["jax", "tensorflow"])
def test_a_torch_tensor_written_on_a_side_stream_arrives_complete(target, gpu_device):
    """The consumer reads only after torch's stream finished: a race shows as stale values."""
    needs("torch", target)
    import torch

    with torch.cuda.device(gpu_device.index):
        side = torch.cuda.Stream()
        a = torch.ones(4096, 4096, device=f"cuda:{gpu_device.index}")
        with torch.cuda.stream(side):
            x = torch.zeros(4096, device=a.device)
            for _ in range(20):  # long enough to still be running when convert returns
                x = x + (a @ a)[0] / 4096
            y = xdevice.convert(x, to=target)  # torch's current stream is the side stream
    assert np.allclose(_registry.backend(target).to_numpy(y), 20.0)


def test_a_torch_tensor_on_the_second_gpu_exports_while_torch_is_on_the_first():
    needs("torch", "jax")
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    x = torch.arange(8.0, device="cuda:1")
    with torch.cuda.device(0):
        y = xdevice.convert(x, to="jax", copy=False)
    assert xdevice.device_of(y) == xdevice.device("gpu:1")


def test_a_copy_through_the_host_on_the_gpu_is_stated(gpu_device):
    needs("torch", "tensorflow")
    strided = _on_gpu("torch", np.arange(64, dtype=np.float32), gpu_device).reshape(8, 8).T
    with pytest.warns(HostCopyWarning, match="strided"):
        y = xdevice.convert(strided, to="tensorflow")
    assert xdevice.device_of(y) == gpu_device
    assert y.numpy().tolist() == strided.cpu().numpy().tolist()
