"""``xdevice launch``: N training processes per node, on torchrun's elastic agent, set up for
every framework at once.

The agent (``torch.distributed.run``) manages the processes: it restarts the group when a
worker fails (``max_restarts``), meets other nodes through a ``c10d`` rendezvous (``nnodes``
may be ``"MIN:MAX"``), writes each rank's output to its own files (``log_dir``) and shows
the lines prefixed with the rank. Its command line and the worker's set-up live in the torch
backend's ``launch.py``, reached through the registry; so ``xdevice launch`` needs PyTorch
installed, whichever framework the script trains with. Each worker gets:

- PyTorch (``torch.distributed``, ``init_method="env://"``): ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``, from the agent;
- JAX (``jax.distributed.initialize``): ``XDEVICE_COORDINATOR``, rank 0's address and a
  free port, published through the rendezvous store;
- TensorFlow (``MultiWorkerMirroredStrategy``): ``TF_CONFIG`` listing every worker on every
  node, each worker's address published the same way.

In the launched process the trainer and ``replicate`` join the framework's group
(``Backend.join_processes``); a script that computes with JAX or TensorFlow before it trains
calls ``xdevice.join_processes(backend)`` at its top (see ``xdevice._processes``).

With a GPU per process, local rank ``i`` sees only the ``i``-th visible GPU, as its ``gpu:0``.
"""

from __future__ import annotations

import os
import re

from xdevice import _registry
from xdevice._errors import ConfigurationError, message
from xdevice._processes import join_processes, world

__all__ = ["arguments", "join_processes", "launch", "world"]


def arguments(
    script: str,
    args: list[str],
    nproc_per_node: int,
    *,
    nnodes: str | int = 1,
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    max_restarts: int = 0,
    rdzv_backend: str = "c10d",
    rdzv_id: str | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """torchrun's arguments that run ``python script args...`` under its agent.

    Raises:
        ConfigurationError: a flag out of range, no script at that path, or no PyTorch.
    """
    for name, value, low in (("nproc_per_node", nproc_per_node, 1), ("max_restarts", max_restarts, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigurationError(
                message(f"--{name.replace('_', '-')} must be an int of at least {low}", received=value)
            )
    nnodes = str(nnodes)
    if not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", nnodes):
        raise ConfigurationError(
            message("--nnodes is a node count or a range", expected="N or MIN:MAX, e.g. 2 or 1:4", received=nnodes)
        )
    if nnodes not in ("1", "1:1") and master_port is None:
        raise ConfigurationError(
            message(
                "Several nodes meet at a rendezvous endpoint",
                received=f"--nnodes {nnodes} without --master-port",
                fix="give every node the same --master-addr (node 0's address) and --master-port",
            )
        )
    if not os.path.isfile(script):  # before any process starts: one message, not one per rank
        raise ConfigurationError(
            message(
                "No training script at that path",
                expected="a Python file",
                received=os.path.abspath(script),
                fix="check the path (relative to where xdevice launch runs)",
            )
        )
    return _agent().arguments(
        script,
        list(args),
        nproc_per_node=nproc_per_node,
        nnodes=nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
        max_restarts=max_restarts,
        rdzv_backend=rdzv_backend,
        rdzv_id=rdzv_id,
        log_dir=log_dir,
    )


def launch(script: str, args: list[str], nproc_per_node: int, **options) -> int:
    """Run ``python script args...`` in ``nproc_per_node`` processes under torchrun's agent
    (options as :func:`arguments`); 0 when every rank finished, else the first failed rank's
    exit code."""
    return _agent().run(arguments(script, args, nproc_per_node, **options))


def _agent():
    """The torch backend's ``launch`` module: torchrun's command line and the workers' set-up."""
    if not _registry.is_installed("torch"):
        raise ConfigurationError(
            message(
                "xdevice launch runs on torchrun's elastic agent, which comes with PyTorch",
                received="torch not installed",
                fix=f"{_registry.pip_line('torch')} (whatever the script trains with)",
            )
        )
    return _registry.extension("torch", "launch")
