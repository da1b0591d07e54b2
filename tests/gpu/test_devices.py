"""GPU paths of the device layer: discovery against ``nvidia-smi``, one numbering for xdevice and
the frameworks, placement, and zero-copy hand-off between frameworks on the GPU."""

from __future__ import annotations

import json

import pytest

import xdevice
from xdevice import _discovery

from .conftest import needs, smi, smi_uuids

pytestmark = pytest.mark.gpu


def test_xdevice_finds_the_gpus_nvidia_smi_lists_with_their_names_and_memory():
    listed = smi("name", "memory.total")
    found = xdevice.devices(kind="gpu", refresh=True)
    assert [d.name for d in found] == [name for name, _ in listed]
    assert [d.memory_total // 2**20 for d in found] == [int(mib) for _, mib in listed]  # nvidia-smi says MiB
    assert all(d.vendor == "nvidia" for d in found)


def test_each_gpu_has_the_facts_a_user_sizes_work_by():
    gpu = xdevice.devices(kind="gpu")[0]
    assert gpu.name and gpu.memory_total > 2**30 and 0 < gpu.memory_free <= gpu.memory_total
    assert gpu.compute_capability and gpu.compute_capability[0] >= 3


def test_xdevice_and_the_cuda_driver_number_the_gpus_alike(run_python):
    """Once a runtime started the driver, its numbering (by UUID) is nvidia-smi's, by PCI bus."""
    needs("torch")
    result = run_python("""
        import json, torch, xdevice
        from xdevice import _discovery
        torch.zeros(1, device="cuda")
        print(json.dumps([_discovery._driver_uuids(), [str(torch.cuda.get_device_properties(i).uuid)
                          for i in range(torch.cuda.device_count())]]))
    """)
    driver, torch_uuids = json.loads(result.stdout)
    assert driver == smi_uuids(), result.stderr[-2000:]
    assert [_discovery._uuid_key(u) for u in torch_uuids] == [_discovery._uuid_key(u) for u in driver]


def test_the_frameworks_gpu_0_is_xdevices_gpu_0(run_python):
    needs("torch")
    result = run_python("""
        import json, os, torch, xdevice
        print(json.dumps([os.environ["CUDA_DEVICE_ORDER"], torch.cuda.get_device_name(0),
                          xdevice.devices(kind="gpu")[0].name]))
    """)
    order, framework, ours = json.loads(result.stdout)
    assert order == "PCI_BUS_ID" and framework == ours, result.stderr[-2000:]


def test_the_framework_sees_the_gpu_and_places_arrays_on_it(gpu_backend, gpu_device):
    assert gpu_device in xdevice.devices(backend=gpu_backend.name)
    # the framework's own default: GPU 0 for JAX and TensorFlow, the CPU for PyTorch
    own = xdevice.Device("gpu", 0) if getattr(gpu_backend, "defaults_to_gpu", False) else xdevice.Device("cpu", 0)
    assert gpu_backend.device_of(gpu_backend.zeros((4,))) == own
    with xdevice.on(gpu_device, soft=False):
        assert gpu_backend.device_of(gpu_backend.zeros((4,))) == gpu_device
    assert gpu_backend.device_of(gpu_backend.zeros((4,))) == own  # the block left the default as it was
    with xdevice.on("cpu:0", soft=False):  # the CPU is said, not assumed
        assert gpu_backend.device_of(gpu_backend.zeros((4,))) == xdevice.Device("cpu", 0)


def test_to_device_moves_an_array_to_the_gpu_and_back(gpu_backend, gpu_device):
    x = gpu_backend.zeros((8,))
    on_gpu = xdevice.to_device(x, f"cuda:{gpu_device.index}")  # the framework's own spelling
    assert xdevice.device_of(on_gpu) == gpu_device
    assert xdevice.device_of(xdevice.to_device(on_gpu, "cpu")) == xdevice.Device("cpu", 0)


def test_torch_to_jax_on_the_gpu_shares_memory():
    needs("torch", "jax")
    import torch

    x = torch.arange(1024, dtype=torch.float32, device="cuda:0")
    y = xdevice.convert(x, to="jax", copy=False)
    assert xdevice.device_of(y) == xdevice.Device("gpu", 0)
    assert xdevice.backend("jax").data_pointer(y) == x.data_ptr()


def test_jax_to_torch_on_the_gpu_shares_memory():
    needs("torch", "jax")
    jax_backend = xdevice.backend("jax")
    with xdevice.on("gpu:0", soft=False):
        x = jax_backend.zeros((1024,))
    y = xdevice.convert(x, to="torch", copy=False)
    assert y.device.type == "cuda" and y.data_ptr() == jax_backend.data_pointer(x)


def test_torch_memory_stats_count_an_allocation():
    needs("torch")
    import torch

    before = xdevice.memory_stats("gpu:0", backend="torch").in_use
    block = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda:0")
    after = xdevice.memory_stats("gpu:0", backend="torch")
    assert after.in_use - before >= 64 * 2**20 and after.peak >= after.in_use
    del block
