"""memory_stats(): bytes per framework, None where the framework cannot tell."""

import sys

import pytest

import xdevice
from xdevice import ConfigurationError


def test_cpu_memory_is_not_counted_by_any_framework_allocator(backend):
    stats = xdevice.memory_stats("cpu", backend=backend.name)
    assert stats.backend == backend.name and stats.device == xdevice.Device("cpu", 0)
    assert (stats.in_use, stats.peak, stats.limit) == (None, None, None)


def test_leaving_out_the_backend_when_several_are_loaded_asks_which():
    loaded = [name for name in ("torch", "jax", "tensorflow") if name in sys.modules]
    if len(loaded) < 2:
        pytest.skip("needs two frameworks loaded")
    with pytest.raises(ConfigurationError, match="Memory is counted per framework") as caught:
        xdevice.memory_stats("cpu")
    assert f"Valid choices: {', '.join(loaded)}" in str(caught.value)


def test_memory_stats_of_a_missing_device_is_refused(backend):
    with pytest.raises(xdevice.DeviceNotFound):
        xdevice.memory_stats("gpu:7", backend=backend.name)
