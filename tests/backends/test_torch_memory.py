"""PyTorch's memory settings touch only the GPUs given a limit, and read facts from NVML, not CUDA.

Asking CUDA (``torch.cuda.is_available()``, ``mem_get_info``) would start it: ``cuInit`` fixes
``CUDA_VISIBLE_DEVICES`` for the process, and a context on a GPU another process holds in
EXCLUSIVE_PROCESS mode fails. The GPUs here are made up (a ``Device`` with the
``memory_total`` NVML reports); the CUDA calls that must not happen raise if they do.
"""

from __future__ import annotations

import pytest

import xdevice
from xdevice._device import Device
from xdevice._types import Config

torch = pytest.importorskip("torch")

from xdevice.backends.torch.memory import memory_fractions  # noqa: E402 (after the skip: it imports torch)

GIB = 2**30
GPUS = [Device("gpu", 0, memory_total=8 * GIB), Device("gpu", 1, memory_total=8 * GIB)]
cpu_build_only = pytest.mark.skipif(
    torch.backends.cuda.is_built(), reason="on a CUDA build the settings reach the GPU (tests/gpu/test_memory.py)"
)


@pytest.fixture
def cuda_untouchable(monkeypatch):
    """torch's CUDA queries that start CUDA or open a context, made to fail the test if called."""
    for name in ("is_available", "mem_get_info", "init"):

        def called(*args, _name=name, **kwargs):
            raise AssertionError(f"torch.cuda.{_name} was called")

        monkeypatch.setattr(torch.cuda, name, called)


def test_a_limit_for_one_gpu_touches_that_gpu_only():
    chosen = memory_fractions(Config.make(memory_limit={"gpu:1": "2GiB"}), GPUS)

    assert [(str(gpu), limit, fraction) for gpu, limit, fraction in chosen] == [("gpu:1", 2 * GIB, 0.25)]


def test_one_limit_for_all_applies_to_every_gpu_and_caps_at_the_whole_gpu():
    chosen = memory_fractions(Config.make(memory_limit="16GiB"), GPUS)

    assert [(str(gpu), fraction) for gpu, _, fraction in chosen] == [("gpu:0", 1.0), ("gpu:1", 1.0)]


def test_a_gpu_of_unknown_size_is_left_alone():
    assert memory_fractions(Config.make(memory_limit="2GiB"), [Device("gpu", 0)]) == []


@cpu_build_only
def test_configuring_memory_does_not_ask_cuda_whether_there_is_a_gpu(cuda_untouchable):
    rows = xdevice.backend("torch").configure_memory(Config.make(memory_limit="2GiB"), GPUS)

    assert [(row.setting, row.how) for row in rows] == [("memory_limit", "skipped")]
    assert "has no CUDA" in rows[0].detail
    assert not torch.cuda.is_initialized()


@cpu_build_only
def test_memory_stats_take_the_gpu_size_from_nvml_without_starting_cuda(cuda_untouchable):
    stats = xdevice.backend("torch").memory_stats(GPUS[1])

    assert (stats.in_use, stats.limit) == (0, 8 * GIB)
    assert not torch.cuda.is_initialized()
