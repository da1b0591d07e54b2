"""``xdevice launch``: start N training processes per node, set up for every framework at once.

From one set of flags each process gets the environment that each framework's own
distributed engine reads:

- PyTorch (``torch.distributed``, ``init_method="env://"``): ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
- JAX (``jax.distributed.initialize``): ``XDEVICE_COORDINATOR`` (``MASTER_ADDR:MASTER_PORT+1``),
  with ``RANK`` / ``WORLD_SIZE`` as process id and count;
- TensorFlow (``MultiWorkerMirroredStrategy``): ``TF_CONFIG``, workers on
  ``MASTER_ADDR:MASTER_PORT+2+rank``. Only for one node: TF needs every worker's address,
  and with several nodes only the master's is known, so ``TF_CONFIG`` is left unset there.

In the launched process, the trainer and ``replicate`` join the framework's group
(``Backend.join_processes``); a script that computes with JAX or TensorFlow before it trains
calls ``xdevice.join_processes(backend)`` at its top, since both must join before their
first computation (see ``xdevice._processes``).

Decisions: ranks are ``node_rank * nproc_per_node + local_rank``; with a GPU per process,
process ``i`` sees only the ``i``-th visible GPU (``CUDA_VISIBLE_DEVICES``), as its ``gpu:0``:
one device per process is what DDP, ``jax.distributed`` and MultiWorkerMirroredStrategy
expect; if any process fails, the others on this node are stopped and its exit code is returned.

>>> environments(2, master_port=29500)[1]["RANK"]
'1'
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from xdevice._errors import ConfigurationError, message
from xdevice._processes import COORDINATOR, join_processes, world

__all__ = ["environments", "join_processes", "launch", "world"]


def environments(nproc_per_node: int, *, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, gpus: list[int] | None = None) -> list[dict[str, str]]:
    """The environment of each process this node starts (see the module docstring); with at
    least one of ``gpus`` (physical indices) per process, process ``i`` sees only ``gpus[i]``."""
    for name, value, low in (("nproc_per_node", nproc_per_node, 1), ("nnodes", nnodes, 1),
                             ("node_rank", node_rank, 0), ("master_port", master_port, 1)):
        if not isinstance(value, int) or value < low:
            raise ConfigurationError(message(f"--{name.replace('_', '-')} must be an int of at least {low}",
                                             received=value))
    if node_rank >= nnodes:
        raise ConfigurationError(message("--node-rank must be below --nnodes", expected=f"0..{nnodes - 1}",
                                         received=node_rank))
    world_size = nproc_per_node * nnodes
    envs = []
    for local in range(nproc_per_node):
        rank = node_rank * nproc_per_node + local
        env = {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(local),
               "LOCAL_WORLD_SIZE": str(nproc_per_node), "MASTER_ADDR": master_addr,
               "MASTER_PORT": str(master_port), COORDINATOR: f"{master_addr}:{master_port + 1}"}
        if nnodes == 1:
            workers = [f"{master_addr}:{master_port + 2 + i}" for i in range(world_size)]
            env["TF_CONFIG"] = json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}})
        if gpus and len(gpus) >= nproc_per_node:
            env["CUDA_VISIBLE_DEVICES"] = str(gpus[local])
        envs.append(env)
    return envs


def launch(script: str, args: list[str], nproc_per_node: int, **options) -> int:
    """Run ``python script args...`` in ``nproc_per_node`` processes; the first failure's exit code."""
    from xdevice._discovery import nvml_physical_gpus, visible_gpu_indices

    if not os.path.isfile(script):  # before any process starts: one message, not one per rank
        from xdevice._errors import ConfigurationError, message

        raise ConfigurationError(message("No training script at that path", expected="a Python file",
                                         received=os.path.abspath(script),
                                         fix="check the path (relative to where xdevice launch runs)"))
    gpus = visible_gpu_indices([uuid for uuid, _ in nvml_physical_gpus()])
    processes = [subprocess.Popen([sys.executable, script, *args], env={**os.environ, **env})
                 for env in environments(nproc_per_node, gpus=gpus, **options)]
    try:
        while True:
            codes = [p.poll() for p in processes]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                _stop(processes, signal.SIGTERM)
                return failed[0]
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(processes, signal.SIGINT)
        return 130


def _stop(processes: list[subprocess.Popen], how: int, grace: float = 10.0) -> None:
    """Signal the processes still running; kill those that outlive ``grace`` seconds (a
    TensorFlow worker waiting for its peers ignores SIGTERM and SIGINT)."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(how)
    deadline = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
