"""What the training tests share: JAX's virtual CPU devices."""

from __future__ import annotations

import pytest

import xdevice
from xdevice.testing.pytest_plugin import selected_backends


@pytest.fixture
def jax_devices(pytestconfig):
    """The virtual CPU devices of JAX (the ini's ``xdevice_cpu_devices``, configured by the plugin)."""
    if "jax" not in selected_backends(pytestconfig):
        pytest.skip("JAX is not among the backends under test")
    found = [str(d) for d in xdevice.devices(backend="jax") if d.kind == "cpu"]
    if len(found) < 4:
        pytest.skip(f"4 virtual CPU devices wanted for JAX, {len(found)} configured (xdevice_cpu_devices)")
    return found
