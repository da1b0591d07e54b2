"""The CPU accounting of the serving benchmarks (``benchmarks/serve.py``, used by
``benchmarks/peers.py``): a server's CPU time counts every process below it and every thread."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVE = Path(__file__).resolve().parents[2] / "benchmarks" / "serve.py"


@pytest.fixture(scope="module")
def serve():
    spec = importlib.util.spec_from_file_location("bench_serve", SERVE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_server_cpu_counts_the_processes_below_it_and_their_threads(serve, tmp_path):
    script = tmp_path / "burner.py"
    script.write_text(
        "import subprocess, sys, threading, time\n"
        "if sys.argv[1:] == ['child']:\n"
        "    time.sleep(0.5)\n"  # time for the test to find this process
        "    def burn():\n"
        "        end = time.thread_time() + 0.3\n"
        "        while time.thread_time() < end:\n"
        "            pass\n"
        "    threads = [threading.Thread(target=burn) for _ in range(2)]\n"
        "    [t.start() for t in threads]\n"
        "    [t.join() for t in threads]\n"
        "    time.sleep(60)\n"
        "else:\n"
        "    subprocess.Popen([sys.executable, __file__, 'child']).wait()\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 10
        while len(tree := serve.process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(tree) == 2 and tree[0] == parent.pid
        before = serve.cpu_seconds(tree)
        deadline = time.monotonic() + 30  # a busy machine may take that long to give it 0.6 s of CPU
        while (used := serve.cpu_seconds(tree) - before) < 0.55 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert used >= 0.55  # both threads of the child: the parent only waits
    finally:
        for pid in reversed(serve.process_tree(parent.pid)):
            os.kill(pid, signal.SIGTERM)
        parent.wait(10)
