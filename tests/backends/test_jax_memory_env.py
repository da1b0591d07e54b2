"""configure(memory_limit=...) for JAX writes exactly one memory-fraction variable, the one the
installed jaxlib reads: with both ``XLA_CLIENT_MEM_FRACTION`` and the deprecated
``XLA_PYTHON_CLIENT_MEM_FRACTION`` set, jaxlib refuses to start its CUDA backend and JAX runs
on the CPU. The GPUs are made up (a ``Device`` with ``memory_total``); the variables are
checked by jaxlib's own reader of them, which runs without a GPU. Every case restores
``os.environ`` (monkeypatch) or runs in a fresh interpreter, so no other test sees them.
"""

from __future__ import annotations

import json
import os

import pytest

import xdevice
from xdevice import ConfigurationError
from xdevice._device import Device
from xdevice._types import Config
from xdevice.backends.jax.memory import DEPRECATED_FRACTION, FRACTION, PREALLOCATE

GPUS = [Device("gpu", 0, memory_total=8 * 2**30), Device("gpu", 1, memory_total=8 * 2**30)]


@pytest.fixture
def jax_memory(monkeypatch):
    """The JAX backend, in an environment without JAX's memory variables (restored after)."""
    if "jax" not in xdevice.backends():
        pytest.skip("jax is not installed")
    for variable in (FRACTION, DEPRECATED_FRACTION, PREALLOCATE):
        monkeypatch.delenv(variable, raising=False)
    return xdevice.backend("jax")


def jaxlib_fraction() -> float | None:
    """The memory fraction jaxlib hands its CUDA client, read from the environment as JAX
    does when its GPU backend starts (it raises ValueError for a conflicting pair)."""
    xla_client = pytest.importorskip("jaxlib.xla_client")
    read = getattr(xla_client, "generate_pjrt_gpu_plugin_options", None)
    if read is None:
        pytest.skip("this jaxlib reads its GPU options elsewhere")
    return read().get("memory_fraction")


def fraction_variables() -> dict[str, str]:
    return {name: os.environ[name] for name in (FRACTION, DEPRECATED_FRACTION) if name in os.environ}


def test_a_memory_limit_sets_only_the_fraction_variable_jax_reads(jax_memory):
    [row] = jax_memory.configure_memory(Config.make(memory_limit="2GiB"), GPUS)
    assert fraction_variables() == {FRACTION: "0.2500"}
    assert (row.how, row.detail) == ("pool", f"{FRACTION}=0.2500")
    assert jaxlib_fraction() == 0.25


def test_a_users_deprecated_variable_gets_the_limit_under_its_own_name(jax_memory, monkeypatch):
    monkeypatch.setenv(DEPRECATED_FRACTION, "0.9")
    [row] = jax_memory.configure_memory(Config.make(memory_limit="2GiB"), GPUS)
    assert fraction_variables() == {DEPRECATED_FRACTION: "0.2500"}
    assert row.detail == f"{DEPRECATED_FRACTION}=0.2500"
    assert jaxlib_fraction() == 0.25


def test_both_fraction_variables_set_by_the_user_are_refused_with_the_fix(jax_memory, monkeypatch):
    monkeypatch.setenv(FRACTION, "0.5")
    monkeypatch.setenv(DEPRECATED_FRACTION, "0.9")
    with pytest.raises(ConfigurationError, match=f"both set.*Fix: unset {DEPRECATED_FRACTION}"):
        jax_memory.configure_memory(Config.make(memory_limit="2GiB"), GPUS)
    assert fraction_variables() == {FRACTION: "0.5", DEPRECATED_FRACTION: "0.9"}  # left as the user set them


def test_with_growth_the_limit_is_an_enforced_cap(jax_memory):
    rows = jax_memory.configure_memory(Config.make(memory_growth=True, memory_limit="4GiB"), GPUS)
    assert [(r.setting, r.how, r.detail) for r in rows] == [
        ("memory_growth", "applied", f"{PREALLOCATE}=false"),
        ("memory_limit", "enforced", f"{FRACTION}=0.5000"),
    ]
    assert fraction_variables() == {FRACTION: "0.5000"}


def test_configure_leaves_one_fraction_variable_for_jax_to_read_as_it_loads(run_python):
    """The whole path: configure() before JAX is imported, applied by the import hook."""
    if "jax" not in xdevice.backends():
        pytest.skip("jax is not installed")
    result = run_python(
        f"""
        import json, os
        for name in {[FRACTION, DEPRECATED_FRACTION]!r}:
            os.environ.pop(name, None)
        import xdevice
        from xdevice import _configure
        from xdevice._device import Device
        _configure.nvml_gpus = lambda: [Device("gpu", 0, memory_total=8 * 2**30)]  # a made-up GPU
        report = xdevice.configure(memory_limit="2GiB")
        import jax
        from jaxlib.xla_client import generate_pjrt_gpu_plugin_options
        print(json.dumps({{
            "pending": report.how("jax", "memory_limit"),
            "set": [name for name in {[FRACTION, DEPRECATED_FRACTION]!r} if name in os.environ],
            "jaxlib": generate_pjrt_gpu_plugin_options().get("memory_fraction"),
        }}))
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout) == {"pending": "pending", "set": [FRACTION], "jaxlib": 0.25}
