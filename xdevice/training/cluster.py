"""Which cluster job this process runs in, read from the environment its scheduler set.

``xdevice launch`` joins the job with no flags: :func:`cluster_job` reads the variables below
and says how many machines meet, which one this is, where they meet and how many processes
each starts. The names were checked against the operators' own source:

- Kubeflow Trainer v2 ``TrainJob`` (v2.3.0, ``pkg/runtime/framework/plugins/torch/torch.go``
  and ``jax/jax.go``): the torch runtime sets ``PET_NNODES``, ``PET_NPROC_PER_NODE`` (a count
  or ``auto``), ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT`` (29500); the JAX
  runtime sets ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` and ``JAX_COORDINATOR_ADDRESS``
  (``host:port``), one process per node. Trainer v2 has no TensorFlow runtime.
- the v1 training-operator (the last v1 source, ``pkg/controller.v1``): ``PyTorchJob`` sets
  ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK`` (the pod's number: the master is
  0, worker ``i`` is ``i + 1``) and, since v1.6, ``PET_NNODES``, ``PET_NODE_RANK``,
  ``PET_NPROC_PER_NODE`` and ``PET_MASTER_*``, or with an elastic policy ``PET_NNODES=MIN:MAX``
  and ``PET_RDZV_ENDPOINT``/``PET_RDZV_BACKEND``; ``TFJob`` sets ``TF_CONFIG`` (``cluster``:
  each task type's ``host:port`` list, ``task``: this pod's type and index); ``JAXJob`` sets
  ``COORDINATOR_ADDRESS``, ``COORDINATOR_PORT`` (6666), ``NUM_PROCESSES``, ``PROCESS_ID``.
- Slurm, in a step started by ``srun``: ``SLURM_JOB_ID``, ``SLURM_NNODES``, ``SLURM_NODEID``,
  ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_JOB_NODELIST`` (``SLURM_STEP_NODELIST`` first:
  the step's own nodes), ``SLURM_GPUS_ON_NODE``. The first host of the node list is where the
  processes meet; Slurm gives no port, so ``MASTER_PORT`` when the script exports one, else
  ``15000 + the job id's last four digits`` (Lightning's rule: every node computes the same).

Where the scheduler starts one process per task (Slurm with several tasks per node, JAXJob,
Trainer's JAX runtime, TFJob), each task is one node of one process to the launcher, so its
rank is the task's number. Imports nothing heavy: it is pure, over the mapping it is given.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable, Mapping

from xdevice._errors import ConfigurationError, message

__all__ = ["ClusterJob", "cluster_job", "slurm_hosts"]


@dataclasses.dataclass(frozen=True)
class ClusterJob:
    """A cluster job as ``xdevice launch`` joins it.

    Attributes:
        scheduler: what started this process, in words (``"Kubeflow TrainJob (torch runtime)"``).
        nnodes: machines (launchers) that meet: ``"2"``, or ``"1:4"`` for an elastic job.
        node_rank: this launcher's number among them; None when the rendezvous assigns it.
        nproc_per_node: processes this launcher starts.
        coordinator: ``host:port`` where the launchers meet (node 0's).
        world_size: processes in all; None when elastic.
        rank: this process's rank where the scheduler starts one process per task, else None.
        rdzv_backend: torchrun's rendezvous: ``"static"`` when every node knows its number.
    """

    scheduler: str
    nnodes: str
    node_rank: int | None
    nproc_per_node: int
    coordinator: str
    world_size: int | None = None
    rank: int | None = None
    rdzv_backend: str = "static"

    @property
    def host(self) -> str:
        return self.coordinator.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        return int(self.coordinator.rsplit(":", 1)[1])

    def describe(self) -> str:
        """One line: the scheduler, this node among the nodes, and where they meet.

        >>> ClusterJob("Slurm", "2", 1, 4, "node01:15042", world_size=8).describe()
        'Slurm: node 1 of 2, 4 process(es) here, 8 in all, meeting at node01:15042'
        """
        node = f"node {self.node_rank} of {self.nnodes}" if self.node_rank is not None else f"{self.nnodes} nodes"
        total = f", {self.world_size} in all" if self.world_size is not None else ""
        return f"{self.scheduler}: {node}, {self.nproc_per_node} process(es) here{total}, meeting at {self.coordinator}"


def cluster_job(env: Mapping[str, str], *, gpus: Callable[[], int] = lambda: 0) -> ClusterJob | None:
    """The cluster job the environment ``env`` describes, or None outside one.

    ``gpus()`` counts this machine's GPUs, asked only for Trainer's ``PET_NPROC_PER_NODE=auto``
    (one process per GPU, at least one). Checked in this order: the torch variables of Trainer
    v2 and the v1 PyTorchJob (``PET_*``), Trainer's JAX runtime, JAXJob, TFJob, an older
    PyTorchJob (``MASTER_ADDR``, ``WORLD_SIZE``, ``RANK`` only), then a Slurm step.

    Raises:
        ConfigurationError: the variables are there but cannot be joined (a malformed value, a
            TFJob task that is not a chief or worker), named with the variable.

    >>> cluster_job({}) is None
    True
    >>> env = {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1", "JAX_COORDINATOR_ADDRESS": "j-0-0.j:29500"}
    >>> job = cluster_job(env)
    >>> job.node_rank, job.nproc_per_node, job.coordinator, job.rank
    (1, 1, 'j-0-0.j:29500', 1)
    """
    if "PET_NNODES" in env and ("PET_MASTER_ADDR" in env or "PET_RDZV_ENDPOINT" in env):
        return _torch_job(env, gpus)
    if "JAX_COORDINATOR_ADDRESS" in env:
        count, rank = _int(env, "JAX_NUM_PROCESSES"), _int(env, "JAX_PROCESS_ID")
        return _one_per_task("Kubeflow TrainJob (JAX runtime)", count, rank, _address(env, "JAX_COORDINATOR_ADDRESS"))
    if "COORDINATOR_ADDRESS" in env and "NUM_PROCESSES" in env:
        count, rank = _int(env, "NUM_PROCESSES"), _int(env, "PROCESS_ID")
        where = f"{env['COORDINATOR_ADDRESS']}:{_int(env, 'COORDINATOR_PORT')}"
        return _one_per_task("Kubeflow JAXJob", count, rank, where)
    if "TF_CONFIG" in env:
        return _tf_job(env["TF_CONFIG"])
    if {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"} <= env.keys():
        count, rank = _int(env, "WORLD_SIZE"), _int(env, "RANK")
        where = f"{env['MASTER_ADDR']}:{_int(env, 'MASTER_PORT')}"
        return _one_per_task("Kubeflow PyTorchJob", count, rank, where)
    if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
        return _slurm_job(env)
    return None


def slurm_hosts(nodelist: str) -> list[str]:
    """The hosts of a Slurm node list, in order (``scontrol show hostnames``, without Slurm).

    >>> slurm_hosts("node[01-03,07],gpu-a")
    ['node01', 'node02', 'node03', 'node07', 'gpu-a']
    >>> slurm_hosts("rack[1-2]-n[8-9]")
    ['rack1-n8', 'rack1-n9', 'rack2-n8', 'rack2-n9']
    """
    hosts: list[str] = []
    for name in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):
        expanded = [""]
        for text, ranges in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", name):
            suffixes = [text + item for item in _ranges(ranges)] if ranges else [text]
            expanded = [head + tail for head in expanded for tail in suffixes]
        hosts += expanded
    return hosts


def _ranges(ranges: str) -> list[str]:
    """``"01-03,7"`` as ``["01", "02", "03", "7"]``, keeping each range's zero padding."""
    items = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        if not high:
            items.append(low)
            continue
        items += [str(number).zfill(len(low)) for number in range(int(low), int(high) + 1)]
    return items


def _torch_job(env: Mapping[str, str], gpus: Callable[[], int]) -> ClusterJob:
    """Trainer v2's torch runtime, or a v1 PyTorchJob (``PET_*``; elastic with a rendezvous endpoint)."""
    scheduler = (
        "Kubeflow PyTorchJob" if "RANK" in env or "PET_RDZV_ENDPOINT" in env else "Kubeflow TrainJob (torch runtime)"
    )
    per_node = env.get("PET_NPROC_PER_NODE", "1")
    nproc = max(1, gpus()) if per_node == "auto" else _int(env, "PET_NPROC_PER_NODE", default="1")
    nnodes = env["PET_NNODES"]
    if not re.fullmatch(r"[1-9]\d*(:[1-9]\d*)?", nnodes):
        raise ConfigurationError(
            message("PET_NNODES is a node count or a range", expected="N or MIN:MAX", received=nnodes)
        )
    if "PET_RDZV_ENDPOINT" in env:  # elastic: the rendezvous numbers the nodes
        where = _address(env, "PET_RDZV_ENDPOINT")
        return ClusterJob(scheduler, nnodes, None, nproc, where, rdzv_backend=env.get("PET_RDZV_BACKEND", "c10d"))
    node_rank = _int(env, "PET_NODE_RANK")
    where = f"{env['PET_MASTER_ADDR']}:{_int(env, 'PET_MASTER_PORT')}"
    return ClusterJob(scheduler, nnodes, node_rank, nproc, where, world_size=int(nnodes.split(":")[0]) * nproc)


def _tf_job(text: str) -> ClusterJob:
    """A TFJob's ``TF_CONFIG``: its chief (or master) is rank 0, worker ``i`` follows."""
    try:
        config = json.loads(text)
        cluster, task = config["cluster"], config["task"]
        kind, index = str(task["type"]).lower(), int(task["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigurationError(
            message(
                "TF_CONFIG is JSON with a cluster and a task",
                expected='{"cluster": {...}, "task": {"type": ..., "index": ...}}',
                received=text[:200],
            )
        ) from error
    leaders = [kind for kind in ("chief", "master") if cluster.get(kind)]
    others = sorted(set(cluster) - {"chief", "master", "worker"})
    if kind not in ("chief", "master", "worker") or others or not all(isinstance(cluster[k], list) for k in cluster):
        raise ConfigurationError(
            message(
                "xdevice launch trains data-parallel over a TFJob's chief and workers",
                received=f"task {kind!r}, cluster {sorted(cluster)}"
                + (" with dynamic workers" if not all(isinstance(cluster[k], list) for k in cluster) else ""),
                fix="run xdevice launch in Chief and Worker replicas only (no PS or Evaluator, no enableDynamicWorker)",
            )
        )
    ordered = [address for name in (*leaders, "worker") for address in cluster.get(name, [])]
    rank = index if kind != "worker" else index + sum(len(cluster[name]) for name in leaders)
    return _one_per_task("Kubeflow TFJob", len(ordered), rank, ordered[0])


def _slurm_job(env: Mapping[str, str]) -> ClusterJob:
    """A Slurm step: one launcher per node, or one per task when a node runs several."""
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
    hosts = slurm_hosts(nodelist)
    if not hosts:
        raise ConfigurationError(
            message("A Slurm step names its nodes", expected="SLURM_JOB_NODELIST", received="unset")
        )
    host = env.get("MASTER_ADDR", hosts[0])
    job_id = re.sub(r"\D", "", env["SLURM_JOB_ID"]) or "0"
    port = _int(env, "MASTER_PORT", default=str(15000 + int(job_id[-4:])))
    nodes, tasks = _int(env, "SLURM_NNODES", default="1"), _int(env, "SLURM_NTASKS", default="1")
    if tasks > nodes:  # srun started one process per task (--ntasks-per-node > 1)
        return _one_per_task("Slurm", tasks, _int(env, "SLURM_PROCID"), f"{host}:{port}")
    nproc = _int(env, "SLURM_GPUS_ON_NODE", default="1") or 1
    node_rank = _int(env, "SLURM_NODEID")
    return ClusterJob("Slurm", str(nodes), node_rank, nproc, f"{host}:{port}", world_size=nodes * nproc)


def _one_per_task(scheduler: str, count: int, rank: int, coordinator: str) -> ClusterJob:
    if not 0 <= rank < count:
        raise ConfigurationError(
            message(
                f"The {scheduler}'s process number is one of its processes",
                expected=f"0 <= rank < {count}",
                received=rank,
            )
        )
    return ClusterJob(scheduler, str(count), rank, 1, coordinator, world_size=count, rank=rank)


def _int(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    value = env.get(name, default)
    if value is None or not value.strip().isdigit():
        raise ConfigurationError(message(f"{name} is a whole number", received=value if value is not None else "unset"))
    return int(value)


def _address(env: Mapping[str, str], name: str) -> str:
    value = env[name]
    if not re.fullmatch(r".+:\d+", value):
        raise ConfigurationError(message(f"{name} is host:port", received=value))
    return value
