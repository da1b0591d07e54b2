"""``xdevice launch`` with no flags inside each cluster job: two launchers on loopback stand in
for two pods (or Slurm nodes), each with the environment its operator sets, train the zoo's mlp
(deploy/training/train_zoo.py) and end as one process does; the example manifests run a
command the CLI accepts."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from xdevice.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "training" / "train_zoo.py"
#: what a scheduler sets, removed from the test's own environment so only the case's reaches the launcher
SCHEDULER = (
    "PET_",
    "SLURM_",
    "JAX_",
    "TF_CONFIG",
    "MASTER_",
    "WORLD_SIZE",
    "RANK",
    "COORDINATOR_",
    "NUM_PROC",
    "PROCESS_ID",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pods(scheduler: str) -> list[dict[str, str]]:
    """Each of two pods' (nodes') environment, as the operator's source sets it, on loopback."""
    port, other = free_port(), free_port()
    host = "127.0.0.1"
    if scheduler == "TrainJob":
        return [
            {
                "PET_NNODES": "2",
                "PET_NPROC_PER_NODE": "1",
                "PET_NODE_RANK": str(rank),
                "PET_MASTER_ADDR": host,
                "PET_MASTER_PORT": str(port),
            }
            for rank in (0, 1)
        ]
    if scheduler == "PyTorchJob":
        return [
            {
                "MASTER_ADDR": host,
                "MASTER_PORT": str(port),
                "WORLD_SIZE": "2",
                "RANK": str(rank),
                "PET_NNODES": "2",
                "PET_NODE_RANK": str(rank),
                "PET_MASTER_ADDR": host,
                "PET_MASTER_PORT": str(port),
            }
            for rank in (0, 1)
        ]
    if scheduler == "JAXJob":
        return [
            {"COORDINATOR_ADDRESS": host, "COORDINATOR_PORT": str(port), "NUM_PROCESSES": "2", "PROCESS_ID": str(rank)}
            for rank in (0, 1)
        ]
    if scheduler == "TrainJob-JAX":
        return [
            {"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": str(rank), "JAX_COORDINATOR_ADDRESS": f"{host}:{port}"}
            for rank in (0, 1)
        ]
    if scheduler == "TFJob":
        cluster = {"chief": [f"{host}:{port}"], "worker": [f"{host}:{other}"]}
        return [
            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": 0}, "environment": "cloud"})}
            for kind in ("chief", "worker")
        ]
    assert scheduler == "Slurm"  # srun, one task per node; MASTER_PORT exported (no job-id port clash here)
    return [
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_NNODES": "2",
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": str(rank),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": "0",
            "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
            "MASTER_PORT": str(port),
        }
        for rank in (0, 1)
    ]


def clean_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULER)}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.mark.parametrize(
    "scheduler, framework, joined",
    [
        ("TrainJob", "torch", "Kubeflow TrainJob (torch runtime): node {rank} of 2"),
        pytest.param("PyTorchJob", "torch", "Kubeflow PyTorchJob: node {rank} of 2", marks=pytest.mark.realworld),
        pytest.param("Slurm", "torch", "Slurm: node {rank} of 2", marks=pytest.mark.realworld),
        pytest.param("JAXJob", "jax", "Kubeflow JAXJob: node {rank} of 2", marks=pytest.mark.realworld),
        pytest.param(
            "TrainJob-JAX", "jax", "Kubeflow TrainJob (JAX runtime): node {rank}", marks=pytest.mark.realworld
        ),
        pytest.param("TFJob", "tensorflow", "Kubeflow TFJob: node {rank} of 2", marks=pytest.mark.realworld),
    ],
)
def test_two_pods_of_a_cluster_job_train_as_one_process(tmp_path, scheduler, framework, joined):
    """Each launcher gets only its pod's variables and no flags but the script's; the two meet,
    and both ranks end with the losses and weights of the script run alone."""
    pytest.importorskip(framework)
    pytest.importorskip("torch")  # the launcher: torchrun's agent
    base = clean_environment()
    command = [sys.executable, "-m", "xdevice", "launch", str(SCRIPT), "--backend", framework, "--out", str(tmp_path)]
    first, second = (
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**base, **pod})
        for pod in pods(scheduler)
    )
    outputs = [launcher.communicate(timeout=300) for launcher in (first, second)]
    for rank, (launcher, (_, err)) in enumerate(zip((first, second), outputs)):
        assert launcher.returncode == 0, err[-2500:]
        assert f"xdevice launch: joined {joined.format(rank=rank)}" in err
    alone = subprocess.run(
        [sys.executable, str(SCRIPT), "--backend", framework, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env=base,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    assert len(one["steps"]) == 12
    for rank in (0, 1):
        many = json.loads((tmp_path / f"rank{rank}of2.json").read_text())
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5, atol=1e-6)
        for key, value in one["params"].items():
            np.testing.assert_allclose(many["params"][key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def launch_command(words: list[str]) -> list[str]:
    """The arguments after ``xdevice launch`` in a container's command or a script line."""
    assert words[:2] == ["xdevice", "launch"], words
    return words[2:]


def test_the_example_manifests_run_a_launch_the_cli_accepts_on_the_training_script():
    folder = ROOT / "deploy" / "training"
    trainjob = yaml.safe_load((folder / "trainjob-torch.yaml").read_text())
    assert trainjob["kind"] == "TrainJob" and trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed"
    jaxjob = yaml.safe_load((folder / "jaxjob.yaml").read_text())
    (worker,) = jaxjob["spec"]["jaxReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert jaxjob["kind"] == "JAXJob" and worker["name"] == "jax"  # the operator's default container name
    assert {"name": "jaxjob-port", "containerPort": 6666} in worker["ports"]
    sruns = [line for line in (folder / "slurm.sbatch").read_text().splitlines() if line.startswith("srun ")]
    commands = {
        "TrainJob": trainjob["spec"]["trainer"]["command"],
        "JAXJob": worker["command"],
        "Slurm": shlex.split(sruns[0])[1:],
    }
    for name, words in commands.items():
        args = build_parser().parse_args(["launch", *launch_command(words)])
        assert (ROOT / args.script).resolve() == SCRIPT, name
        assert args.nproc_per_node is None and args.nnodes is None and args.master_port is None, name  # the job's
        script_flags = args.script_args
        assert script_flags[:1] == ["--backend"] and script_flags[1] in ("torch", "jax", "tensorflow"), name
