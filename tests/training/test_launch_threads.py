"""xdevice launch shares the CPUs among its workers itself, so torchrun has no banner to print."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from xdevice.backends.torch import agent


def test_workers_get_the_cpus_shared_out_unless_the_user_set_a_thread_count(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    agent._share_threads("2")
    assert os.environ["OMP_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    agent._share_threads("2")
    assert os.environ["OMP_NUM_THREADS"] == "7"
    monkeypatch.delenv("OMP_NUM_THREADS")
    agent._share_threads("1")  # one worker: left to the framework, as torchrun leaves it
    assert "OMP_NUM_THREADS" not in os.environ


def test_a_launch_prints_the_workers_output_and_no_torchrun_banner(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os\nprint('threads', os.environ['OMP_NUM_THREADS'])\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    launched = subprocess.run(
        [sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", "2", str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert launched.returncode == 0, launched.stderr[-2000:]
    shared = str(max(1, len(os.sched_getaffinity(0)) // 2))
    assert sorted(launched.stdout.splitlines()) == [f"[rank0]: threads {shared}", f"[rank1]: threads {shared}"]
    assert "OMP_NUM_THREADS" not in launched.stderr and "*****" not in launched.stderr
