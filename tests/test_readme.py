"""The README runs as written, as every page of docs/ does (tests/test_docs.py, same rules).

A page is read in order, as a reader following it would, in one folder of its own:

- every ``python`` block runs in a fresh interpreter (a block may use a file an earlier one
  wrote); a block whose first line is ``# file: NAME`` is saved as ``NAME`` and run as a
  script, so that a later command can run it again (``xdevice launch ... train.py``, ``pytest``);
- every ``$`` line of a plain or ``console`` block is a command, run in its turn:
  ``xdevice ...``, ``python ...`` and ``pytest ...`` in this interpreter's environment;
  ``xdevice serve`` runs until it answers ready, then is stopped; a ``$`` line with
  ``[optional flags]`` is a usage synopsis, not a command to run;
- a block whose first line is ``# needs: N gpus`` is skipped, for that reason only, on a
  machine with fewer GPUs; ``# needs: <something else>`` (a cluster, the network) always
  skips, saying what it needs.

A step selected alone (``-k``) first runs the steps above it on its page.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONWARNINGS": "ignore"}
PROGRAMS = {
    "xdevice": [sys.executable, "-m", "xdevice"],
    "python": [sys.executable],
    "pytest": [sys.executable, "-m", "pytest"],
}


@dataclass(frozen=True)
class Step:
    """One Python block or one ``$`` command of a page, at its line."""

    page: Path
    line: int
    kind: str  # "python" or "command"
    code: str
    needs: str | None = None
    file: str | None = None

    @property
    def id(self) -> str:
        return f"{self.page.stem}-line{self.line}"

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)} line {self.line}"


def steps(page: Path) -> list[Step]:
    """The page's Python blocks and commands, in the order a reader meets them."""
    text, found = page.read_text(), []
    for match in FENCE.finditer(text):
        line, kind, code = text[: match.start()].count("\n") + 1, match.group(1), match.group(2)
        needs = re.match(r"# needs: (.+)", code)
        file = re.match(r"# file: (\S+)", code)
        if kind == "python":
            found.append(Step(page, line, "python", code, needs and needs.group(1), file and file.group(1)))
        elif kind in ("", "console"):
            found += [
                Step(page, line + 1 + i, "command", row.split("#")[0].strip()[2:], needs and needs.group(1))
                for i, row in enumerate(code.splitlines())
                if row.startswith("$ ") and "[" not in row
            ]
    return found


@functools.cache
def _gpus() -> int:
    from xdevice._discovery import machine_devices

    return sum(d.kind == "gpu" for d in machine_devices())


def _skip_reason(step: Step) -> str | None:
    if step.needs is None:
        return None
    count = re.fullmatch(r"(\d+) gpus?", step.needs)
    if count and _gpus() >= int(count.group(1)):
        return None
    return f"{step.where} needs {step.needs}"


class Reader:
    """Runs one page's steps in order, in one folder; each step once."""

    def __init__(self, page: Path, folder: Path):
        self.steps, self.folder, self.ran = steps(page), folder, set()

    def run(self, step: Step) -> None:
        for earlier in self.steps[: self.steps.index(step)]:
            if earlier not in self.ran and not _skip_reason(earlier):
                failure = self._run(earlier)
                if failure:
                    pytest.fail(f"{earlier.where}, run first as a reader would, failed:\n{failure}")
        reason = _skip_reason(step)
        if reason:
            pytest.skip(reason)
        failure = self._run(step)
        if failure:
            pytest.fail(f"{step.where} failed:\n{failure}")

    def _run(self, step: Step) -> str | None:
        self.ran.add(step)
        if step.kind == "python":
            if step.file:
                (self.folder / step.file).write_text(step.code)
            args = [sys.executable, step.file] if step.file else [sys.executable, "-c", step.code]
        else:
            words = shlex.split(step.code)
            if words[0] not in PROGRAMS:
                return f"`{step.code}`: only {', '.join(PROGRAMS)} commands run here; mark the block `# needs: ...`"
            if words[:2] == ["xdevice", "serve"]:
                return _serves([*PROGRAMS["xdevice"], *words[1:]], self.folder)
            args = [*PROGRAMS[words[0]], *words[1:]]
        done = subprocess.run(args, cwd=self.folder, capture_output=True, text=True, timeout=600, env=ENV)
        if done.returncode != 0:
            return (
                f"`{step.code.strip()[:200]}` exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            )
        return None


def _serves(args: list[str], folder: Path) -> str | None:
    """Start the server on free ports, wait until it answers ready, stop it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [*args, "--port", str(port), "--grpc-port", "0"],
        cwd=folder,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ready = False
    try:
        deadline = time.monotonic() + 120
        while not ready and time.monotonic() < deadline and server.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
                    ready = answer.status == 200
            except OSError:
                time.sleep(0.5)  # not listening yet: the only signal a separate process gives is the port
    finally:
        server.terminate()
        out = server.communicate(timeout=60)[0]
    if not ready:
        return f"xdevice serve never became ready:\n{out[-3000:]}"
    if "Traceback" in out:
        return out[-3000:]
    return None


STEPS = steps(README)


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
    return Reader(README, tmp_path_factory.mktemp("readme"))


def test_the_readme_has_a_tour_to_run():
    assert [step.kind for step in STEPS].count("python") >= 1


@pytest.mark.parametrize("step", STEPS, ids=[step.id for step in STEPS])
def test_every_block_and_command_of_the_readme_runs_as_written(step, reader):
    reader.run(step)
