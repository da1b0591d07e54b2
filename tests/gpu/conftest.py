"""The GPU set (``make test-gpu``): every test is marked ``gpu`` (``pytestmark``) and skipped without an NVIDIA GPU
(xdevice's plugin); one that needs a package the machine lacks skips, naming it. A machine whose
``nvidia-smi`` lists GPUs that xdevice does not see fails the run: a GPU run that tested nothing
is red, not green."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

import xdevice

#: frameworks that compute on an NVIDIA GPU, and how to get each
FRAMEWORKS = {
    "torch": "pip install torch (a CUDA build)",
    "jax": "pip install 'jax[cuda13]'",
    "tensorflow": "pip install 'tensorflow[and-cuda]'",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    listed = smi_uuids()
    if listed and not xdevice.devices(kind="gpu"):
        raise pytest.UsageError(
            f"nvidia-smi lists {len(listed)} GPU(s) but xdevice finds none, so every GPU test would skip: "
            "check `xdevice devices --machine` and `xdevice doctor`"
        )


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
