"""GPU paths of the device layer (run by `make test-gpu`; skipped without an NVIDIA GPU)."""

import json

import pytest

import xdevice

pytestmark = pytest.mark.gpu
GPU_BACKENDS = [name for name in ("torch", "jax") if name in xdevice.backends()]


def test_nvml_reports_the_gpu_with_its_facts():
    gpu = xdevice.devices(kind="gpu")[0]
    assert gpu.vendor == "nvidia" and gpu.name and gpu.memory_total > 2**30
    assert gpu.compute_capability and gpu.compute_capability[0] >= 3


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_the_framework_sees_the_gpu_and_places_arrays_on_it(name):
    backend = xdevice.backend(name)
    assert xdevice.Device("gpu", 0) in xdevice.devices(backend=name)
    with xdevice.on("gpu:0", soft=False):
        assert backend.device_of(backend.zeros((4,))) == xdevice.Device("gpu", 0)
    assert backend.device_of(backend.zeros((4,))) == xdevice.Device("cpu", 0)


@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_to_device_moves_an_array_to_the_gpu_and_back(name):
    backend = xdevice.backend(name)
    x = backend.zeros((8,))
    on_gpu = xdevice.to_device(x, "cuda:0")
    assert xdevice.device_of(on_gpu) == xdevice.Device("gpu", 0)
    assert xdevice.device_of(xdevice.to_device(on_gpu, "cpu")) == xdevice.Device("cpu", 0)


def test_torch_to_jax_on_the_gpu_shares_memory():
    if not {"torch", "jax"} <= set(xdevice.backends()):
        pytest.skip("needs torch and jax")
    import torch

    x = torch.arange(1024, dtype=torch.float32, device="cuda:0")
    y = xdevice.convert(x, to="jax", copy=False)
    assert xdevice.device_of(y) == xdevice.Device("gpu", 0)
    assert xdevice.backend("jax").data_pointer(y) == x.data_ptr()


def test_torch_memory_stats_count_an_allocation():
    import torch

    before = xdevice.memory_stats("gpu:0", backend="torch").in_use
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    after = xdevice.memory_stats("gpu:0", backend="torch")
    assert after.in_use - before >= 64 * 2**20 and after.peak >= after.in_use
    del block


def test_a_torch_memory_limit_is_enforced(run_python):
    result = run_python("""
        import xdevice, torch
        report = xdevice.configure(memory_limit="1GiB", backends=["torch"])
        print(report.how("torch", "memory_limit"))
        try:
            torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda:0")
            print("allocated past the limit")
        except torch.OutOfMemoryError:
            print("refused past the limit")
        print(xdevice.memory_stats("gpu:0", backend="torch").limit)
    """)
    assert result.stdout.split() == ["enforced", "refused past the limit", str(2**30)], result.stderr


def test_a_jax_memory_limit_is_a_preallocated_pool(run_python):
    if "jax" not in xdevice.backends():
        pytest.skip("needs jax")
    result = run_python("""
        import json, xdevice
        report = xdevice.configure(memory_limit="2GiB", memory_growth=False, backends=["jax"])
        stats = xdevice.memory_stats("gpu:0", backend="jax")
        print(json.dumps([report.how("jax", "memory_limit"), stats.limit, stats.limit_how]))
    """)
    how, limit, limit_how = json.loads(result.stdout)
    assert how == "pool" and limit_how == "pool"
    assert abs(limit - 2 * 2**30) < 0.05 * 2**30  # XLA rounds the fraction


def test_visible_hides_the_other_gpus_from_every_framework(run_python):
    result = run_python("""
        import xdevice
        xdevice.configure(visible=["gpu:0"], backends=["torch"])
        import torch
        print(torch.cuda.device_count(), len(xdevice.devices(kind="gpu")))
    """)
    assert result.stdout.split() == ["1", "1"], result.stderr


def test_configuring_after_cuda_started_in_torch_is_refused(run_python):
    result = run_python("""
        import torch, xdevice
        torch.zeros(1, device="cuda")
        try:
            xdevice.configure(memory_limit="1GiB", backends=["torch"])
        except xdevice.ConfigurationError as error:
            print(error)
    """)
    assert "PyTorch already started" in result.stdout, result.stderr
