"""ONNX's node conformance suite on every backend: a curated list in CI, all of it on demand.

`conformance_ci.txt` lists node tests (with the ONNX module that builds them) of the ops real
models are made of that pass on every backend; each backend runs them in its own
`xdevice conformance` process (JAX needs 64-bit types process-wide) and every one must pass.
`xdevice conformance` runs all 1,884.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

LINES = [
    line.split()
    for line in Path(__file__).with_name("conformance_ci.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
MODULES = sorted({module for module, _ in LINES})
CURATED = [test.removeprefix("test_") for _, test in LINES]


@pytest.mark.slow
def test_the_curated_onnx_node_tests_all_pass(backend):
    if backend.name == "jax":
        pytest.skip("JAX compiles each of the 429 graphs (a minute): make test-models runs it (below)")
    _curated_suite_passes(backend.name)


@pytest.mark.realworld
def test_the_curated_onnx_node_tests_all_pass_on_jax():
    pytest.importorskip("jax")
    _curated_suite_passes("jax")


def _curated_suite_passes(name: str) -> None:
    pattern = "^test_(" + "|".join(CURATED) + ")_cpu$"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "xdevice",
            "conformance",
            "--backend",
            name,
            "--modules",
            *MODULES,
            "--pattern",
            pattern,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(outcome["status"]) == sorted(f"test_{t}" for t in CURATED), "it ran other tests than the list"
    failed = {
        test: f"{state}: {outcome['reason'].get(test, '')}"
        for test, state in outcome["status"].items()
        if state != "pass"
    }
    assert not failed, f"{len(failed)} of {len(CURATED)} failed on {name}: {failed}"


def test_the_conformance_command_prints_its_summary_and_no_warnings_from_onnx():
    """Building ONNX's cases runs its reference code, which overflows on purpose: those
    RuntimeWarnings (11 of them) are not the user's business."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "xdevice", "conformance", "--backend", "numpy", "--pattern", "test_abs_cpu"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "numpy: 1 passed, 0 failed" in done.stdout and "RuntimeWarning" not in done.stderr, done.stderr
