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

Inside a cluster job (a Kubeflow ``TrainJob``, ``PyTorchJob``, ``TFJob`` or ``JAXJob``, a
Slurm step) :func:`with_cluster` fills the flags the user left out from the variables the
scheduler set (:mod:`xdevice.training.cluster`): the launchers meet at the scheduler's
``host:port`` (node 0's launcher holds the rendezvous there; torchrun's ``static`` rendezvous,
as every node knows its number), so a worker's ``RANK`` is the scheduler's process number, and
each backend's hook then sets its engine up as on one machine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from xdevice import _registry
from xdevice._errors import ConfigurationError, message
from xdevice._processes import join_processes, world
from xdevice.training.cluster import ClusterJob, cluster_job

__all__ = ["arguments", "join_processes", "launch", "with_cluster", "world"]


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


def with_cluster(
    options: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> tuple[dict[str, Any], ClusterJob | None]:
    """The launch's options with those left out (None) taken from the cluster job ``env``
    describes (``os.environ`` by default), then the one-machine defaults; and that job, or None.

    Keys: ``nproc_per_node``, ``nnodes``, ``node_rank``, ``master_addr``, ``master_port``,
    ``rdzv_backend``; other keys pass through. An option given explicitly wins over the job.

    >>> options, job = with_cluster({"nproc_per_node": None, "nnodes": None}, env={})
    >>> options["nproc_per_node"], options["nnodes"], options["rdzv_backend"], job
    (1, '1', 'c10d', None)
    >>> env = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "1",
    ...        "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}
    >>> options, job = with_cluster({"nproc_per_node": 2}, env=env)
    >>> options["nproc_per_node"], options["nnodes"], options["node_rank"], options["master_addr"]
    (2, '2', 1, 'job-node-0-0.job')
    """
    job = cluster_job(os.environ if env is None else env, gpus=_gpu_count)
    found: dict[str, Any] = {"nproc_per_node": 1, "nnodes": "1", "rdzv_backend": "c10d"}
    if job is not None:
        found = {
            "nproc_per_node": job.nproc_per_node,
            "nnodes": job.nnodes,
            "node_rank": job.node_rank,
            "master_addr": job.host,
            "master_port": job.port,
            "rdzv_backend": job.rdzv_backend,
        }
    merged = dict(options)
    for key, value in found.items():
        if merged.get(key) is None:
            merged[key] = value
    return merged, job


def _gpu_count() -> int:
    """GPUs visible here (for ``PET_NPROC_PER_NODE=auto``), from NVML without a framework."""
    from xdevice._discovery import nvml_physical_gpus, visible_gpu_indices

    return len(visible_gpu_indices([gpu_uuid for gpu_uuid, _ in nvml_physical_gpus()]))


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
