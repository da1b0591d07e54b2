"""Shared test helpers. Fixtures `backend` and `device` come from xdevice's pytest plugin.

Also the GPU run's honesty (``make test-gpu``): a run that selected ``gpu`` tests ends with one
line saying what ran and why the rest skipped, and fails where ``nvidia-smi`` lists GPUs but no
``gpu`` test ran. Kept here, the conftest pytest loads first, so pytest-xdist's controller (which
collects nothing) sums up too."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import xdevice
from xdevice._sharing import apply_sharing_defaults

# every framework starts in one test process (and two xdist workers share a GPU): JAX and
# TensorFlow grow on demand instead of pre-allocating it, unless the environment says otherwise
apply_sharing_defaults()

try:  # the test extra; a bare GPU image may lack it
    from hypothesis import HealthCheck, settings

    # Machines here are shared: a draw or an example that a busy neighbour slows down is not a
    # defect of the property, so no timing checks (the properties themselves still run in full).
    settings.register_profile("shared", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("shared")
except ImportError:
    pass


#: code that starts each framework's runtime, which reads its settings once, as it starts
RUNTIME_STARTS = {
    "jax": "import jax.numpy as jnp; jnp.ones(1).block_until_ready()",
    "tensorflow": "import tensorflow as tf; tf.ones(1)",
}


@pytest.fixture(params=sorted(RUNTIME_STARTS))
def started_runtime(request):
    """``(backend name, code that starts its runtime)``, for a test run in a fresh interpreter
    (``run_python``) that configures too late."""
    if request.param not in xdevice.backends():
        pytest.skip(f"{request.param} is not installed")
    return request.param, RUNTIME_STARTS[request.param]


@pytest.fixture
def run_python():
    """Run code in a fresh interpreter (a runtime not yet started); returns the result."""

    def run(code: str, env: dict[str, str] | None = None, timeout: int = 300):
        merged = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=merged, timeout=timeout
        )

    return run


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``@pytest.mark.realworld_on("jax", "tensorflow")``: the test runs in ``make test`` on the
    other backends and joins the longer sets (``realworld``, ``make test-models``) on these,
    where it costs most (JAX's first compile of every op, TensorFlow's tracing). A case of the
    ``backend`` fixture is matched by its backend's name, any other case by its id's parts."""
    for item in items:
        marker = item.get_closest_marker("realworld_on")
        callspec = getattr(item, "callspec", None)
        if marker is None or callspec is None:
            continue
        parts = set(callspec.id.split("-")) | {str(callspec.params.get("backend", ""))}
        if parts & set(marker.args):
            item.add_marker(pytest.mark.realworld)


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """pyproject's ``timeout`` belongs to pytest-timeout; without it (not installed, or
    ``-p no:timeout``) an unknown ini key is a warning, which ``filterwarnings = error`` turns into
    an INTERNALERROR before collection. Registering the key keeps the run going, untimed."""
    if not pluginmanager.has_plugin("timeout"):
        parser.addini("timeout", "per-test time limit in seconds (read by pytest-timeout, not loaded here)")


# -- the GPU run: what ran, what skipped and why; red where nvidia-smi lists GPUs and nothing ran ----


def nvidia_smi_gpus(listing: str) -> list[str]:
    """The GPUs in ``nvidia-smi -L`` output, one ``GPU <i>: <name> (UUID: ...)`` line each (the
    indented MIG lines below a GPU are parts of it, not more GPUs).

    >>> nvidia_smi_gpus("GPU 0: NVIDIA A100 (UUID: GPU-1)\\n  MIG 1g.5gb Device 0: (UUID: MIG-2)")
    ['NVIDIA A100 (UUID: GPU-1)']
    """
    return [line.split(":", 1)[1].strip() for line in listing.splitlines() if re.match(r"GPU \d+:", line)]


def listed_by_nvidia_smi() -> list[str]:
    """What ``nvidia-smi -L`` lists; none where it is missing, fails or hangs (no driver, no GPU)."""
    found = shutil.which("nvidia-smi")
    if found is None:
        return []
    try:
        done = subprocess.run([found, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return []
    return nvidia_smi_gpus(done.stdout) if done.returncode == 0 else []


#: how a test can end, in the order the summary counts them
OUTCOMES = ("passed", "failed", "error", "xfailed", "xpassed", "skipped")


def gpu_run_summary(results: list[tuple[str, str]]) -> str:
    """One line for the ``gpu`` tests: how many ended each way, then the skips grouped by their
    reason, the commonest first.

    Args:
        results: ``(outcome, skip reason)`` per test; the reason is ``""`` unless it skipped.

    >>> gpu_run_summary([("passed", ""), ("skipped", "needs jax"), ("skipped", "needs jax")])
    'gpu tests: 1 passed, 2 skipped: 2 × needs jax'
    """
    counts = collections.Counter(outcome for outcome, _ in results)
    line = "gpu tests: " + ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o])
    reasons = collections.Counter(reason for outcome, reason in results if outcome == "skipped")
    if reasons:
        line += ": " + "; ".join(f"{n} × {reason}" for reason, n in reasons.most_common())
    return line


def empty_gpu_run(listed: int, seen: int, results: list[tuple[str, str]]) -> str | None:
    """Why a GPU run must fail: ``nvidia-smi`` listed GPUs (``listed``) yet no ``gpu`` test ran,
    because xdevice saw none (``seen``) or every test skipped; ``None`` for an honest run. A run
    that selected no ``gpu`` test, or a machine without GPUs, is never failed here.

    >>> empty_gpu_run(1, 0, [("skipped", "needs an NVIDIA GPU")])[:54]
    'nvidia-smi lists 1 GPU(s) but xdevice sees none, so al'
    >>> empty_gpu_run(1, 1, [("passed", ""), ("skipped", "needs tensorflow")]) is None
    True
    """
    if not listed or not results or any(outcome != "skipped" for outcome, _ in results):
        return None
    if not seen:
        return (
            f"nvidia-smi lists {listed} GPU(s) but xdevice sees none, so all {len(results)} gpu tests skipped: "
            "a GPU run that tested nothing fails. Check `xdevice devices --machine` and `xdevice doctor` "
            "(NVML comes from nvidia-ml-py, else from `nvidia-smi --query-gpu`)"
        )
    return (
        f"nvidia-smi lists {listed} GPU(s) and xdevice sees {seen}, but all {len(results)} gpu tests skipped "
        "(reasons above): a GPU run that tested nothing fails"
    )


def _skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test gave (pytest keeps it as ``(path, line, "Skipped: reason")``)."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class GpuRun:
    """Gathers how each ``gpu`` test ended; at the end says so and fails a run that tested nothing."""

    def __init__(self) -> None:
        self.results: dict[str, tuple[str, str]] = {}  # test id -> (outcome, skip reason)
        self.failure: str | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not getattr(report, "gpu_test", False) or self.results.get(report.nodeid, ("",))[0] in ("failed", "error"):
            return
        xfail = hasattr(report, "wasxfail")
        if report.failed:
            self.results[report.nodeid] = ("failed" if report.when == "call" else "error", "")
        elif report.skipped:
            self.results[report.nodeid] = ("xfailed", "") if xfail else ("skipped", _skip_reason(report))
        elif report.when == "call":
            self.results[report.nodeid] = ("xpassed" if xfail else "passed", "")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.results:
            return
        results = list(self.results.values())
        listed = len(listed_by_nvidia_smi())
        self.failure = empty_gpu_run(listed, len(xdevice.devices(kind="gpu")) if listed else 0, results)
        if self.failure and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest's own: after its short summary, last
    def pytest_terminal_summary(self, terminalreporter):
        yield
        if self.results:
            terminalreporter.write_line(gpu_run_summary(list(self.results.values())))
        if self.failure:
            terminalreporter.write_line(f"FAILED: {self.failure}", red=True, bold=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """Tag each report of a ``gpu``-marked test (the mark, not the keyword: a folder named gpu is
    one too); the tag travels with the report from an xdist worker to the controller."""
    report = yield
    report.gpu_test = item.get_closest_marker("gpu") is not None
    return report


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # an xdist worker reports each test to the controller, which sums up
        config.pluginmanager.register(GpuRun(), "xdevice-gpu-run")
