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

from xdevice import ConfigurationError, _registry
from xdevice.training.launch import arguments

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


def launch(*flags: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "xdevice", "launch", *flags],
        capture_output=True,
        text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=timeout,
    )


def test_bad_flags_say_what_is_allowed(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ConfigurationError, match="--nproc-per-node must be an int of at least 1"):
        arguments(str(script), [], 0)
    with pytest.raises(ConfigurationError, match="Expected N or MIN:MAX.*Received: '0:2'"):
        arguments(str(script), [], 2, nnodes="0:2")
    with pytest.raises(ConfigurationError, match="Several nodes meet at a rendezvous endpoint.*--master-port"):
        arguments(str(script), [], 2, nnodes="1:4")
    with pytest.raises(ConfigurationError, match="No training script at that path"):
        arguments(str(tmp_path / "missing.py"), [], 2)
    elastic = arguments(
        str(script), ["--lr", "0.1"], 2, nnodes="1:4", master_addr="10.0.0.5", master_port=4000, max_restarts=3
    )
    assert elastic[elastic.index("--rdzv-endpoint") + 1] == "10.0.0.5:4000"
    assert elastic[elastic.index("--nnodes") + 1] == "1:4" and elastic[elastic.index("--max-restarts") + 1] == "3"
    assert elastic[-3:] == [str(script), "--lr", "0.1"]


HOOKS = textwrap.dedent("""
    import json, sys, threading
    from xdevice import _processes

    published, ready = {}, threading.Condition()

    def publish(key, value):
        with ready:
            published[key] = value
            ready.notify_all()

    def lookup(key):
        with ready:
            ready.wait_for(lambda: key in published, timeout=30)
            return published[key]

    found = {}

    def worker(rank):
        rendezvous = _processes.Rendezvous(
            rank=rank, size=2, local_rank=rank, local_size=2, address="127.0.0.1", port=29500,
            host="127.0.0.1", publish=publish, lookup=lookup,
        )
        found[rank] = _processes.environment(rendezvous)

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"env": found, "imported": [m for m in ("torch", "jax", "tensorflow") if m in sys.modules]}))
""")


def test_each_backend_writes_what_its_engine_needs_from_one_rendezvous_and_imports_no_framework(run_python):
    """Two processes (threads over one store): every installed backend's launch hook adds its
    engine's variables, published and looked up through the rendezvous."""
    result = run_python(HOOKS)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    first, second = out["env"]["0"], out["env"]["1"]
    assert out["imported"] == []
    if "torch" in _registry.backends():
        assert first["MASTER_ADDR"] == "127.0.0.1" and first["MASTER_PORT"] == "29500"
        assert [env["RANK"] for env in (first, second)] == ["0", "1"] and second["WORLD_SIZE"] == "2"
    if "jax" in _registry.backends():
        assert first["XDEVICE_COORDINATOR"] == second["XDEVICE_COORDINATOR"]
        assert first["XDEVICE_COORDINATOR"].startswith("127.0.0.1:")
    if "tensorflow" in _registry.backends():
        clusters = [json.loads(env["TF_CONFIG"]) for env in (first, second)]
        assert [c["task"] for c in clusters] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1}]
        assert clusters[0]["cluster"] == clusters[1]["cluster"] and len(set(clusters[0]["cluster"]["worker"])) == 2


def test_without_a_backend_that_provides_a_process_launcher_the_launch_says_which_one_does(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(_registry, "providers", lambda part, all=False: ["torch"] if all else [])
    with pytest.raises(
        ConfigurationError, match="process launcher, which comes with PyTorch.*Fix: pip install 'xdevice"
    ):
        arguments(str(script), [], 2)


@pytest.mark.parametrize(
    "framework, processes",
    [
        ("torch", 2),
        pytest.param("torch", 3, marks=pytest.mark.realworld),
        ("jax", 2),
        # TensorFlow's workers start gRPC servers (38 s here): make test-models, with the TFJob launch
        pytest.param("tensorflow", 2, marks=pytest.mark.realworld),
    ],
)
def test_launched_processes_train_exactly_as_one(tmp_path, framework, processes):
    """torch: DistributedDataParallel over gloo (2-4 processes; 3: uneven slices of 16 rows);
    JAX: jax.distributed with a Mesh over every process's CPU; TensorFlow:
    MultiWorkerMirroredStrategy from TF_CONFIG (ring all-reduce over gRPC)."""
    pytest.importorskip(framework)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    launched = launch("--nproc-per-node", str(processes), str(script), str(tmp_path), framework)
    assert launched.returncode == 0, launched.stderr[-2000:]
    alone = subprocess.run(
        [sys.executable, str(script), str(tmp_path), framework], capture_output=True, text=True, env=env, timeout=300
    )
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
    script.write_text(
        "import os, sys, time\n"
        "print('starting', flush=True)\n"
        "if os.environ['RANK'] == '1':\n    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    launched = launch("--nproc-per-node", "2", str(script), timeout=120)
    assert launched.returncode == 3
    assert "rank 1 failed with exit code 3 (0 restart(s) allowed)" in launched.stderr
    assert {line for line in launched.stdout.splitlines()} == {"[rank0]: starting", "[rank1]: starting"}


RESTARTED = (
    textwrap.dedent("""
    import os, sys
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
        sys.exit("rank 1 crashes on its first attempt")
""")
    + SCRIPT
)


def test_a_worker_that_crashes_once_is_restarted_and_the_run_completes(tmp_path):
    """torchrun's agent restarts the group (--max-restarts 1): two gloo workers on loopback
    then train as one process does; each rank's output is in its own log files."""
    script = tmp_path / "train.py"
    script.write_text(RESTARTED)
    launched = launch(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        str(script),
        str(tmp_path),
        "torch",
    )
    assert launched.returncode == 0, launched.stderr[-2000:]
    assert "[rank1]: rank 1 crashes on its first attempt" in launched.stderr
    first, second = (json.loads((tmp_path / f"rank{rank}of2.json").read_text()) for rank in (0, 1))
    assert len(first["steps"]) == 12 and first["steps"] == second["steps"]
    attempts = sorted(p.parent.parent.name for p in (tmp_path / "logs").rglob("stderr.log"))
    assert attempts == ["attempt_0", "attempt_0", "attempt_1", "attempt_1"]  # per rank, per attempt


@pytest.mark.realworld  # 20 s; one node's TensorFlow launch runs in make test (test_launched_processes...)
def test_tensorflow_workers_on_two_nodes_learn_each_others_addresses(tmp_path):
    """Two agents on loopback, one node each, meeting at a c10d rendezvous: every worker's
    TF_CONFIG lists both workers (each published its own through the rendezvous store)."""
    pytest.importorskip("tensorflow")
    script = tmp_path / "train.py"
    script.write_text(SCRIPT + "import os\nprint('workers', os.environ['TF_CONFIG'])\n")
    flags = (
        "--nnodes",
        "2",
        "--nproc-per-node",
        "1",
        "--master-port",
        str(free_port()),
        "--rdzv-id",
        "two-nodes",
        str(script),
        str(tmp_path),
        "tensorflow",
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    other = subprocess.Popen(
        [sys.executable, "-m", "xdevice", "launch", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    mine = launch(*flags)
    theirs = other.communicate(timeout=300)
    assert mine.returncode == 0 and other.returncode == 0, mine.stderr[-1500:] + theirs[1][-1500:]
    configs = [
        json.loads(line.split("workers ", 1)[1])
        for line in (mine.stdout + theirs[0]).splitlines()
        if "workers " in line
    ]
    assert sorted(c["task"]["index"] for c in configs) == [0, 1]
    assert all(len(set(c["cluster"]["worker"])) == 2 for c in configs)
    first, second = (json.loads((tmp_path / f"rank{rank}of2.json").read_text()) for rank in (0, 1))
    assert first["steps"] == second["steps"] and len(first["steps"]) == 12


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


@pytest.mark.parametrize("framework", ["torch", pytest.param("tensorflow", marks=pytest.mark.realworld)])
def test_processes_start_from_rank_zeros_weights_when_the_model_is_not_seeded(tmp_path, framework):
    """Each process draws its own initial weights; training starts them all from rank 0's (as DDP does)."""
    pytest.importorskip(framework)
    script = tmp_path / "unseeded.py"
    script.write_text(UNSEEDED)
    launched = launch("--nproc-per-node", "2", str(script), str(tmp_path), framework)
    assert launched.returncode == 0, launched.stderr[-2000:]
    first, second = (json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1))
    assert len(first["steps"]) == 4 and first["steps"] == second["steps"]
    assert first["weights"] == second["weights"]
