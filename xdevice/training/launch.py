"""``xdevice launch``: N training processes per node, set up for every installed framework at
once.

The processes are started by a process launcher, the ``agent`` module of the first
installed backend whose package provides one (``_registry.providers("agent")``): today
PyTorch's, torchrun's elastic agent, so ``xdevice launch`` needs PyTorch installed, whichever
framework the script trains with. The agent restarts the group when a worker fails
(``max_restarts``), meets other nodes through a ``c10d`` rendezvous (``nnodes`` may be
``"MIN:MAX"``), writes each rank's output to its own files (``log_dir``) and shows the lines
prefixed with the rank.

Each worker gets ``RANK`` and ``WORLD_SIZE``, and what each installed framework's engine needs
to meet the others, written by that backend's own launch hook (``backends/<name>/launch.py``,
called through ``xdevice._processes.environment``): this module knows none of those
variables. In the launched process the trainer and ``replicate`` join the framework's group
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
    """The process launcher's arguments (torchrun's) that run ``python script args...``.

    Raises:
        ConfigurationError: a flag out of range, no script at that path, or no backend
            installed that provides a process launcher (PyTorch does).
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
    """Run ``python script args...`` in ``nproc_per_node`` processes under the process launcher
    (options as :func:`arguments`); 0 when every rank finished, else the first failed rank's
    exit code."""
    return _agent().run(arguments(script, args, nproc_per_node, **options))


def _agent():
    """The process launcher: the ``agent`` module (its command line, running it, and the
    workers' set-up) of the first installed backend that provides one."""
    found = _registry.providers("agent")
    if found:
        return _registry.extension(found[0], "agent")
    able = _registry.providers("agent", all=True)
    titles = " or ".join(_registry.title(name) for name in able) or "a backend that provides one"
    raise ConfigurationError(
        message(
            f"xdevice launch starts the processes with a process launcher, which comes with {titles}",
            received=f"no installed backend provides one (installed: {', '.join(_registry.backends())})",
            fix=f"{_registry.pip_line(able[0])} (whatever the script trains with)" if able else None,
        )
    )
