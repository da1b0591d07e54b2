"""MIG slices and GPUs named by UUID: a slice in ``CUDA_VISIBLE_DEVICES`` is a visible GPU with
its own memory, and ``configure(visible=...)`` names GPUs to CUDA by UUID. Checked with made-up
NVML answers (a stand-in ``pynvml`` module): the machine running the tests has no GPU."""

from __future__ import annotations

import json
import sys
import types

import pytest

from xdevice import _discovery

GiB = 2**30
CARD = "GPU-aaaaaaaa-1111-2222-3333-444444444444"
SLICES = ["MIG-bbbbbbbb-1111-2222-3333-444444444444", "MIG-cccccccc-1111-2222-3333-444444444444"]


class NVMLError(Exception):
    pass


def fake_nvml(*, mig: bool) -> types.ModuleType:
    """NVML on an 80 GiB card, in MIG mode with a 10 GiB and a 20 GiB slice (``mig=True``) or not."""
    slices = {0: (SLICES[0], "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10), 2: (SLICES[1], "… MIG 2g.20gb", 20)}
    memory = lambda gib: types.SimpleNamespace(total=gib * GiB, free=gib * GiB - 2**20)

    def slice_at(card, index):
        if index not in slices:
            raise NVMLError("NVML_ERROR_NOT_FOUND")
        return ("slice", index)

    def mig_mode(card):
        return [1 if mig else 0, 1 if mig else 0]

    nvml = types.ModuleType("pynvml")
    nvml.__dict__.update(
        NVMLError=NVMLError,
        NVML_DEVICE_MIG_ENABLE=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: ("card", index),
        nvmlDeviceGetCudaComputeCapability=lambda handle: (9, 0),
        nvmlDeviceGetMigMode=mig_mode,
        nvmlDeviceGetMaxMigDeviceCount=lambda card: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=slice_at,
        nvmlDeviceGetUUID=lambda h: CARD if h[0] == "card" else slices[h[1]][0],
        nvmlDeviceGetName=lambda h: "NVIDIA H100 80GB HBM3" if h[0] == "card" else slices[h[1]][1],
        nvmlDeviceGetMemoryInfo=lambda h: memory(80 if h[0] == "card" else slices[h[1]][2]),
    )
    return nvml


@pytest.fixture
def mig_machine(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(mig=True))
    monkeypatch.setattr(_discovery, "_driver_uuids", lambda: None)  # no runtime started
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def test_nvml_lists_each_mig_slice_with_its_own_memory_after_the_whole_gpus(mig_machine):
    listed = [(uuid, facts["memory_total"] // GiB) for uuid, facts in _discovery.nvml_physical_gpus()]
    assert listed == [(CARD, 80), (SLICES[0], 10), (SLICES[1], 20)]


def test_a_gpu_not_in_mig_mode_lists_no_slices(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(mig=False))
    assert [uuid for uuid, _ in _discovery.nvml_physical_gpus()] == [CARD]


def test_a_mig_uuid_in_cuda_visible_devices_is_a_visible_gpu_with_the_slices_memory(mig_machine, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", SLICES[1])
    (gpu,) = _discovery.nvml_gpus()
    assert (str(gpu), gpu.name, gpu.memory_total) == ("gpu:0", "… MIG 2g.20gb", 20 * GiB)


@pytest.mark.parametrize(
    ("visible", "expected"),
    [("MIG-cccc", [SLICES[1]]), ("GPU-aaaaaaaa", [CARD]), (f"{SLICES[0]},0", [SLICES[0], CARD]), ("MIG-", [])],
    ids=["slice-prefix", "card-prefix", "slice-then-number", "ambiguous-prefix"],
)
def test_a_uuid_prefix_names_the_one_gpu_or_slice_it_starts(mig_machine, monkeypatch, visible, expected):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    uuids = [uuid for uuid, _ in _discovery.nvml_physical_gpus()]
    assert [uuids[i] for i in _discovery.visible_gpu_indices(uuids)] == expected


def test_a_number_counts_whole_gpus_only_and_unset_shows_them(mig_machine):
    uuids = [CARD, *SLICES]
    assert _discovery.visible_gpu_indices(uuids, env="1") == []  # one whole GPU: 1 names nothing
    assert _discovery.visible_gpu_indices(uuids, env="0") == [0]


def test_configure_visible_names_gpus_to_cuda_by_uuid(run_python):
    result = run_python("""
        import json, os
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        import xdevice
        from xdevice import _configure, _discovery
        two = lambda: [(u, dict(name=u[:5], vendor="nvidia", memory_total=2**30, memory_free=2**30,
                                compute_capability=(9, 0))) for u in ("GPU-aaaa-0", "GPU-bbbb-1")]
        _discovery.nvml_physical_gpus = _configure.nvml_physical_gpus = two
        report = xdevice.configure(visible=["gpu:1", "gpu:0"], backends=["numpy"])
        print(json.dumps([os.environ["CUDA_VISIBLE_DEVICES"], list(report)[0].detail,
                          [d.name for d in xdevice.devices(kind="gpu")]]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    written, detail, seen = json.loads(result.stdout)
    assert written == "GPU-bbbb-1,GPU-aaaa-0" and written in detail
    assert seen == ["GPU-b", "GPU-a"]  # and discovery reads the UUIDs back in that order


def test_the_launcher_gives_each_worker_its_gpu_by_uuid(mig_machine, monkeypatch):
    from xdevice.backends.torch import agent

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(SLICES))
    assert agent._visible_gpus() == SLICES


#: nvidia-smi on the same card, for a machine without nvidia-ml-py (made-up answers)
SMI_QUERY = f"{CARD}, NVIDIA H100 80GB HBM3, 81559, 81000, 9.0\n"
SMI_LIST = (
    f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {CARD})\n"
    f"  MIG 1g.10gb     Device  0: (UUID: {SLICES[0]})\n"
    f"  MIG 2g.20gb     Device  1: (UUID: {SLICES[1]})\n"
)


@pytest.fixture
def smi_only_machine(monkeypatch):
    """No pynvml (importing it fails); nvidia-smi answers for the card in MIG mode."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(_discovery, "_run_smi", lambda *args: SMI_LIST if args == ("-L",) else SMI_QUERY)
    monkeypatch.setattr(_discovery, "_driver_uuids", lambda: None)
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")


def test_without_nvml_nvidia_smi_lists_each_mig_slice_after_the_whole_gpus(smi_only_machine):
    listed = [(uuid, facts["name"], facts["memory_total"]) for uuid, facts in _discovery.nvml_physical_gpus()]
    assert listed == [
        (CARD, "NVIDIA H100 80GB HBM3", 81559 * 2**20),
        (SLICES[0], "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 10 * 10**9),
        (SLICES[1], "NVIDIA H100 80GB HBM3 MIG 2g.20gb", 20 * 10**9),
    ]


def test_without_nvml_a_mig_uuid_in_cuda_visible_devices_is_a_visible_gpu_with_the_slices_memory(
    smi_only_machine, monkeypatch
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", SLICES[0])
    (gpu,) = _discovery.nvml_gpus()
    assert (str(gpu), gpu.memory_total, gpu.compute_capability) == ("gpu:0", 10 * 10**9, (9, 0))


def test_a_slice_line_without_its_cards_line_is_not_listed():
    cards = _discovery.smi_gpus(SMI_QUERY)
    orphan = f"  MIG 1g.10gb     Device  0: (UUID: {SLICES[0]})\n"
    assert _discovery.smi_mig_slices(orphan, cards) == []
    assert _discovery.smi_mig_slices(SMI_LIST, []) == []
