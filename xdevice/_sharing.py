"""Which environment defaults let several frameworks share one GPU in one process.

JAX pre-allocates 75% of each GPU when its runtime starts, and TensorFlow takes nearly all
that is left at its first GPU allocation; PyTorch's caching allocator and ONNX Runtime's CUDA
arena already grow on demand. A process that starts JAX and TensorFlow (and then PyTorch or an
ONNX Runtime CUDA session) therefore runs out of GPU memory unless both grow on demand:

- ``XLA_PYTHON_CLIENT_PREALLOCATE=false``: JAX allocates as it needs;
- ``TF_FORCE_GPU_ALLOW_GROWTH=true``: TensorFlow allocates as it needs.

Pre-allocation is faster and avoids fragmentation, so these are not xdevice's defaults for a
program (``xdevice.configure(memory_growth=True)`` chooses growth there, per framework and
reported); they are for processes that start every framework on purpose: ``xdevice doctor``
and the test suite. A value the user set is always kept, and a framework whose runtime has
already started is left alone (it read its variables as it started; writing them now would
only make the environment lie about it).

Imports no framework.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, MutableMapping

__all__ = ["sharing_defaults", "apply_sharing_defaults"]

#: framework (its import name) -> the variable that makes it grow on demand, and that value
_GROWTH = {
    "jax": ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
    "tensorflow": ("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
}


def sharing_defaults(started: Iterable[str] = ()) -> dict[str, str]:
    """The environment variables, and values, that let the frameworks share one GPU.

    Args:
        started: frameworks whose runtime already started (their variables are left out).

    >>> sharing_defaults()
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false', 'TF_FORCE_GPU_ALLOW_GROWTH': 'true'}
    >>> sharing_defaults(started=["jax"])
    {'TF_FORCE_GPU_ALLOW_GROWTH': 'true'}
    """
    skip = set(started)
    return dict(variable for name, variable in _GROWTH.items() if name not in skip)


def apply_sharing_defaults(
    environ: MutableMapping[str, str] = os.environ, *, started: Iterable[str] = ()
) -> dict[str, str]:
    """Set :func:`sharing_defaults` in ``environ`` where the user did not set them.

    Returns what it set (empty when the user had set everything).

    >>> env = {"TF_FORCE_GPU_ALLOW_GROWTH": "false"}  # the user's own choice is kept
    >>> apply_sharing_defaults(env)
    {'XLA_PYTHON_CLIENT_PREALLOCATE': 'false'}
    >>> env["TF_FORCE_GPU_ALLOW_GROWTH"]
    'false'
    """
    applied = {}
    for variable, value in sharing_defaults(started).items():
        if variable not in environ:
            environ[variable] = value
            applied[variable] = value
    return applied
