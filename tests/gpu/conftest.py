"""The GPU set (``make test-gpu``): every test is marked ``gpu`` (``pytestmark``) and skipped without an NVIDIA GPU
(xdevice's plugin); one that needs a package the machine lacks skips, naming it. Tests that place
work take their GPU from ``gpu_device`` (each GPU ``--xdevice-devices`` names, else gpu:0). A run
whose tests all skip on a machine where ``nvidia-smi`` lists GPUs fails (tests/conftest.py): a GPU
run that tested nothing is red, not green."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

import xdevice
from xdevice.testing.pytest_plugin import device_specs

#: frameworks that compute on an NVIDIA GPU, and how to get each
FRAMEWORKS = {
    "torch": "pip install torch (a CUDA build)",
    "jax": "pip install 'jax[cuda13]'",
    "tensorflow": "tensorflow[and-cuda] (CUDA 12: not in the CUDA 13 install, see constraints/gpu.txt)",
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gpu_device" in metafunc.fixturenames:
        specs = gpu_specs(metafunc.config.getoption("--xdevice-devices"))
        metafunc.parametrize("gpu_device", specs, ids=specs, indirect=True)


def gpu_specs(option: str) -> list[str]:
    """The GPUs ``--xdevice-devices`` names (``auto``: gpu:0 where there is one), else ``gpu:0``.

    >>> gpu_specs("cpu,gpu:1")
    ['gpu:1']
    """
    named = [spec for spec in device_specs(option) if xdevice.device(spec).kind == "gpu"]
    return named or ["gpu:0"]


@pytest.fixture
def gpu_device(request: pytest.FixtureRequest) -> xdevice.Device:
    """The GPU under test: each one ``--xdevice-devices`` names, else gpu:0."""
    return xdevice.device(request.param)


def smi(*fields: str) -> list[list[str]]:
    """``nvidia-smi --query-gpu=<fields>`` rows (empty without nvidia-smi)."""
    found = shutil.which("nvidia-smi")
    if found is None:
        return []
    done = subprocess.run(
        [found, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return [[c.strip() for c in line.split(",")] for line in done.stdout.splitlines() if line.strip()]


def smi_uuids() -> list[str]:
    return [row[0] for row in smi("uuid")]


def needs(*packages: str) -> None:
    """Skip, naming what is missing: frameworks by their pip line, other packages by name."""
    for package in packages:
        if package in FRAMEWORKS and package not in xdevice.backends():
            pytest.skip(f"needs {package} with CUDA, not installed here ({FRAMEWORKS[package]})")
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"needs {package}, not installed here (pip install {package})")


def needs_ort_gpu() -> None:
    """Skip without ONNX Runtime's CUDA provider (the onnxruntime-gpu build)."""
    needs("onnxruntime")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        pytest.skip(
            f"needs onnxruntime-gpu: this onnxruntime {onnxruntime.__version__} has no CUDAExecutionProvider "
            "(pip install onnxruntime-gpu)"
        )


def needs_ampere() -> None:
    """Skip below compute capability 8.0, where float32 matmuls have no TF32 to round through."""
    capability = xdevice.devices(kind="gpu")[0].compute_capability
    if capability is None or capability < (8, 0):
        pytest.skip(f"TF32 needs an Ampere or newer GPU (compute capability >= 8.0); gpu:0 has {capability}")


@pytest.fixture(params=list(FRAMEWORKS))
def gpu_backend(request: pytest.FixtureRequest):
    """Each framework that can compute on the GPU, skipped where it is not installed."""
    needs(request.param)
    return xdevice.backend(request.param)
