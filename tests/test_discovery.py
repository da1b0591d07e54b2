"""Discovery: the machine view starts nothing; each framework's own view; clear misses."""

import json

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


def test_a_missing_virtual_cpu_device_names_configure(backend):
    # tests run with xdevice_cpu_devices = 4: cpu:7 is missing on every backend
    with pytest.raises(DeviceNotFound) as caught:
        xdevice.find("cpu:7", backend=backend.name)
    said = str(caught.value)
    assert "No device cpu:7" in said and "xdevice.configure(cpu_devices=8)" in said
    if not backend.supports_virtual_devices:
        assert "has one CPU device" in said and f"for {backend.name!r} use cpu:0" in said


def test_a_missing_cpu_device_on_the_machine_view_names_configure_and_a_framework():
    with pytest.raises(DeviceNotFound, match=r"xdevice.configure\(cpu_devices=2\) first.*backend="):
        xdevice.find("cpu:1")


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


@pytest.mark.parametrize(
    "env, expected",
    [
        (None, [0, 1, 2]),
        ("", []),
        ("2,0", [2, 0]),
        ("GPU-b", [1]),
        ("1,9,0", [1]),
        ("0,0", [0]),
        ("GPU-", []),
        ("-1", []),
    ],
)
def test_cuda_visible_devices_is_read_the_way_cuda_reads_it(env, expected, monkeypatch):
    if env is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        assert visible_gpu_indices(["GPU-a", "GPU-b", "GPU-c"]) == expected
    else:
        assert visible_gpu_indices(["GPU-a", "GPU-b", "GPU-c"], env=env) == expected


HOT_CALLS = """
    import json, importlib.metadata, sys
    import numpy as np
    import xdevice
    from xdevice import _discovery, _registry, models
    def touched(*args, **kwargs):
        raise AssertionError("a hot call read the machine again")
    arrays = [np.ones(3)] + [xdevice.convert(np.ones(3), to=n) for n in xdevice.backends() if n != "numpy"]
    models.build("mlp", hidden=[4], backend=xdevice.backends()[-1])   # the first calls read everything
    for name in ("_cpu", "nvml_physical_gpus", "nvml_gpus", "_read_keyed"):
        setattr(_discovery, name, touched)
    importlib.metadata.distributions = importlib.metadata.version = touched
    _registry.gpu_build = touched
    for x in arrays:
        xdevice.to_device(x, "cpu"), xdevice.device_of(x), xdevice.backend_of(x), xdevice.convert(x, to="numpy")
        with xdevice.on("cpu:0"):
            pass
    xdevice.find("cpu"), xdevice.devices()
    models.build("mlp", hidden=[4], backend=xdevice.backends()[-1])
    print(json.dumps("ok"))
"""


def test_no_hot_call_reads_the_machine_again_after_the_first(run_python):
    result = run_python(HOT_CALLS)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == '"ok"'


def test_configure_refreshes_what_is_visible(run_python):
    """Two GPUs as NVML would report them; hiding one with configure() is seen at once."""
    result = run_python("""
        import json
        import xdevice
        from xdevice import _configure, _discovery
        fake = lambda: [(f"GPU-{i}", dict(name=f"gpu {i}", vendor="nvidia", memory_total=2**30,
                                          memory_free=2**30, compute_capability=(9, 0))) for i in range(2)]
        _discovery.nvml_physical_gpus = _configure.nvml_physical_gpus = fake
        before = [d.name for d in xdevice.devices(kind="gpu")]
        xdevice.configure(visible=["gpu:1"], backends=["numpy"])
        print(json.dumps([before, [(str(d), d.name) for d in xdevice.devices(kind="gpu")]]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    before, after = json.loads(result.stdout)
    assert before == ["gpu 0", "gpu 1"] and after == [["gpu:0", "gpu 1"]]


def test_a_backend_installed_later_is_found_after_a_refresh(tmp_path, run_python):
    (tmp_path / "site").mkdir()
    result = run_python(f"""
        import json, pathlib, sys
        sys.path.insert(0, {str(tmp_path / "site")!r})
        import xdevice
        before = xdevice.backends()
        site = pathlib.Path({str(tmp_path / "site")!r})
        (site / "fakeframework.py").write_text("")
        dist = site / "fake_backend-1.0.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\\nName: fake-backend\\nVersion: 1.0\\n")
        (dist / "entry_points.txt").write_text(
            "[xdevice.backends]\\nfakeframework = xdevice.backends.numpy:NumpyBackend\\n")
        cached = xdevice.backends()
        xdevice.devices(refresh=True)
        print(json.dumps(["fakeframework" in before, "fakeframework" in cached, "fakeframework" in xdevice.backends(),
                          "fakeframework" in xdevice.devices()[0].backends]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == [False, False, True, True]
