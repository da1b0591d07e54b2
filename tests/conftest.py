"""Shared test helpers. Fixtures `backend` and `device` come from xdevice's pytest plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

try:  # the test extra; a bare GPU image may lack it
    from hypothesis import HealthCheck, settings

    # Machines here are shared: a draw or an example that a busy neighbour slows down is not a
    # defect of the property, so no timing checks (the properties themselves still run in full).
    settings.register_profile("shared", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("shared")
except ImportError:
    pass


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
