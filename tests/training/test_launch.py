"""xdevice launch: one set of flags, every framework's environment; every framework trains across processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from xdevice import ConfigurationError
from xdevice.training.launch import environments

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import xdevice
    from xdevice import models, fit
    from xdevice.training.launch import world
    xdevice.join_processes(sys.argv[2])  # before building the model: JAX and TF join before computing
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = models.build("mlp", backend=sys.argv[2], hidden=[16], inputs=6, classes=2, seed=0)
    history = fit(model, (x, y), optimizer="adam", lr=0.01, epochs=2, batch_size=16, verbose=0)
    rank, size = world()
    params = {k: v.ravel().tolist() for k, v in model.numpy_params().items()}
    with open(sys.argv[1] + f"/rank{rank}of{size}.json", "w") as out:
        json.dump({"steps": history.steps, "params": params}, out)
""")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_every_framework_gets_its_environment_from_the_same_flags():
    envs = environments(2, nnodes=2, node_rank=1, master_addr="10.0.0.5", master_port=4000)
    assert [(e["RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"]) for e in envs] == [("2", "0", "4"), ("3", "1", "4")]
    assert {e["MASTER_ADDR"] for e in envs} == {"10.0.0.5"} and {e["MASTER_PORT"] for e in envs} == {"4000"}
    assert envs[0]["XDEVICE_COORDINATOR"] == "10.0.0.5:4001"
    assert "TF_CONFIG" not in envs[0]  # several nodes: TF would need every worker's address
    single = environments(2, master_port=4000)
    config = json.loads(single[1]["TF_CONFIG"])
    assert config == {"cluster": {"worker": ["127.0.0.1:4002", "127.0.0.1:4003"]},
                      "task": {"type": "worker", "index": 1}}
    assert "CUDA_VISIBLE_DEVICES" not in single[0]
    one_each = environments(2, gpus=[3, 1, 0])  # the visible GPUs, in CUDA's order
    assert [e["CUDA_VISIBLE_DEVICES"] for e in one_each] == ["3", "1"]
    assert "CUDA_VISIBLE_DEVICES" not in environments(3, gpus=[0, 1])[0]  # too few: they share


def test_bad_flags_say_what_is_allowed():
    with pytest.raises(ConfigurationError, match="node-rank must be below"):
        environments(2, nnodes=2, node_rank=2)
    with pytest.raises(ConfigurationError, match="nproc-per-node"):
        environments(0)


@pytest.mark.parametrize("framework, processes", [("torch", 2), ("torch", 3), ("torch", 4),
                                                          ("jax", 2), ("tensorflow", 2)])
def test_launched_processes_train_exactly_as_one(tmp_path, framework, processes):
    """torch: DistributedDataParallel over gloo (2-4 processes; 3: uneven slices of 16 rows);
    JAX: jax.distributed with a Mesh over every process's CPU; TensorFlow:
    MultiWorkerMirroredStrategy from TF_CONFIG (ring all-reduce over gRPC)."""
    pytest.importorskip(framework)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    launched = subprocess.run([sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", str(processes),
                               "--master-port", str(free_port()), str(script), str(tmp_path), framework],
                              capture_output=True, text=True, env=env, timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    alone = subprocess.run([sys.executable, str(script), str(tmp_path), framework], capture_output=True, text=True,
                           env=env, timeout=300)
    assert alone.returncode == 0, alone.stderr[-2000:]
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    assert len(one["steps"]) == 12
    for rank in range(processes):
        many = json.loads((tmp_path / f"rank{rank}of{processes}.json").read_text())
        np.testing.assert_allclose(many["steps"], one["steps"], rtol=1e-5, atol=1e-6)
        for key, value in one["params"].items():
            np.testing.assert_allclose(many["params"][key], value, rtol=1e-5, atol=1e-6, err_msg=key)


def test_a_failing_process_stops_the_launch_with_its_exit_code(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys, time\n"
                      "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
                      "time.sleep(60)\n")
    launched = subprocess.run([sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", "2", str(script)],
                              capture_output=True, text=True, timeout=60)
    assert launched.returncode == 3


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    """As a TensorFlow worker waiting for its peers does: the launch still ends, with rank 1's code."""
    script = tmp_path / "stubborn.py"
    script.write_text("import os, signal, sys, time\n"
                      "if os.environ['RANK'] == '1':\n    time.sleep(1)\n    sys.exit(4)\n"
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "time.sleep(120)\n")
    launched = subprocess.run([sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", "2", str(script)],
                              capture_output=True, text=True, timeout=60)
    assert launched.returncode == 4


UNSEEDED = textwrap.dedent("""
    import json, sys
    import numpy as np
    import xdevice
    from xdevice import fit
    from xdevice.training.launch import world
    framework = sys.argv[2]
    xdevice.join_processes(framework)  # before the framework computes
    if framework == "torch":
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        weights = lambda: [p.detach().numpy().ravel().tolist() for p in model.parameters()]
    else:
        import keras
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
        weights = lambda: [w.ravel().tolist() for w in model.get_weights()]
    x = np.random.default_rng(0).normal(size=(64, 6)).astype("float32")
    history = fit(model, (x, (x[:, 0] > 0).astype("int64")), epochs=1, batch_size=16, verbose=0)
    with open(sys.argv[1] + f"/rank{world()[0]}.json", "w") as out:
        json.dump({"steps": history.steps, "weights": weights()}, out)
""")


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_processes_start_from_rank_zeros_weights_when_the_model_is_not_seeded(tmp_path, framework):
    """Each process draws its own initial weights; training starts them all from rank 0's (as DDP does)."""
    pytest.importorskip(framework)
    script = tmp_path / "unseeded.py"
    script.write_text(UNSEEDED)
    launched = subprocess.run([sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", "2",
                               "--master-port", str(free_port()), str(script), str(tmp_path), framework],
                              capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                              timeout=300)
    assert launched.returncode == 0, launched.stderr[-2000:]
    first, second = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert len(first["steps"]) == 4 and first["steps"] == second["steps"]
    assert first["weights"] == second["weights"]
