"""PyTorch places a host batch bound for a CUDA device through pinned memory, without
blocking; every other move is a plain ``Tensor.to``. The copy itself needs a GPU
(tests/gpu/test_training.py); the decision is checked here."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from xdevice.backends.torch.placement import through_pinned_memory


def test_a_host_tensor_bound_for_cuda_goes_through_pinned_memory():
    assert through_pinned_memory("cpu", "cuda")


@pytest.mark.parametrize(
    ("source", "target"), [("cpu", "cpu"), ("cuda", "cpu"), ("cuda", "cuda"), ("cpu", "meta"), ("cpu", "mps")]
)
def test_every_other_move_is_a_plain_copy(source, target):
    assert not through_pinned_memory(source, target)


def test_a_cpu_tensor_placed_on_the_cpu_is_the_same_tensor():
    import xdevice

    torch_backend = xdevice.backend("torch")
    x = torch_backend.ops.asarray([1.0, 2.0])
    assert torch_backend.to_device(x, xdevice.device("cpu:0")) is x  # no pinning, no copy
