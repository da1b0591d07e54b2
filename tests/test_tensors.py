"""Arrays across frameworks: which one, where, moving, and DLPack conversion without copies."""

import pytest

import xdevice
from xdevice import ConversionError, DeviceNotFound
from xdevice.testing.pytest_plugin import selected_backends

PAIRS = [(s, t) for s in selected_backends() for t in selected_backends()]


def _aligned_numpy(n=256):
    """A float32 array on a 64-byte boundary (JAX shares host memory only when so aligned)."""
    import numpy as np

    raw = np.zeros(n * 4 + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    out = raw[start : start + n * 4].view(np.float32)
    out[:] = np.arange(n, dtype=np.float32)
    return out


def _array(name, n=256):
    return xdevice.convert(_aligned_numpy(n), to=name)


def test_backend_of_names_the_framework(backend):
    assert xdevice.backend_of(_array(backend.name)) == backend.name


def test_backend_of_a_non_array_lists_the_frameworks():
    with pytest.raises(ConversionError, match="Not an array of any loaded framework"):
        xdevice.backend_of([1, 2, 3])


def test_device_of_an_array_is_its_device(backend):
    assert xdevice.device_of(_array(backend.name)) == xdevice.Device("cpu", 0)


@pytest.mark.multi_device
@pytest.mark.filterwarnings("ignore::xdevice.DeviceFallbackWarning")
def test_to_device_moves_the_array_and_keeps_its_values(backend):
    if not backend.supports_virtual_devices:
        pytest.skip(f"{backend.name} has one CPU device")
    x = _array(backend.name)
    moved = xdevice.to_device(x, "cpu:2")
    assert xdevice.device_of(moved) == xdevice.Device("cpu", 2)
    assert (backend.to_numpy(moved) == backend.to_numpy(x)).all()


def test_to_device_of_a_missing_device_is_refused(backend):
    with pytest.raises(DeviceNotFound, match="No device cpu:9"):
        xdevice.to_device(_array(backend.name), "cpu:9")


@pytest.mark.parametrize("source, target", PAIRS, ids=[f"{s}->{t}" for s, t in PAIRS])
def test_convert_on_cpu_shares_memory(source, target):
    x = _array(source)
    y = xdevice.convert(x, to=target, copy=False)
    assert xdevice.backend_of(y) == target
    assert xdevice.backend(target).data_pointer(y) == xdevice.backend(source).data_pointer(x)
    assert xdevice.backend(target).to_numpy(y).tolist() == list(range(256))


def test_copy_false_refuses_a_conversion_that_must_copy():
    if "jax" not in selected_backends():
        pytest.skip("jax not selected")
    import numpy as np

    misaligned = np.arange(65, dtype=np.float32)[1:]  # 4 bytes past an allocation: not 64-aligned
    with pytest.raises(ConversionError, match="copied the data"):
        xdevice.convert(misaligned, to="jax", copy=False)
    assert xdevice.convert(misaligned, to="jax").tolist() == misaligned.tolist()


def test_bfloat16_keeps_its_dtype_through_the_host_fallback():
    if not {"torch", "numpy"} <= set(selected_backends()):
        pytest.skip("needs torch and numpy")
    import ml_dtypes
    import torch

    x = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    y = xdevice.convert(x, to="numpy")
    assert y.dtype == ml_dtypes.bfloat16 and y.astype("float32").tolist() == [1.5, -2.0, 3.25]


@pytest.mark.parametrize("target", selected_backends())
def test_bfloat16_numpy_arrays_convert_to_every_backend(target):
    import ml_dtypes
    import numpy as np

    x = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    y = xdevice.convert(x, to=target)
    back = xdevice.backend(target).to_numpy(y)
    assert back.dtype == ml_dtypes.bfloat16 and back.astype("float32").tolist() == [1.5, -2.0, 3.25]


def test_convert_to_an_unknown_backend_suggests_the_name():
    with pytest.raises(xdevice.BackendUnavailable, match="Did you mean 'torch'"):
        xdevice.convert(_aligned_numpy(), to="troch")


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "bfloat16"])
def test_narrow_torch_floats_reach_numpy_with_their_bits(dtype):
    torch = pytest.importorskip("torch")
    import numpy as np

    tensor = torch.tensor([1.5, -2.0, 0.25]).to(getattr(torch, dtype))
    array = xdevice.convert(tensor, "numpy")
    assert array.dtype.name == dtype
    np.testing.assert_array_equal(array.astype(np.float32), [1.5, -2.0, 0.25])
