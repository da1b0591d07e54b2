"""The pytest plugin, tested as a user would meet it, with pytester."""

from __future__ import annotations

pytest_plugins = ["pytester"]

USER_TEST = """
import numpy as np
from xdevice.testing import assert_parity

def test_softmax(backend):
    assert_parity(lambda ops, x: ops.softmax(x), [np.ones((2, 3))], backends=[backend.name])

def test_device(backend, device):
    assert str(device) == "cpu:0"
"""


def test_backend_fixture_runs_once_per_selected_backend(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest("-v", "--xdevice-backends=numpy")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*test_softmax?numpy? PASSED*", "*test_device?numpy-cpu:0? PASSED*"])


def test_the_environment_variable_selects_backends(pytester, monkeypatch):
    monkeypatch.setenv("XDEVICE_TEST_BACKENDS", "numpy")
    pytester.makepyfile(test_user=USER_TEST)
    pytester.runpytest("-v").assert_outcomes(passed=2)


def test_a_typo_in_the_backend_option_is_a_usage_error_naming_the_choices(pytester):
    pytester.makepyfile(test_user=USER_TEST)
    result = pytester.runpytest("--xdevice-backends=nump")
    assert result.ret == 4  # pytest's usage error
    result.stderr.fnmatch_lines(["*Unknown or uninstalled backend*'nump'*Did you mean 'numpy'*"])


def test_a_parity_failure_reads_well_in_the_pytest_report(pytester):
    pytester.makepyfile(
        test_user="""
import numpy as np
from xdevice.testing import assert_parity

def scaled(ops, x):  # a bug that only shows in float32: the reference runs in float64
    return ops.multiply(x, 1.001) if ops.dtype(x) == "float32" else x

def test_wrong(backend):
    assert_parity(scaled, [np.full((3,), 100.0)], backends=[backend.name], subject="scaled")
"""
    )
    result = pytester.runpytest("--xdevice-backends=numpy")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*ParityError*",
            "*scaled: backend 'numpy', tensor 'output': worst at index (0,): 100.1000* vs reference 100.0*",
        ]
    )


def test_gpu_tests_skip_with_a_reason_on_a_machine_without_one(pytester):
    import xdevice

    pytester.makepyfile(
        test_user="""
import pytest

@pytest.mark.gpu
def test_needs_gpu():
    pass
"""
    )
    result = pytester.runpytest("-rs")
    if xdevice.devices(kind="gpu"):
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*needs an NVIDIA GPU*"])


def test_the_markers_are_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["*gpu: needs an NVIDIA GPU*", "*multi_device:*", "*slow:*"])


def test_a_multi_device_test_skips_on_a_backend_without_in_process_devices_naming_launch(pytester):
    import xdevice

    names = [name for name in ("numpy", "torch") if name in xdevice.backends()]
    pytester.makeini("[pytest]\nxdevice_cpu_devices = 2\n")
    pytester.makepyfile(
        test_user="""
import pytest
from xdevice import Trainer, models

@pytest.mark.multi_device
def test_two_devices(backend):
    model = models.build("mlp", backend=backend.name, hidden=[4], inputs=6, classes=2, seed=0)
    Trainer(model, devices=["cpu:0", "cpu:1"])
"""
    )
    result = pytester.runpytest("-rs", f"--xdevice-backends={','.join(names)}")
    result.assert_outcomes(skipped=len(names))
    result.stdout.fnmatch_lines(["*NumPy has no in-process virtual devices*"])
    if "torch" in names:
        result.stdout.fnmatch_lines(
            ["*PyTorch has no in-process virtual devices*`xdevice launch --nproc-per-node N your_script.py`*"]
        )
