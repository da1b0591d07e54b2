"""The cluster job a launcher is in, from the variables each scheduler sets (as its source sets them)."""

from __future__ import annotations

import json

import pytest

from xdevice import ConfigurationError
from xdevice.training.cluster import ClusterJob, cluster_job, slurm_hosts
from xdevice.training.launch import with_cluster

#: Trainer v2.3.0's torch plugin, node 1 of a TrainJob "mlp" with numNodes 2, numProcPerNode 4
TRAINJOB_TORCH = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "mlp-node-0-0.mlp",
    "PET_MASTER_PORT": "29500",
}


def test_a_trainjob_on_the_torch_runtime():
    assert cluster_job(TRAINJOB_TORCH) == ClusterJob(
        "Kubeflow TrainJob (torch runtime)", "2", 1, 4, "mlp-node-0-0.mlp:29500", world_size=8
    )


def test_auto_processes_per_node_is_one_per_gpu_and_at_least_one():
    auto = {**TRAINJOB_TORCH, "PET_NPROC_PER_NODE": "auto"}
    assert cluster_job(auto, gpus=lambda: 8).nproc_per_node == 8
    assert cluster_job(auto, gpus=lambda: 0).nproc_per_node == 1
    asked = []
    cluster_job(TRAINJOB_TORCH, gpus=lambda: asked.append(1) or 0)
    assert asked == []  # GPUs are counted only for "auto"


def test_a_pytorchjob_of_the_v1_operator():
    """Worker 0 of a PyTorchJob with a Master and 2 Workers: pod rank 1 (the master is 0)."""
    env = {
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
        "WORLD_SIZE": "3",
        "RANK": "1",
        "PET_MASTER_ADDR": "job-master-0",
        "PET_MASTER_PORT": "23456",
        "PET_NNODES": "3",
        "PET_NODE_RANK": "1",
    }
    job = cluster_job(env)
    assert (job.scheduler, job.nnodes, job.node_rank, job.nproc_per_node) == ("Kubeflow PyTorchJob", "3", 1, 1)
    assert job.coordinator == "job-master-0:23456" and job.rdzv_backend == "static"
    older = {k: v for k, v in env.items() if not k.startswith("PET_")}  # before v1.6: no PET_*
    assert cluster_job(older) == ClusterJob("Kubeflow PyTorchJob", "3", 1, 1, "job-master-0:23456", 3, rank=1)


def test_an_elastic_pytorchjob_meets_at_its_rendezvous_endpoint_unnumbered():
    env = {"PET_NNODES": "1:4", "PET_RDZV_ENDPOINT": "job-worker-0:23456", "PET_RDZV_BACKEND": "c10d"}
    env["PET_NPROC_PER_NODE"] = "2"
    job = cluster_job(env)
    assert (job.nnodes, job.node_rank, job.rdzv_backend, job.world_size) == ("1:4", None, "c10d", None)
    assert job.coordinator == "job-worker-0:23456"
    assert job.describe() == "Kubeflow PyTorchJob: 1:4 nodes, 2 process(es) here, meeting at job-worker-0:23456"


def test_a_trainjob_on_the_jax_runtime_and_a_jaxjob_run_one_process_per_pod():
    trainjob = {"JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3", "JAX_COORDINATOR_ADDRESS": "mlp-node-0-0.mlp:29500"}
    assert cluster_job(trainjob) == ClusterJob(
        "Kubeflow TrainJob (JAX runtime)", "4", 3, 1, "mlp-node-0-0.mlp:29500", world_size=4, rank=3
    )
    jaxjob = {"COORDINATOR_ADDRESS": "job-worker-0", "COORDINATOR_PORT": "6666", "NUM_PROCESSES": "2"}
    jaxjob["PROCESS_ID"] = "1"
    assert cluster_job(jaxjob) == ClusterJob("Kubeflow JAXJob", "2", 1, 1, "job-worker-0:6666", world_size=2, rank=1)


def tf_config(kind: str, index: int, **cluster: list[str]) -> dict[str, str]:
    return {
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"})
    }


def test_a_tfjob_numbers_its_chief_first_then_its_workers():
    workers = ["job-worker-0.ns.svc:2222", "job-worker-1.ns.svc:2222"]
    chief = ["job-chief-0.ns.svc:2222"]
    second = cluster_job(tf_config("worker", 1, chief=chief, worker=workers))
    assert second == ClusterJob("Kubeflow TFJob", "3", 2, 1, "job-chief-0.ns.svc:2222", world_size=3, rank=2)
    assert cluster_job(tf_config("chief", 0, chief=chief, worker=workers)).rank == 0
    alone = cluster_job(tf_config("worker", 0, worker=workers))  # no chief: worker 0 leads
    assert (alone.rank, alone.coordinator) == (0, "job-worker-0.ns.svc:2222")


def test_a_tfjob_with_parameter_servers_or_an_evaluator_is_refused_by_name():
    with pytest.raises(ConfigurationError, match="chief and workers.*'ps'.*Fix: run xdevice launch in Chief"):
        cluster_job(tf_config("worker", 0, worker=["w:2222"], ps=["p:2222"]))
    with pytest.raises(ConfigurationError, match="task 'evaluator'"):
        cluster_job(tf_config("evaluator", 0, worker=["w:2222"], evaluator=["e:2222"]))
    sparse = {
        "TF_CONFIG": json.dumps({"cluster": {"worker": {"1": "w1:2222"}}, "task": {"type": "worker", "index": 1}})
    }
    with pytest.raises(ConfigurationError, match="dynamic workers"):
        cluster_job(sparse)
    with pytest.raises(ConfigurationError, match="TF_CONFIG is JSON with a cluster and a task"):
        cluster_job({"TF_CONFIG": "{not json"})


SLURM = {
    "SLURM_JOB_ID": "912345",
    "SLURM_NNODES": "4",
    "SLURM_NODEID": "2",
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_JOB_NODELIST": "gpu[07-09,12]",
}


def test_a_slurm_step_with_one_task_per_node_starts_a_process_per_gpu():
    job = cluster_job({**SLURM, "SLURM_GPUS_ON_NODE": "8"})
    assert job == ClusterJob("Slurm", "4", 2, 8, "gpu07:17345", world_size=32)  # 15000 + 2345
    assert cluster_job(SLURM).nproc_per_node == 1  # no GPUs allocated
    assert cluster_job({**SLURM, "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29400"}).coordinator == "10.0.0.9:29400"
    step = {**SLURM, "SLURM_STEP_NODELIST": "gpu[08-09]"}  # the step's own nodes come first
    assert cluster_job(step).coordinator == "gpu08:17345"


def test_a_slurm_step_with_several_tasks_per_node_is_one_process_per_task():
    env = {**SLURM, "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "SLURM_NODEID": "1", "SLURM_PROCID": "5"}
    assert cluster_job(env) == ClusterJob("Slurm", "8", 5, 1, "gpu07:17345", world_size=8, rank=5)


def test_an_allocation_shell_without_a_step_is_not_joined():
    """salloc's shell has a job but no task number: launching there is a one-machine launch."""
    shell = {k: v for k, v in SLURM.items() if k not in ("SLURM_PROCID", "SLURM_NODEID", "SLURM_LOCALID")}
    assert cluster_job(shell) is None
    assert cluster_job({"HOME": "/root", "PATH": "/usr/bin"}) is None


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
        ("node7", ["node7"]),
        ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
        ("rack[1-2]-n[8,10]", ["rack1-n8", "rack1-n10", "rack2-n8", "rack2-n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ],
)
def test_slurm_node_lists_expand_as_scontrol_show_hostnames_does(nodelist, hosts):
    assert slurm_hosts(nodelist) == hosts


def test_a_malformed_value_is_named():
    with pytest.raises(ConfigurationError, match="PET_NODE_RANK is a whole number.*Received: 'one'"):
        cluster_job({**TRAINJOB_TORCH, "PET_NODE_RANK": "one"})
    with pytest.raises(ConfigurationError, match="JAX_COORDINATOR_ADDRESS is host:port"):
        cluster_job({"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0", "JAX_COORDINATOR_ADDRESS": "host"})
    with pytest.raises(ConfigurationError, match="Expected 0 <= rank < 2.*Received: 2"):
        cluster_job({"COORDINATOR_ADDRESS": "a", "COORDINATOR_PORT": "1", "NUM_PROCESSES": "2", "PROCESS_ID": "2"})


def test_flags_given_win_over_the_job_and_the_rest_come_from_it():
    options, job = with_cluster(
        {
            "nproc_per_node": None,
            "nnodes": None,
            "node_rank": None,
            "master_addr": None,
            "master_port": 29999,
            "rdzv_backend": None,
            "log_dir": "logs",
        },
        env=TRAINJOB_TORCH,
    )
    assert job is not None and job.scheduler == "Kubeflow TrainJob (torch runtime)"
    assert options == {
        "nproc_per_node": 4,
        "nnodes": "2",
        "node_rank": 1,
        "master_addr": "mlp-node-0-0.mlp",
        "master_port": 29999,
        "rdzv_backend": "static",
        "log_dir": "logs",
    }
    alone, none = with_cluster({"nproc_per_node": 3, "nnodes": None, "rdzv_backend": None}, env={})
    assert none is None and alone == {"nproc_per_node": 3, "nnodes": "1", "rdzv_backend": "c10d"}
