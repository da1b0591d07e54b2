"""Discovery: the machine view starts nothing; each framework's own view; clear misses."""

import pytest

import xdevice
from xdevice import DeviceNotFound
from xdevice._discovery import visible_gpu_indices


def test_the_machine_has_a_cpu_with_facts():
    cpu = xdevice.devices(kind="cpu")[0]
    assert str(cpu) == "cpu:0"
    assert cpu.memory_total and cpu.memory_total > 2**30
    assert 0 < cpu.memory_free <= cpu.memory_total
    assert set(cpu.backends) == set(xdevice.backends())


def test_each_framework_reports_its_own_view(backend):
    seen = xdevice.devices(backend=backend.name)
    assert xdevice.Device("cpu", 0) in seen
    assert all(d.backends == (backend.name,) for d in seen)


def test_virtual_cpu_devices_show_in_the_framework_view(backend):
    # tests run with xdevice_cpu_devices = 4 (pyproject.toml)
    if not backend.supports_virtual_devices:
        pytest.skip(f"{backend.name} has no in-process virtual devices")
    cpus = xdevice.devices(kind="cpu", backend=backend.name)
    assert [str(d) for d in cpus] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]


def test_the_framework_view_carries_the_machine_facts(backend):
    cpu = xdevice.devices(backend=backend.name)[0]
    assert cpu.memory_total == xdevice.devices()[0].memory_total


def test_find_returns_the_existing_device():
    assert xdevice.find("/device:CPU:0") == xdevice.Device("cpu", 0)


def test_find_of_a_missing_device_lists_those_that_exist():
    missing = f"gpu:{len(xdevice.devices(kind='gpu'))}"  # one past the last GPU
    with pytest.raises(DeviceNotFound) as caught:
        xdevice.find(missing)
    assert "Valid choices: cpu:0" in str(caught.value)
    assert f"No device {missing}" in str(caught.value)


def test_an_index_past_the_last_device_of_a_framework_is_refused(backend):
    count = len(xdevice.devices(kind="cpu", backend=backend.name))
    with pytest.raises(DeviceNotFound, match=f"No device cpu:{count} on backend"):
        xdevice.find(f"cpu:{count}", backend=backend.name)


def test_an_unknown_kind_filter_is_refused():
    with pytest.raises(DeviceNotFound, match="Did you mean 'gpu'"):
        xdevice.devices(kind="gpus")


@pytest.mark.parametrize("env, expected", [
    (None, [0, 1, 2]), ("", []), ("2,0", [2, 0]), ("GPU-b", [1]), ("1,9,0", [1]),
    ("0,0", [0]), ("GPU-", []), ("-1", []),
])
def test_cuda_visible_devices_is_read_the_way_cuda_reads_it(env, expected, monkeypatch):
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        assert visible_gpu_indices(["GPU-a", "GPU-b", "GPU-c"]) == expected
    else:
        assert visible_gpu_indices(["GPU-a", "GPU-b", "GPU-c"], env=env) == expected
