"""estimate_memory / xdevice estimate-memory for a GPU that is not there: the fix fits the
machine, and reads the same from Python and from the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from xdevice import Device, DeviceNotFound, devices, estimate_memory

no_gpu = pytest.mark.skipif(bool(devices(kind="gpu")), reason="this machine has a GPU: the advice for none cannot show")


@no_gpu
def test_a_gpu_on_a_machine_without_one_gets_the_cpu_as_the_fix():
    with pytest.raises(DeviceNotFound) as caught:
        estimate_memory("mlp", batch=8, backend="numpy", device="gpu", measure=False)
    said = str(caught.value)
    assert said.startswith("No GPU here to estimate gpu:0 for") and said.endswith("Fix: no GPU here; use cpu:0.")
    assert "xdevice.devices()" not in said and "soft=True" not in said  # no Python call to make


def test_a_gpu_the_backend_does_not_see_gets_another_backend_as_the_fix(monkeypatch):
    from xdevice.training import memory

    machine = {"gpu": [Device("gpu", 0)]}  # a GPU on the machine; numpy, the backend asked, never sees one
    monkeypatch.setattr(memory, "devices", lambda kind=None, backend=None: machine.get(kind, [Device("cpu", 0)]))
    with pytest.raises(
        DeviceNotFound,
        match=r"No device gpu:0 on backend 'numpy'.*Valid choices: cpu:0.*"
        r"Fix: use one of those, or measure with a backend whose build sees the GPU \(numpy's does not\)",
    ):
        estimate_memory("mlp", batch=8, backend="numpy", device="gpu", measure=False)


@no_gpu
def test_the_command_gives_the_same_fix_without_a_python_call():
    result = subprocess.run(
        [sys.executable, "-m", "xdevice", "estimate-memory", "mlp", "--batch", "8", "--backend", "numpy"]
        + ["--device", "gpu"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.strip().endswith("Fix: no GPU here; use cpu:0."), result.stderr
    assert "xdevice." not in result.stderr.split("DeviceNotFound:")[1]
