"""The process launcher of ``xdevice launch``: torchrun's elastic agent, run in process.

The agent (``torch.distributed.run``) starts the processes, restarts the whole group when
one fails (``--max-restarts``), meets the other nodes through a rendezvous (``c10d`` by
default: ``--nnodes MIN:MAX`` lets nodes come and go), writes each rank's output to its own
log files and prefixes the lines it shows with the rank. :func:`arguments` is its command
line; the workers it starts run this module, which sets up every installed framework and
then runs the user's script:

- what each framework's engine needs (PyTorch's rendezvous, JAX's coordinator, TensorFlow's
  cluster) comes from that backend's launch hook (``xdevice._processes.environment``): this
  module only hands the hooks a :class:`~xdevice._processes.Rendezvous` over the agent's
  store (the ``TCPStore`` at ``MASTER_ADDR:MASTER_PORT``), through which the workers publish
  the addresses no flag gives;
- with a GPU per process, local rank ``i`` sees only the ``i``-th visible GPU, as its
  ``gpu:0`` (one device per process is what DDP, ``jax.distributed`` and
  ``MultiWorkerMirroredStrategy`` expect).

Keys are scoped by the run id and the restart count, so a restarted group publishes afresh.
The registry finds this module as the ``agent`` of the torch backend's package
(``_registry.providers("agent")``); importing it imports no framework.
"""

from __future__ import annotations

import atexit
import os
import runpy
import socket
import sys
import traceback
import uuid
from datetime import timedelta

from xdevice._processes import Rendezvous, environment

#: the agent's own settings: the lines it shows are prefixed with the global rank
AGENT_ENVIRONMENT = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[rank${rank}]: "}


def arguments(
    script: str,
    args: list[str],
    *,
    nproc_per_node: int,
    nnodes: str = "1",
    node_rank: int | None = None,
    master_addr: str | None = None,
    master_port: int | None = None,
    max_restarts: int = 0,
    rdzv_backend: str = "c10d",
    rdzv_id: str | None = None,
    log_dir: str | None = None,
) -> list[str]:
    """torchrun's arguments to run ``script args`` in ``nproc_per_node`` workers per node (each
    a worker of this module, which then runs the script)."""
    line = [
        "--nproc-per-node",
        str(nproc_per_node),
        "--nnodes",
        nnodes,
        "--max-restarts",
        str(max_restarts),
        "--tee",
        "3",
        "--shutdown-timeout",
        "10",
    ]  # a stopped agent (Ctrl-C) kills workers 10 s after SIGTERM
    if master_port is None and nnodes in ("1", "1:1"):  # torchrun's --standalone: c10d on a free local port
        line += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", rdzv_id or str(uuid.uuid4())]
    else:
        line += ["--rdzv-backend", rdzv_backend, "--rdzv-endpoint", f"{master_addr or '127.0.0.1'}:{master_port}"]
        if rdzv_id:
            line += ["--rdzv-id", rdzv_id]
        if node_rank is not None and rdzv_backend == "static":
            line += ["--node-rank", str(node_rank)]
    if log_dir:
        line += ["--log-dir", log_dir]
    return [*line, "-m", __name__, script, *args]


def run(torchrun_arguments: list[str]) -> int:
    """Run the agent here (``torchrun`` with these arguments); the first failed rank's exit
    code, said in one line, or 0."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    for key, value in AGENT_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    parsed = parse_args(torchrun_arguments)
    _share_threads(parsed.nproc_per_node)
    config, entrypoint, entry_arguments = config_from_args(parsed)
    try:
        elastic_launch(config=config, entrypoint=entrypoint)(*entry_arguments)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        code = failure.exitcode if failure.exitcode > 0 else 1
        print(
            f"xdevice launch: rank {rank} failed with exit code {failure.exitcode} "
            f"({config.max_restarts} restart(s) allowed); its output is above, prefixed [rank{rank}]",
            file=sys.stderr,
        )
        return code
    return 0


def _share_threads(nproc_per_node: str) -> None:
    """``OMP_NUM_THREADS`` for the workers, when the user set none and there are several: the
    CPUs this process may use, shared out (at least 1 each), so that N workers do not each
    start a thread per core. torchrun would set 1 and print a five-line banner saying so (its
    only sign is that banner); set here, the banner has nothing to announce, and workers
    training on the CPU get the cores there are."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    from torch.distributed.run import determine_local_world_size

    workers = determine_local_world_size(nproc_per_node)
    if workers > 1:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        os.environ["OMP_NUM_THREADS"] = str(max(1, cpus // workers))


def worker_environment() -> dict[str, str]:
    """In a worker: its GPU, and what every installed framework needs to meet the other
    workers (each backend's launch hook), learnt through the agent's store."""
    import torch.distributed as dist

    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local, local_size = int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    master, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    env = {}
    gpus = _visible_gpus()
    if gpus and len(gpus) >= local_size:  # too few: they share what is visible
        env["CUDA_VISIBLE_DEVICES"] = gpus[local]  # by UUID: MIG slices have no number
    if size == 1:
        return env
    store = dist.TCPStore(master, port, is_master=False, timeout=timedelta(seconds=300))
    prefix = (
        f"xdevice/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    )
    rendezvous = Rendezvous(
        rank=rank,
        size=size,
        local_rank=local,
        local_size=local_size,
        address=master,
        port=port,
        host=_host_towards(master, port),
        publish=lambda key, value: store.set(prefix + key, value),
        lookup=lambda key: store.get(prefix + key).decode(),  # waits until it is set
    )
    return {**env, **environment(rendezvous)}


def _host_towards(master: str, port: int) -> str:
    """This machine's address on the route to the master (what the other nodes can reach)."""
    with socket.create_connection((master, port), timeout=30) as probe:
        return probe.getsockname()[0]


def _visible_gpus() -> list[str]:
    """UUIDs of the GPUs (or MIG slices) visible to the launcher, in CUDA's order."""
    from xdevice._discovery import nvml_physical_gpus, visible_gpu_indices

    uuids = [gpu_uuid for gpu_uuid, _ in nvml_physical_gpus()]
    return [uuids[index] for index in visible_gpu_indices(uuids)]


def main(argv: list[str]) -> None:
    """A worker: set up every framework's environment, run the script as ``__main__``, then end
    the process once its exit handlers ran (xdevice's leaves the process group in order).

    The end skips the interpreter's own teardown: there, gloo's and the store's threads can
    still be joinable when C++ destroys them, which aborts a finished worker ("terminate
    called without an active exception") and fails a run that succeeded."""
    if not argv:
        raise SystemExit("usage: python -m xdevice.backends.torch.agent SCRIPT [ARGS...] (under torchrun)")
    os.environ.update(worker_environment())
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:  # sys.exit(n), or sys.exit("message"): printed, status 1
        if isinstance(stop.code, int) or stop.code is None:
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - reported as the interpreter would, then the same end
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
