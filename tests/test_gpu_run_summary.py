"""The GPU run is honest (tests/conftest.py): it ends with one line saying what ran and why the rest
skipped, and a run where ``nvidia-smi`` lists GPUs but no ``gpu`` test ran fails. On CPU, with
made-up ``nvidia-smi`` answers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import empty_gpu_run, gpu_run_summary, nvidia_smi_gpus

import xdevice

pytest_plugins = ["pytester"]
TESTS = Path(__file__).parent

H100 = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5e6b1c2a-0000-1111-2222-333344445555)"
A100_MIG = (
    "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)\n"
    "  MIG 3g.20gb     Device  0: (UUID: MIG-bbbb)\n"
    "  MIG 3g.20gb     Device  1: (UUID: MIG-cccc)\n"
    "GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)\n"
)
NO_GPU = "needs an NVIDIA GPU; NVML or nvidia-smi found none (`xdevice devices --machine`)"


def test_nvidia_smi_lists_whole_gpus_and_not_their_mig_slices():
    assert nvidia_smi_gpus(H100) == ["NVIDIA H100 80GB HBM3 (UUID: GPU-5e6b1c2a-0000-1111-2222-333344445555)"]
    assert len(nvidia_smi_gpus(A100_MIG)) == 2


def test_an_nvidia_smi_without_a_driver_lists_no_gpu():
    failed = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert nvidia_smi_gpus(failed) == [] and nvidia_smi_gpus("") == []


def test_the_summary_counts_outcomes_and_groups_skips_by_reason_commonest_first():
    results = [("passed", "")] * 3 + [("failed", "")]
    results += [("skipped", "needs onnxruntime-gpu")] + [("skipped", "needs tensorflow with CUDA")] * 2
    assert gpu_run_summary(results) == (
        "gpu tests: 3 passed, 1 failed, 3 skipped: 2 × needs tensorflow with CUDA; 1 × needs onnxruntime-gpu"
    )


def test_a_run_that_passed_says_so_without_reasons():
    assert gpu_run_summary([("passed", ""), ("xfailed", "")]) == "gpu tests: 1 passed, 1 xfailed"


def test_gpus_listed_but_none_seen_fails_the_run_naming_both():
    failure = empty_gpu_run(listed=2, seen=0, results=[("skipped", NO_GPU)] * 46)
    assert failure is not None
    assert "nvidia-smi lists 2 GPU(s) but xdevice sees none, so all 46 gpu tests skipped" in failure
    assert "xdevice doctor" in failure


def test_gpus_seen_but_every_test_skipped_still_fails():
    failure = empty_gpu_run(listed=1, seen=1, results=[("skipped", "needs tensorflow with CUDA")] * 4)
    assert failure is not None and "xdevice sees 1, but all 4 gpu tests skipped" in failure


def test_a_run_that_tested_something_or_had_no_gpu_to_test_passes():
    some_ran = [("passed", ""), ("skipped", "needs tensorflow with CUDA")]
    assert empty_gpu_run(listed=1, seen=1, results=some_ran) is None
    assert empty_gpu_run(listed=1, seen=1, results=[("failed", "")]) is None  # red already, for its own reason
    assert empty_gpu_run(listed=0, seen=0, results=[("skipped", NO_GPU)]) is None  # a machine without GPUs
    assert empty_gpu_run(listed=1, seen=0, results=[]) is None  # no gpu test selected


# -- the hooks, in a real pytest session: a made-up nvidia-smi, and CUDA_VISIBLE_DEVICES hiding any real GPU


USER_TESTS = """
import pytest

@pytest.mark.gpu
def test_on_the_gpu():
    pass

@pytest.mark.gpu
def test_also_on_the_gpu():
    pass

def test_on_the_cpu():
    pass
"""


def run_session(tmp_path: Path, nvidia_smi_says: str | None) -> subprocess.CompletedProcess[str]:
    """pytest with tests/conftest.py as a plugin over two gpu tests and one CPU test; PATH holds
    only a made-up ``nvidia-smi`` printing ``nvidia_smi_says`` (None: no nvidia-smi at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi_says is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' '{nvidia_smi_says}'\n")  # builtins only: PATH has no cat
        fake.chmod(0o755)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text(textwrap.dedent(USER_TESTS))
    env = {
        **os.environ,
        "PATH": str(bin_dir),
        "PYTHONPATH": str(TESTS),
        "CUDA_VISIBLE_DEVICES": "",  # xdevice sees no GPU even on a GPU machine
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rs", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )


def test_a_gpu_run_that_tested_nothing_where_nvidia_smi_lists_a_gpu_fails(tmp_path):
    result = run_session(tmp_path, nvidia_smi_says=H100)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"gpu tests: 2 skipped: 2 × {NO_GPU}" in result.stdout
    assert "FAILED: nvidia-smi lists 1 GPU(s) but xdevice sees none, so all 2 gpu tests skipped" in result.stdout


def test_the_same_run_without_nvidia_smi_passes_and_says_what_skipped(tmp_path):
    result = run_session(tmp_path, nvidia_smi_says=None)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"gpu tests: 2 skipped: 2 × {NO_GPU}" in result.stdout
    assert "FAILED" not in result.stdout


def test_the_gpu_set_collects_without_pytest_timeout():
    """pyproject's ``timeout`` key must not stop collection where pytest-timeout is absent (a
    configuration error, whichever files are collected: the GPU set and the converter tests
    that need onnx are enough, and take seconds where the whole suite takes a minute)."""
    paths = [TESTS / "gpu", TESTS / "converters" / "test_import.py", TESTS / "converters" / "test_control_flow.py"]
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:timeout", "--collect-only", "-q"]
        + ["-p", "no:cacheprovider", *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=TESTS.parent,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "tests/gpu/test_devices.py::test_the_framework_sees_the_gpu_and_places_arrays_on_it" in result.stdout


def test_the_gpu_cases_of_the_device_fixture_are_gpu_tests(pytester):
    """``-m gpu --xdevice-devices=auto`` (make test-gpu) reaches every test that takes ``device``:
    its GPU case is marked ``gpu``, and skips, saying why, where there is none."""
    pytester.makepyfile(test_user="def test_zeros(device):\n    assert device.kind == 'gpu'\n")
    result = pytester.runpytest("-v", "-rs", "-m", "gpu", "--xdevice-devices=cpu,gpu:0")
    result.stdout.fnmatch_lines(["*test_zeros?gpu:0?*", "*1 deselected*"])  # the cpu:0 case is not a gpu test
    if xdevice.devices(kind="gpu"):
        result.assert_outcomes(passed=1, deselected=1)
    else:
        result.assert_outcomes(skipped=1, deselected=1)
        result.stdout.fnmatch_lines([f"*{NO_GPU}*"])
