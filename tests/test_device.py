"""Canonical device names and every native spelling (DESIGN.md rule 3)."""

import pytest

import xdevice
from xdevice import Device, DeviceNotFound


@pytest.mark.parametrize(
    "spelling, canonical",
    [
        ("cpu", "cpu:0"),
        ("CPU:0", "cpu:0"),
        ("gpu", "gpu:0"),
        ("gpu:1", "gpu:1"),
        ("cuda", "gpu:0"),
        ("cuda:1", "gpu:1"),
        ("/GPU:1", "gpu:1"),
        ("/gpu:1", "gpu:1"),
        ("GPU:3", "gpu:3"),
        ("/device:GPU:1", "gpu:1"),
        ("/physical_device:GPU:1", "gpu:1"),
        ("/job:localhost/replica:0/task:0/device:GPU:1", "gpu:1"),
        ("/job:worker/replica:0/task:3/device:CPU:0", "cpu:0"),
        ("mps", "gpu:0"),
        ("tpu:2", "tpu:2"),
        (" cuda:2 ", "gpu:2"),
    ],
)
def test_every_spelling_parses_to_the_canonical_name(spelling, canonical):
    assert str(xdevice.device(spelling)) == canonical


@pytest.mark.parametrize("name", ["cpu:0", "gpu:0", "gpu:3"])
def test_canonical_names_round_trip_through_the_native_device(backend, name):
    wanted = xdevice.device(name)
    if wanted.kind == "gpu" and backend.name == "numpy":
        pytest.skip("numpy has no GPU device")
    if wanted.kind == "gpu" and backend.name == "jax":
        pytest.skip("JAX builds native GPU devices only for GPUs that exist")
    native = backend.native_device(wanted)
    assert xdevice.device(native) == wanted


def test_native_device_objects_of_running_frameworks_parse(backend):
    for native in [backend.native_device(d) for d in backend.list_devices()]:
        assert xdevice.device(native) in backend.list_devices()


def test_devices_compare_by_kind_and_index_only():
    assert Device("gpu", 1, name="NVIDIA H200") == xdevice.device("cuda:1")
    assert len({Device("gpu", 1), Device("gpu", 1, memory_total=5)}) == 1
    assert Device("gpu", 1) != Device("cpu", 1)


@pytest.mark.parametrize("bad", ["gpo:1", "cuda:-1", "gpu:x", "", "/job:x/device:FOO:1"])
def test_a_bad_spelling_names_the_valid_forms(bad):
    with pytest.raises(DeviceNotFound) as caught:
        xdevice.device(bad)
    text = str(caught.value)
    assert f"Received: {bad!r}" in text and "Valid choices: cpu:0, gpu:0, tpu:0" in text


def test_a_misspelt_kind_suggests_the_nearest_one():
    with pytest.raises(DeviceNotFound, match="Did you mean 'gpu:0'"):
        xdevice.device("gpo:0")


def test_an_int_is_refused_with_the_fix():
    with pytest.raises(DeviceNotFound, match="write 'gpu:N'"):
        xdevice.device(1)


def test_a_negative_index_is_refused():
    with pytest.raises(DeviceNotFound, match="whole number from 0"):
        Device("gpu", -1)
