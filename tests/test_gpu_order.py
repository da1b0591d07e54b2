"""GPU numbering: xdevice and every framework name the same card ``gpu:N`` (NVML's PCI-bus order
and CUDA's), checked with made-up NVML and CUDA-driver answers."""

from __future__ import annotations

import json

import pytest

from xdevice import _discovery
from xdevice._discovery import cuda_numbering

# a mixed machine as NVML lists it, by PCI bus: the slower card first
MIXED = [
    ("GPU-aaaaaaaa-0000-0000-0000-000000000000", {"name": "NVIDIA T4", "compute_capability": (7, 5)}),
    ("GPU-bbbbbbbb-0000-0000-0000-000000000000", {"name": "NVIDIA H100", "compute_capability": (9, 0)}),
]
UUIDS = [uuid for uuid, _ in MIXED]


def fake_machine(monkeypatch, *, order: str | None, driver: list[str] | None) -> None:
    facts = [(u, dict(f, vendor="nvidia", memory_total=2**34, memory_free=2**34)) for u, f in MIXED]
    monkeypatch.setattr(_discovery, "nvml_physical_gpus", lambda: facts)
    monkeypatch.setattr(_discovery, "_driver_uuids", lambda: driver)
    monkeypatch.setattr(_discovery, "_warned_order", set())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if order is None:
        monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    else:
        monkeypatch.setenv("CUDA_DEVICE_ORDER", order)


def test_importing_xdevice_makes_cuda_number_gpus_by_pci_bus(run_python):
    result = run_python("""
        import os
        os.environ.pop("CUDA_DEVICE_ORDER", None)
        import xdevice
        print(os.environ["CUDA_DEVICE_ORDER"])
    """)
    assert result.stdout.split() == ["PCI_BUS_ID"], result.stderr[-2000:]


def test_a_users_explicit_order_stands(run_python):
    result = run_python(
        "import os, xdevice; print(os.environ['CUDA_DEVICE_ORDER'])", env={"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}
    )
    assert result.stdout.split() == ["FASTEST_FIRST"], result.stderr[-2000:]


@pytest.mark.parametrize(
    ("visible", "expected"),
    [(None, [0, 1]), ("1", [1]), ("1,0", [1, 0]), ("GPU-bbbb", [1])],
)
def test_under_pci_bus_order_cuda_numbers_gpus_as_nvml(visible, expected):
    assert cuda_numbering(UUIDS, device_order="PCI_BUS_ID", visible=visible) == expected


def test_under_fastest_first_the_numbering_is_unknown_until_a_runtime_starts():
    assert cuda_numbering(UUIDS, device_order="FASTEST_FIRST", visible=None) is None
    assert cuda_numbering(UUIDS[:1], device_order="FASTEST_FIRST", visible=None) == [0]  # one GPU: one order


@pytest.mark.parametrize(
    "runtime",
    [
        ["bbbbbbbb-0000-0000-0000-000000000000", "aaaaaaaa-0000-0000-0000-000000000000"],  # as torch spells them
        ["GPU-BBBBBBBB-0000-0000-0000-000000000000", "GPU-AAAAAAAA-0000-0000-0000-000000000000"],
    ],
)
def test_the_drivers_uuids_map_its_numbering_onto_nvml(runtime):
    assert cuda_numbering(UUIDS, device_order="FASTEST_FIRST", runtime_uuids=runtime) == [1, 0]


def test_the_drivers_uuids_decide_also_for_the_visible_subset():
    runtime = ["GPU-bbbbbbbb-0000-0000-0000-000000000000"]  # CUDA_VISIBLE_DEVICES=0 under FASTEST_FIRST
    assert cuda_numbering(UUIDS, device_order="FASTEST_FIRST", visible="0", runtime_uuids=runtime) == [1]


def test_a_mig_slice_nvml_does_not_list_falls_back_to_the_variables():
    runtime = ["MIG-cccccccc-0000-0000-0000-000000000000"]
    assert cuda_numbering(UUIDS, device_order="PCI_BUS_ID", visible="1", runtime_uuids=runtime) == [1]


def test_discovery_names_gpus_as_the_started_runtime_numbers_them(monkeypatch):
    fake_machine(monkeypatch, order="FASTEST_FIRST", driver=[UUIDS[1], UUIDS[0]])
    gpus = _discovery.nvml_gpus()
    assert [(str(d), d.name) for d in gpus] == [("gpu:0", "NVIDIA H100"), ("gpu:1", "NVIDIA T4")]


def test_discovery_keeps_the_pci_order_and_warns_once_when_fastest_first_is_unknowable(monkeypatch):
    fake_machine(monkeypatch, order="FASTEST_FIRST", driver=None)
    with pytest.warns(RuntimeWarning, match="CUDA_DEVICE_ORDER=FASTEST_FIRST") as caught:
        first = _discovery.nvml_gpus()
        _discovery.nvml_gpus()
    assert len(caught) == 1 and "PCI_BUS_ID" in str(caught[0].message)
    assert [d.name for d in first] == ["NVIDIA T4", "NVIDIA H100"]


def test_discovery_under_pci_bus_order_asks_nothing_of_the_driver_it_does_not_need(monkeypatch):
    fake_machine(monkeypatch, order="PCI_BUS_ID", driver=None)
    assert [d.name for d in _discovery.nvml_gpus()] == ["NVIDIA T4", "NVIDIA H100"]


def test_the_drivers_uuid_bytes_are_spelled_as_nvml_spells_them():
    assert _discovery._uuid_text(bytes.fromhex("bbbbbbbb" + "00" * 12)) == UUIDS[1]


def test_asking_the_driver_without_a_started_runtime_starts_nothing(run_python):
    """No CUDA driver here, or one not started: either way the answer is None and nothing starts."""
    result = run_python("""
        import json, sys
        from xdevice import _discovery
        print(json.dumps([_discovery._driver_uuids(), [m for m in ("torch", "jax", "tensorflow") if m in sys.modules]]))
    """)
    assert json.loads(result.stdout) == [None, []], result.stderr[-2000:]


def test_without_nvidia_ml_py_the_gpus_come_from_nvidia_smi_in_the_same_terms():
    table = "GPU-bbbb, NVIDIA H100 80GB HBM3, 81559, 80000, 9.0\nGPU-cccc, Tesla T4, 15360, 15000, 7.5\n"
    (uuid, facts), (_, second) = _discovery.smi_gpus(table)
    assert uuid == "GPU-bbbb" and facts["name"] == "NVIDIA H100 80GB HBM3"
    assert facts["memory_total"] == 81559 * 2**20 and facts["compute_capability"] == (9, 0)
    assert second["compute_capability"] == (7, 5) and second["vendor"] == "nvidia"


# -- the CUDA driver fixes what is visible once it starts, whoever starts it ---------------------

TWO_GPUS_AND_A_STARTED_DRIVER = """
    import json, os
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    import xdevice
    from xdevice import _configure, _discovery
    two = lambda: [(u, dict(name=u, vendor="nvidia", memory_total=2**30, memory_free=2**30,
                            compute_capability=(9, 0))) for u in ("GPU-aaaa", "GPU-bbbb")]
    _discovery.nvml_physical_gpus = _configure.nvml_physical_gpus = two
    _discovery.cuda_driver_started = lambda: True  # as after torch.cuda.is_available() on a GPU machine
    try:
        xdevice.configure(visible={visible!r}, backends=["numpy"])
        refused = None
    except xdevice.ConfigurationError as error:
        refused = str(error)
    in_effect = xdevice.current_config().visible
    print(json.dumps([refused, os.environ.get("CUDA_VISIBLE_DEVICES"), in_effect and [str(d) for d in in_effect]]))
"""


def test_configure_visible_after_the_cuda_driver_started_is_refused_with_the_fix(run_python):
    result = run_python(TWO_GPUS_AND_A_STARTED_DRIVER.format(visible=["gpu:1"]))
    assert result.returncode == 0, result.stderr[-3000:]
    refused, written, in_effect = json.loads(result.stdout)
    assert refused is not None and "The CUDA driver already started in this process" in refused
    assert "torch.cuda.is_available() starts it" in refused
    assert "Fix: call xdevice.configure(visible=...) at the top of your program" in refused
    assert "CUDA_VISIBLE_DEVICES=GPU-bbbb" in refused
    assert written is None and in_effect is None  # nothing was applied


def test_naming_the_gpus_cuda_already_sees_is_accepted_after_the_driver_started(run_python):
    result = run_python(TWO_GPUS_AND_A_STARTED_DRIVER.format(visible=["gpu:0", "gpu:1"]))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout)[:2] == [None, "GPU-aaaa,GPU-bbbb"]


def test_the_driver_probe_starts_nothing_and_says_not_started_in_a_fresh_process(run_python):
    result = run_python("""
        import json, sys
        from xdevice._discovery import cuda_driver_started
        print(json.dumps([cuda_driver_started(), [m for m in ("torch", "jax", "tensorflow") if m in sys.modules]]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    started, imported = json.loads(result.stdout)
    assert imported == [] and started is False  # a fresh process: nothing started CUDA


def test_torch_lists_gpus_through_nvml_until_the_driver_started(monkeypatch):
    torch = pytest.importorskip("torch")
    import xdevice

    def starts_cuda():
        raise AssertionError("torch.cuda.is_available() runs cuInit and fixes the visible GPUs")

    torch_backend = xdevice.backend("torch")
    monkeypatch.setattr(torch.cuda, "is_available", starts_cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)  # what NVML counts on a two-GPU machine
    monkeypatch.setattr(_discovery, "cuda_driver_started", lambda: False)
    assert [str(d) for d in torch_backend.list_devices()] == ["cpu:0", "gpu:0", "gpu:1"]
    monkeypatch.setattr(_discovery, "cuda_driver_started", lambda: True)  # then CUDA itself answers
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [str(d) for d in torch_backend.list_devices()] == ["cpu:0"]


@pytest.mark.gpu
def test_on_a_gpu_torch_cuda_is_available_starts_the_driver_and_configure_says_so(run_python):
    result = run_python("""
        import json
        import torch, xdevice
        from xdevice._discovery import cuda_driver_started
        before = cuda_driver_started()
        xdevice.devices(backend="torch")  # xdevice's own look does not start it
        listed = cuda_driver_started()
        torch.cuda.is_available()
        try:
            xdevice.configure(visible=[])
            refused = ""
        except xdevice.ConfigurationError as error:
            refused = str(error)
        print(json.dumps([before, listed, cuda_driver_started(), refused]))
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    before, listed, after, refused = json.loads(result.stdout)
    assert [before, listed, after] == [False, False, True]
    assert "The CUDA driver already started in this process" in refused
