"""The xdevice pytest plugin: ``backend`` and ``device`` fixtures, and the markers.

Loaded automatically when xdevice is installed (entry point ``pytest11``); it imports no
framework unless a test asks for one.

- ``backend``: parametrised over the installed backends (test ids read ``test_x[torch]``);
  ``--xdevice-backends=torch,jax`` or ``XDEVICE_TEST_BACKENDS=torch,jax`` narrows it.
- ``device``: parametrised over ``--xdevice-devices`` (default ``cpu``; ``auto`` adds
  ``gpu:0`` when the machine has one). A backend that lacks the device skips, saying so; a GPU
  case is marked ``gpu``, so ``-m gpu --xdevice-devices=auto`` runs each test on ``gpu:0``.
- Markers: ``gpu`` (skipped without an NVIDIA GPU), ``multi_device`` (runs on virtual CPU
  devices; skipped, saying why, for a ``backend`` with one CPU device per process: PyTorch
  replicates only across the processes ``xdevice launch --nproc-per-node N`` starts), ``slow``.
- ini ``xdevice_cpu_devices = N``: ``xdevice.configure(cpu_devices=N)`` for the selected
  backends before any test runs, so multi-device tests have devices to use.
"""

from __future__ import annotations

import os

import pytest

import xdevice
from xdevice._errors import message

__all__ = ["device_specs", "selected_backends"]

ENV = "XDEVICE_TEST_BACKENDS"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("xdevice")
    group.addoption(
        "--xdevice-backends",
        default=None,
        help=f"comma-separated backends for the `backend` fixture (or ${ENV}); default: every installed backend",
    )
    group.addoption(
        "--xdevice-devices",
        default="cpu",
        help="comma-separated devices for the `device` fixture; 'auto' means cpu "
        "plus gpu:0 when there is a GPU (default: cpu)",
    )
    parser.addini("xdevice_cpu_devices", "virtual CPU devices to configure before the tests", default="")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; skipped without one")
    config.addinivalue_line("markers", "multi_device: runs on several (virtual CPU) devices")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")
    selected = selected_backends(config)  # a typo is a usage error before any collection
    count = config.getini("xdevice_cpu_devices")
    if count:
        selected = [name for name in selected if name != "numpy"]
        xdevice.configure(cpu_devices=int(count), backends=selected)


def selected_backends(config: pytest.Config | None = None) -> list[str]:
    """Backends the tests run on: the option, else the environment, else all installed."""
    raw = (config.getoption("--xdevice-backends") if config else None) or os.environ.get(ENV)
    installed = xdevice.backends()  # type: ignore[operator]  # the package is callable: backends/__init__.py
    if not raw:
        return installed
    names = [n.strip() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in installed]
    if unknown:
        raise pytest.UsageError(
            message(
                "Unknown or uninstalled backend in --xdevice-backends / " + ENV, received=unknown[0], choices=installed
            )
        )
    return names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        names = selected_backends(metafunc.config)
        metafunc.parametrize("backend", names, ids=names, indirect=True)
    if "device" in metafunc.fixturenames:
        specs = device_specs(metafunc.config.getoption("--xdevice-devices"))
        # a GPU case is a gpu test: `-m gpu` selects it, and it skips where there is no GPU
        cases = [pytest.param(s, id=s, marks=[pytest.mark.gpu] if s.startswith("gpu") else []) for s in specs]
        metafunc.parametrize("device", cases, indirect=True)


def device_specs(raw: str) -> list[str]:
    """The canonical devices a ``--xdevice-devices`` value names; ``auto`` is ``cpu:0`` and,
    where the machine has a GPU, ``gpu:0``.

    >>> device_specs("cuda:1, cpu")
    ['gpu:1', 'cpu:0']
    """
    specs = []
    for spec in (s.strip() for s in raw.split(",") if s.strip()):
        if spec == "auto":
            specs.append("cpu:0")
            if xdevice.devices(kind="gpu"):
                specs.append("gpu:0")
        else:
            specs.append(str(xdevice.device(spec)))
    return list(dict.fromkeys(specs))


@pytest.fixture
def backend(request: pytest.FixtureRequest):
    """The :class:`~xdevice.backends.base.Backend` under test (one per selected backend)."""
    return xdevice.backend(request.param)


@pytest.fixture
def device(request: pytest.FixtureRequest):
    """The :class:`~xdevice.Device` under test; skips when the test's backend lacks it."""
    wanted = xdevice.device(request.param)
    if "backend" in request.fixturenames:
        name = request.getfixturevalue("backend").name
        present = xdevice.devices(backend=name)
        if wanted not in present:
            pytest.skip(f"{name} does not see {wanted} (it sees {', '.join(map(str, present))})")
        return present[present.index(wanted)]
    return xdevice.find(wanted)


@pytest.hookimpl(tryfirst=True)  # before the fixtures are set up
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A ``multi_device`` test on a backend with one CPU device per process skips, saying why."""
    if item.get_closest_marker("multi_device") is None:
        return
    callspec = getattr(item, "callspec", None)
    name = callspec.params.get("backend") if callspec is not None else None
    if not isinstance(name, str):
        return  # no backend fixture: the test picks its frameworks itself
    engine = xdevice.backend(name)
    if engine.supports_virtual_devices:
        return
    reason = f"{engine.title} has no in-process virtual devices, so a multi_device test cannot run on {name}"
    if engine.supports_processes:
        reason += (
            "; it replicates across processes: run the same training without devices= "
            "under `xdevice launch --nproc-per-node N your_script.py`"
        )
    pytest.skip(reason)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if xdevice.devices(kind="gpu"):
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU; NVML or nvidia-smi found none (`xdevice devices --machine`)")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)
