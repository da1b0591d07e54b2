"""``xdevice launch``: start N training processes per node, set up for every framework at once.

From one set of flags each process gets the environment that each framework's own
distributed engine reads:

- PyTorch (``torch.distributed``, ``init_method="env://"``): ``RANK``, ``WORLD_SIZE``,
  ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``;
- JAX (``jax.distributed.initialize``): ``XDEVICE_COORDINATOR`` (``MASTER_ADDR:MASTER_PORT+1``),
  with ``RANK`` / ``WORLD_SIZE`` as process id and count (:func:`initialize` passes them);
- TensorFlow (``MultiWorkerMirroredStrategy``): ``TF_CONFIG``, workers on
  ``MASTER_ADDR:MASTER_PORT+2+rank``. Only for one node: TF needs every worker's address,
  and with several nodes only the master's is known, so ``TF_CONFIG`` is left unset there.

In the launched process, xdevice joins JAX's and TensorFlow's groups when it first loads
their backend (both must be joined before the framework's first computation), and torch's
when a trainer first needs it. :func:`initialize` does it by hand.

Decisions: ranks are ``node_rank * nproc_per_node + local_rank``; with a GPU per process,
process ``i`` sees only the ``i``-th visible GPU (``CUDA_VISIBLE_DEVICES``), as its ``gpu:0``:
one device per process is what DDP, ``jax.distributed`` and MultiWorkerMirroredStrategy
expect; if any process fails, the others on this node are stopped and its exit code is returned.

>>> environments(2, master_port=29500)[1]["RANK"]
'1'
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["environments", "initialize", "join_launched_group", "launch", "world"]


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
               "MASTER_PORT": str(master_port), "XDEVICE_COORDINATOR": f"{master_addr}:{master_port + 1}"}
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


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: ``(0, 1)`` unless started by ``xdevice launch``
    (or torchrun, which sets the same variables)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


_tf_strategy = None


def initialize(framework: str) -> Any:
    """Join the process group of ``framework`` from the launcher's environment (idempotent).
    For TensorFlow, returns the process's one ``MultiWorkerMirroredStrategy``."""
    global _tf_strategy
    rank, size = world()
    if framework == "torch":
        import torch.distributed as dist

        if not dist.is_initialized():
            import torch

            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo", init_method="env://",
                                    rank=rank, world_size=size)
            # left to interpreter exit, gloo's threads can abort the process ("terminate called
            # without an active exception"): leave the group in order, after every rank is done
            atexit.register(_leave_torch_group)
    elif framework == "jax":
        import jax

        if jax.distributed.is_initialized():
            return
        if "XDEVICE_COORDINATOR" not in os.environ:
            raise ConfigurationError(message(
                "JAX needs a coordinator address to join the other processes",
                expected="XDEVICE_COORDINATOR=host:port (xdevice launch sets it)", received="unset",
                fix="start the script with xdevice launch, or call jax.distributed.initialize(...) yourself"))
        try:
            jax.distributed.initialize(os.environ["XDEVICE_COORDINATOR"], num_processes=size, process_id=rank)
        except RuntimeError as error:
            raise ConfigurationError(message(
                "JAX could not join the launched processes", received=str(error),
                fix="use xdevice (or call xdevice.training.launch.initialize('jax')) before computing "
                    "anything with JAX in a launched script")) from error
    elif framework == "tensorflow":
        if _tf_strategy is None:
            if "TF_CONFIG" not in os.environ:
                raise ConfigurationError(message(
                    "TensorFlow needs TF_CONFIG to join the other workers", received="TF_CONFIG unset",
                    fix="xdevice launch sets it for one node; with several nodes write each worker's TF_CONFIG"))
            import tensorflow as tf

            kinds = tf.distribute.experimental.CommunicationImplementation  # RING: gRPC, for CPUs
            gpus = bool(tf.config.list_physical_devices("GPU"))
            options = tf.distribute.experimental.CommunicationOptions(
                implementation=kinds.NCCL if gpus else kinds.RING)
            _tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, signal.SIG_DFL)  # TF's own handler swallows SIGTERM
        return _tf_strategy
    else:
        raise ConfigurationError(message("No multi-process set-up for this framework", received=framework,
                                         choices=["torch", "jax", "tensorflow"]))
    return None


_ADDRESS = {"jax": "XDEVICE_COORDINATOR", "tensorflow": "TF_CONFIG"}  # where each finds the others


def join_launched_group(framework: str) -> None:
    """:func:`initialize` ``framework`` if ``xdevice launch`` started this process (called when
    xdevice first loads a backend whose group must be joined before its first computation)."""
    if world()[1] > 1 and _ADDRESS[framework] in os.environ:
        initialize(framework)


def _leave_torch_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
