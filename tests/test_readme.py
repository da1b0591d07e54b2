"""The README runs as written: every Python block, in order, each in a fresh interpreter in
one folder (a block may use a file an earlier one wrote, as a reader following the tour
would), and every concrete ``$ xdevice ...`` command after them. A block whose first line is
``# needs: N gpus`` is skipped, for that reason only, on a machine with fewer GPUs; a ``$``
line with ``[optional flags]`` is a usage synopsis, not a command to run."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def _blocks() -> list[tuple[int, str, str]]:
    text = README.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)]


PYTHON = [(line, code) for line, kind, code in _blocks() if kind == "python"]
COMMANDS = [
    (line + 1 + i, cmd.split("#")[0].strip()[2:])
    for line, kind, code in _blocks()
    if kind == ""
    for i, cmd in enumerate(code.splitlines())
    if cmd.startswith("$ xdevice") and "[" not in cmd
]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


def _gpus() -> int:
    from xdevice._discovery import machine_devices

    return sum(d.kind == "gpu" for d in machine_devices())


def test_the_readme_has_python_blocks_and_commands_to_run():
    assert len(PYTHON) >= 7 and len(COMMANDS) >= 6


@pytest.mark.parametrize("line, code", PYTHON, ids=[f"line{line}" for line, _ in PYTHON])
def test_every_python_block_of_the_readme_runs_as_written(line, code, folder):
    needs = re.match(r"# needs: (\d+) gpus?", code)
    if needs and _gpus() < int(needs.group(1)):
        pytest.skip(f"README line {line} needs {needs.group(1)} GPU(s)")
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=600, env=ENV
    )
    assert done.returncode == 0, f"README block at line {line} failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("line, command", COMMANDS, ids=[f"line{line}" for line, _ in COMMANDS])
def test_every_command_of_the_readme_runs_as_written(line, command, folder):
    if not (folder / "net.onnx").exists():
        pytest.skip("runs after the Python blocks, which write net.onnx")
    args = shlex.split(command)[1:]
    if args[0] == "serve":  # runs until stopped: it must become ready, then it is stopped (on a free port)
        _serves(line, args, folder)
        return
    done = subprocess.run(
        [sys.executable, "-m", "xdevice", *args], cwd=folder, capture_output=True, text=True, timeout=600, env=ENV
    )
    assert done.returncode == 0, f"README line {line} ({command}) failed:\n{done.stderr[-3000:]}"


def _serves(line: int, args: list[str], folder: Path) -> None:
    import socket
    import time
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "xdevice", *args, "--port", str(port), "--grpc-port", "0"],
        cwd=folder,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        pytest.fail(f"README line {line}: xdevice serve never became ready")
    finally:
        server.terminate()
        out = server.communicate(timeout=60)[0]
        assert "Traceback" not in out, out[-3000:]
