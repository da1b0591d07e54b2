"""Several frameworks share one GPU when JAX and TensorFlow grow on demand: the defaults are
set only where the user set nothing and the framework has not started, and ``xdevice doctor``
(which starts them all in one process) sets them before it starts any. The doctor cases run
in a fresh interpreter, whose environment is its own."""

from __future__ import annotations

import json

import pytest

import xdevice
from xdevice._doctor import provider_findings
from xdevice._sharing import apply_sharing_defaults, sharing_defaults

GROWTH = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}

#: prints the two variables after the doctor ran, in a fresh interpreter where XLA_PYTHON_CLIENT_PREALLOCATE
#: is unset (the test process's own environment, which the interpreter inherits, may have it)
DOCTOR = """
    import json, os
    os.environ.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)
    from xdevice._doctor import doctor
    {before}
    report = doctor()
    print(json.dumps({{name: os.environ.get(name) for name in {names!r}}}))
"""


def test_jax_and_tensorflow_grow_on_demand_where_nothing_was_set():
    environ: dict[str, str] = {"PATH": "/usr/bin"}
    applied = apply_sharing_defaults(environ)
    assert applied == GROWTH
    assert environ == {"PATH": "/usr/bin", **GROWTH}


def test_a_value_the_user_set_is_kept():
    environ = {"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}
    applied = apply_sharing_defaults(environ)
    assert applied == {"TF_FORCE_GPU_ALLOW_GROWTH": "true"}
    assert environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_a_framework_that_already_started_is_left_alone():
    environ: dict[str, str] = {}
    assert apply_sharing_defaults(environ, started=["tensorflow"]) == {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    assert sharing_defaults(started=["jax", "tensorflow"]) == {}


def test_the_doctor_lets_the_frameworks_share_the_gpu_and_keeps_the_users_choice(run_python):
    result = run_python(
        DOCTOR.format(before="", names=list(GROWTH)),
        env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"},  # the user's; XLA_PYTHON_CLIENT_PREALLOCATE unset
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == {
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "TF_FORCE_GPU_ALLOW_GROWTH": "false",
    }


def test_the_doctor_called_after_jax_started_leaves_jaxs_variable_unset(run_python):
    if "jax" not in xdevice.backends():
        pytest.skip("jax is not installed")
    result = run_python(
        DOCTOR.format(before="import jax.numpy as jnp; jnp.ones(1).block_until_ready()", names=list(GROWTH)),
        env={"TF_FORCE_GPU_ALLOW_GROWTH": "true"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1])["XLA_PYTHON_CLIENT_PREALLOCATE"] is None


def test_an_onnxruntime_cuda_session_out_of_gpu_memory_is_not_called_missing_libraries():
    """What the doctor reported when JAX and TensorFlow had taken the whole GPU before it."""
    error = "CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc((void**)&p, size)"
    cuda_ep = "CUDAExecutionProvider"
    [cuda] = provider_findings([cuda_ep], {cuda_ep: []}, {cuda_ep: error})
    assert not cuda.ok and "out of memory" in cuda.text and error in cuda.text
    assert "did not load" not in cuda.text and "memory_growth=True" in (cuda.fix or "")
