"""Configuring the GPU before the frameworks start: hard limits, JAX's pool, visibility, and the
refusal once a runtime started. Each runs in a fresh interpreter: these settings precede the
runtime."""

from __future__ import annotations

import json

import pytest

from .conftest import needs

pytestmark = pytest.mark.gpu


def test_a_torch_memory_limit_is_enforced(run_python):
    needs("torch")
    result = run_python("""
        import xdevice, torch
        report = xdevice.configure(memory_limit="1GiB", backends=["torch"])
        print(report.how("torch", "memory_limit"))
        try:
            torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda:0")
            print("allocated past the limit")
        except torch.OutOfMemoryError:
            print("refused past the limit")
        print(xdevice.memory_stats("gpu:0", backend="torch").limit)
    """)
    assert result.stdout.splitlines() == ["enforced", "refused past the limit", str(2**30)], result.stderr


def test_a_jax_memory_limit_refuses_an_allocation_past_it(run_python):
    needs("jax")
    result = run_python("""
        import json, xdevice
        report = xdevice.configure(memory_limit="1GiB", memory_growth=False, backends=["jax"])
        import jax, jax.numpy as jnp
        gpu = jax.devices("gpu")[0]
        small = jax.device_put(jnp.zeros(2**20, dtype=jnp.uint8), gpu).block_until_ready()
        try:
            jax.device_put(jnp.zeros(2 * 2**30, dtype=jnp.uint8), gpu).block_until_ready()
            said = "allocated past the limit"
        except Exception as error:  # XlaRuntimeError: RESOURCE_EXHAUSTED
            said = "RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in str(error) else str(error)[:300]
        print(json.dumps([report.how("jax", "memory_limit"), said]))
    """)
    assert json.loads(result.stdout) == ["pool", "RESOURCE_EXHAUSTED"], result.stderr[-3000:]


def test_a_jax_memory_limit_is_a_preallocated_pool(run_python):
    needs("jax")
    result = run_python("""
        import json, xdevice
        report = xdevice.configure(memory_limit="2GiB", memory_growth=False, backends=["jax"])
        stats = xdevice.memory_stats("gpu:0", backend="jax")
        print(json.dumps([report.how("jax", "memory_limit"), stats.limit, stats.limit_how]))
    """)
    how, limit, limit_how = json.loads(result.stdout)
    assert how == "pool" and limit_how == "pool"
    assert abs(limit - 2 * 2**30) < 0.05 * 2**30  # XLA rounds the fraction


@pytest.mark.parametrize("growth", [False, True], ids=["growth-off-preallocates", "growth-on-allocates-on-demand"])
def test_memory_growth_is_jaxs_preallocation(run_python, growth):
    """Off, JAX takes its pool when it starts; on, only what the first array needs (measured
    from outside JAX, as the device's free memory that torch's CUDA reads)."""
    needs("torch", "jax")
    result = run_python(f"""
        import json, torch, xdevice
        xdevice.configure(memory_growth={growth}, backends=["jax"])
        free, total = torch.cuda.mem_get_info(0)
        import jax, jax.numpy as jnp
        jax.device_put(jnp.ones(4), jax.devices("gpu")[0]).block_until_ready()
        print(json.dumps([free - torch.cuda.mem_get_info(0)[0], total]))
    """)
    taken, total = json.loads(result.stdout)
    if growth:
        assert taken < 2**30, result.stderr[-2000:]
    else:
        assert taken > total / 4, result.stderr[-2000:]


def test_visible_hides_the_other_gpus_from_every_framework(run_python):
    needs("torch")
    result = run_python("""
        import xdevice
        xdevice.configure(visible=["gpu:0"], backends=["torch"])
        import torch
        print(torch.cuda.device_count(), len(xdevice.devices(kind="gpu")))
    """)
    assert result.stdout.split() == ["1", "1"], result.stderr


def test_configuring_after_cuda_started_in_torch_is_refused(run_python):
    needs("torch")
    result = run_python("""
        import torch, xdevice
        torch.zeros(1, device="cuda")
        try:
            xdevice.configure(memory_limit="1GiB", backends=["torch"])
        except xdevice.ConfigurationError as error:
            print(error)
    """)
    assert "PyTorch already started" in result.stdout, result.stderr
