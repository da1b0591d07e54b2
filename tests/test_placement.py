"""xdevice.on(): the default device of every loaded framework, nested and per thread."""

import logging
import threading

import pytest

import xdevice
from xdevice import DeviceFallbackWarning, DeviceNotFound

# These tests watch one backend; on() also moves every other loaded framework, and those
# with a single CPU (torch) fall back with a warning that is not what is being tested.
others_fall_back = pytest.mark.filterwarnings("ignore::xdevice.DeviceFallbackWarning")


def _new_array_device(backend):
    return backend.device_of(backend.zeros((2,)))


def _second_cpu(backend):
    if not backend.supports_virtual_devices:
        pytest.skip(f"{backend.name} has one CPU device; nothing to tell apart")
    return xdevice.Device("cpu", 1)


@pytest.mark.multi_device
@others_fall_back
def test_new_arrays_are_created_on_the_chosen_device(backend):
    target = _second_cpu(backend)
    with xdevice.on(target):
        assert _new_array_device(backend) == target
    assert _new_array_device(backend) == xdevice.Device("cpu", 0)


@pytest.mark.multi_device
@others_fall_back
def test_contexts_nest_and_unwind(backend):
    _second_cpu(backend)
    with xdevice.on("cpu:1"):
        with xdevice.on("/device:CPU:2"):
            assert _new_array_device(backend) == xdevice.Device("cpu", 2)
            assert xdevice.current_device() == xdevice.Device("cpu", 2)
        assert _new_array_device(backend) == xdevice.Device("cpu", 1)
    assert xdevice.current_device() is None


@pytest.mark.multi_device
@others_fall_back
def test_the_default_is_per_thread(backend):
    _second_cpu(backend)
    seen = {}
    inside, done = threading.Event(), threading.Event()

    def other_thread():
        inside.wait()
        seen["other"] = _new_array_device(backend)
        seen["current"] = xdevice.current_device()
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with xdevice.on("cpu:3"):
        inside.set()
        done.wait(60)
        seen["main"] = _new_array_device(backend)
    worker.join()
    assert seen == {"other": xdevice.Device("cpu", 0), "current": None, "main": xdevice.Device("cpu", 3)}


def test_a_missing_device_falls_back_to_cpu_with_a_warning_that_says_why(backend):
    missing = f"gpu:{len(xdevice.devices(kind='gpu', backend=backend.name))}"
    with pytest.warns(DeviceFallbackWarning, match=f"No device {missing} for") as caught:
        with xdevice.on(missing) as placement:
            if backend.has_default_device:
                assert _new_array_device(backend) == xdevice.Device("cpu", 0)
    assert "running on cpu:0 instead" in str(caught[0].message)
    assert placement.requested == xdevice.device(missing)


def test_soft_false_raises_listing_the_devices_and_the_nearest(backend):
    missing = f"gpu:{len(xdevice.devices(kind='gpu', backend=backend.name))}"
    with pytest.raises(DeviceNotFound) as caught:
        with xdevice.on(missing, soft=False):
            pass
    assert "Valid choices: cpu:0" in str(caught.value)
    assert "Did you mean" in str(caught.value)


def test_a_bad_device_name_is_an_error_even_when_soft():
    with pytest.raises(DeviceNotFound, match="Not a device name"):
        with xdevice.on("gpp:0"):
            pass


@others_fall_back
def test_log_reports_where_each_framework_really_placed_an_array(backend, caplog):
    if not backend.has_default_device:
        pytest.skip(f"{backend.name} has no default device to set")
    target = "cpu:1" if backend.supports_virtual_devices else "cpu:0"
    with caplog.at_level(logging.INFO, logger="xdevice"):
        with xdevice.on(target, log=True) as placement:
            pass
    assert placement.actual[backend.name] == xdevice.device(target)
    assert f"{backend.name} placed a new array on {target}" in caplog.text


def test_another_makers_gpu_name_is_read_as_a_gpu_and_the_messages_say_so():
    """``mps:0`` and ``cuda:1`` are GPUs to xdevice: a fallback or an error quotes the name as
    written and how it was read, not only the canonical one."""
    missing = len(xdevice.devices(kind="gpu"))
    with pytest.warns(DeviceFallbackWarning, match=rf"No device 'mps:{missing}' \(read as gpu:{missing}"):
        with xdevice.on(f"mps:{missing}"):
            pass
    with pytest.raises(DeviceNotFound, match=rf"'cuda:{missing}' \(read as gpu:{missing}.*Received: 'cuda:{missing}'"):
        with xdevice.on(f"cuda:{missing}", soft=False):
            pass
