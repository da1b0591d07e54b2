"""PyTorch's collective backend follows the devices a rank computes on, not the machine: gloo for
CPU tensors also where a GPU is present, NCCL for CUDA tensors, the rank bound to its GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from xdevice.backends.torch.replication import collective  # noqa: E402  after the skip without torch

CPU, GPU0, GPU1 = torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 1)


@pytest.mark.parametrize("cuda_available", [True, False])
def test_cpu_replicas_join_gloo_also_on_a_gpu_machine(cuda_available):
    assert collective([CPU, CPU], cuda_available=cuda_available) == ("gloo", None)


def test_a_gpu_rank_joins_nccl_bound_to_its_gpu_with_gloo_for_its_cpu_tensors():
    assert collective([GPU1, GPU1], cuda_available=True) == ("cpu:gloo,cuda:nccl", GPU1)


def test_a_rank_split_over_its_gpu_and_the_cpu_is_bound_to_the_gpu():
    assert collective([GPU0, CPU], cuda_available=True) == ("cpu:gloo,cuda:nccl", GPU0)


def test_a_cuda_device_without_an_index_is_gpu_0():
    assert collective([torch.device("cuda")], cuda_available=True) == ("cpu:gloo,cuda:nccl", GPU0)


def test_a_rank_on_several_gpus_is_bound_to_none():
    assert collective([GPU0, GPU1], cuda_available=True) == ("cpu:gloo,cuda:nccl", None)


def test_an_apple_gpu_reduces_through_gloo():
    assert collective([torch.device("mps", 0)], cuda_available=False) == ("gloo", None)


@pytest.mark.parametrize(("cuda_available", "expected"), [(True, "cpu:gloo,cuda:nccl"), (False, "gloo")])
def test_joined_before_any_tensor_each_collective_goes_by_its_tensors(cuda_available, expected):
    assert collective(None, cuda_available=cuda_available) == (expected, None)


def test_no_tensor_at_all_joins_gloo():
    assert collective([], cuda_available=True) == ("gloo", None)
