"""This process among the processes ``xdevice launch`` (or torchrun) started: who it is, and
joining their group.

``xdevice launch`` describes the run in environment variables (``xdevice.training.launch``
writes them): ``RANK`` and ``WORLD_SIZE`` for everyone, ``MASTER_ADDR``/``MASTER_PORT`` for
``torch.distributed``, :data:`COORDINATOR` for ``jax.distributed`` and ``TF_CONFIG`` for
TensorFlow. A backend joins its framework's group from them (``Backend.join_processes``).

Joining is an explicit step, never a side effect of loading a backend: the trainer and
``replicate`` join before training, and a script that computes with JAX or TensorFlow before
that (building a model, say) calls :func:`join_processes` first, since both must join before
their first computation. Imports no framework.
"""

from __future__ import annotations

import os

from xdevice import _registry

__all__ = ["COORDINATOR", "world", "launched", "join_processes"]

#: ``host:port`` of the ``jax.distributed`` coordinator that ``xdevice launch`` sets.
COORDINATOR = "XDEVICE_COORDINATOR"


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: ``(0, 1)`` unless started by ``xdevice launch``
    (or torchrun, which sets the same variables).

    >>> world() if "WORLD_SIZE" not in os.environ else (0, 1)
    (0, 1)
    """
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def launched() -> bool:
    """Whether this process is one of several that ``xdevice launch`` started."""
    return world()[1] > 1


def join_processes(backend: str) -> tuple[int, int]:
    """Join ``backend``'s process group when ``xdevice launch`` started this process (a no-op
    otherwise, and when already joined); returns ``(rank, world size)``.

    Call it at the top of a launched script that computes with JAX or TensorFlow before it
    trains (both must join before their first computation); ``fit`` and ``replicate`` call it
    themselves.

    >>> join_processes("numpy") if not launched() else (0, 1)
    (0, 1)
    """
    if launched():
        _registry.backend(backend).join_processes()
    return world()
