"""The GPU stream handshake of ``convert``, checked here on the CPU: each framework's export
hook hands its array to every other framework's ``from_dlpack`` and shares the buffer; only
a GPU array goes through the hook; and a host copy is stated only where it costs a GPU round
trip. The GPU side (streams, a second GPU) is tests/gpu/test_handoff.py."""

from __future__ import annotations

import warnings

import pytest

import xdevice
from xdevice import _registry
from xdevice._device import Device
from xdevice._tensors import HostCopyWarning, _copy_notice, _Handoff, _handoff
from xdevice.testing.pytest_plugin import selected_backends

GPU_FRAMEWORKS = [name for name in ("torch", "jax", "tensorflow") if name in selected_backends()]
PAIRS = [(s, t) for s in GPU_FRAMEWORKS for t in GPU_FRAMEWORKS if s != t]


def _aligned(n: int = 64):
    import numpy as np

    raw = np.zeros(n * 4 + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start : start + n * 4].view(np.float32)
    out[:] = np.arange(n, dtype=np.float32)
    return out


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{s}->{t}" for s, t in PAIRS])
def test_each_export_hook_hands_the_buffer_to_each_other_framework_without_a_copy(source, target):
    producer, consumer = _registry.backend(source), _registry.backend(target)
    x = xdevice.convert(_aligned(), to=source)
    shared = consumer.from_dlpack(_Handoff(x, producer))
    assert consumer.data_pointer(shared) == producer.data_pointer(x)
    assert consumer.to_numpy(shared).tolist() == list(range(64))


def test_tensorflow_refuses_a_consumers_stream_and_its_export_hook_drops_it():
    """torch's from_dlpack passes ``stream=`` for a GPU array: TensorFlow's own ``__dlpack__``
    raises on it, which made every TensorFlow -> torch hand-off a silent host copy."""
    if "tensorflow" not in selected_backends():
        pytest.skip("needs tensorflow")
    tf_backend = _registry.backend("tensorflow")
    x = xdevice.convert(_aligned(), to="tensorflow")
    with pytest.raises(RuntimeError, match="stream"):
        x.__dlpack__(stream=7)
    capsule = tf_backend.dlpack_export(x, 7, (1, 0))
    assert _registry.backend("numpy").from_dlpack(_Capsule(capsule)).tolist() == list(range(64))


class _Capsule:
    """A capsule as a (CPU) DLPack producer, for consumers that take only producers."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_: object):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


class _Producer:
    """A backend's placement facts, as a GPU would give them (no GPU here)."""

    def __init__(self, kind: str):
        self.kind = kind

    def device_of(self, x):
        return Device(self.kind, 0)

    def dlpack_export(self, x, stream, max_version):
        return ("exported", x, stream)


def test_only_an_array_on_a_gpu_goes_through_its_backends_export_hook():
    on_gpu = _handoff(_Producer("gpu"), "array")
    assert isinstance(on_gpu, _Handoff)
    assert on_gpu.__dlpack__(stream=5) == ("exported", "array", 5)  # the consumer's stream reaches the hook
    assert on_gpu.__dlpack__() == ("exported", "array", None)  # and so does its absence
    assert _handoff(_Producer("cpu"), "array") == "array"


def test_a_handoff_refuses_a_consumer_that_demands_a_copy():
    with pytest.raises(BufferError, match="does not copy"):
        _handoff(_Producer("gpu"), "array").__dlpack__(copy=True)


class _Target:
    title, supports_gpu = "PyTorch", True


class _Host:
    title, supports_gpu = "NumPy", False


def test_a_host_copy_off_a_gpu_is_stated_with_its_reason():
    notice = _copy_notice("TensorFlow", _Target, Device("gpu", 1), "the data is strided")
    assert notice is not None
    assert "TensorFlow -> PyTorch on gpu:1" in notice and "the data is strided" in notice and "copy=False" in notice


def test_a_copy_to_a_cpu_only_framework_or_of_a_cpu_array_is_not_announced():
    assert _copy_notice("PyTorch", _Host, Device("gpu", 0), "no GPU in NumPy") is None
    assert _copy_notice("PyTorch", _Target, Device("cpu", 0), "misaligned") is None


def test_a_cpu_host_copy_for_layout_warns_nothing():
    if not {"torch", "tensorflow"} <= set(selected_backends()):
        pytest.skip("needs torch and tensorflow")
    strided = xdevice.convert(_aligned(), to="torch").reshape(8, 8).T  # TensorFlow takes no strides
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostCopyWarning)
        copied = xdevice.convert(strided, to="tensorflow")
    assert copied.numpy().tolist() == strided.numpy().tolist()
