"""The training story as a user runs it: the same script on each backend trains, exports and verifies."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "train_anywhere.py"


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "jax", "tensorflow"])
# make test-models: 10-30 s each; `make demo` runs the script on torch, and its fit and export
# paths run in make test through test_fit and test_matrix
@pytest.mark.realworld
def test_train_anywhere_trains_exports_and_matches_onnx_runtime(framework):
    pytest.importorskip(framework)
    pytest.importorskip("onnxruntime")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--backend", framework],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    error = re.search(r"ONNX max abs error (\S+);", done.stdout)
    assert error is not None, done.stdout[-2000:]
    assert float(error.group(1)) < 1e-4
    first, last = map(float, re.search(r"loss (\S+) -> (\S+) ", done.stdout).groups())
    assert last < first  # it trained


@pytest.mark.slow
@pytest.mark.parametrize(
    "framework, precision",
    [
        ("torch", "float16"),
        # make test-models: `make demo` runs the recipe on JAX in bfloat16
        pytest.param("jax", "bfloat16", marks=pytest.mark.realworld),
    ],
)
def test_the_training_recipe_stops_early_and_its_best_checkpoint_scores_as_recorded(framework, precision):
    pytest.importorskip(framework)
    pytest.importorskip("tensorboardX")
    recipe = Path(__file__).parents[2] / "examples" / "train_recipe.py"
    done = subprocess.run(
        [sys.executable, str(recipe), "--backend", framework, "--precision", precision],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"early stopping ended it after epoch \d+", done.stdout), done.stdout[-2000:]
    scored, recorded = map(
        float, re.search(r"held-out accuracy (\S+)% \(the run recorded (\S+)%", done.stdout).groups()
    )
    assert scored == recorded and scored > 80
    assert "TensorBoard event files: 1" in done.stdout and re.search(r"arithmetic [\d.]+ MiB", done.stdout)


@pytest.mark.slow
def test_the_scaling_benchmark_runs_its_one_vs_n_path_on_virtual_cpus():
    """The path a multi-GPU machine takes, on 2 virtual CPUs: a row for 1 and for 2 devices."""
    pytest.importorskip("jax")
    script = Path(__file__).parents[2] / "benchmarks" / "train.py"
    done = subprocess.run(
        [
            sys.executable,
            str(script),
            "--parts",
            "scaling",
            "--scaling-on",
            "cpu",
            "--models",
            "mlp",
            "--backends",
            "jax",
            "--steps",
            "3",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = re.findall(r"^mlp\s+jax\s+(\d)\s+[\d.]+\s+\d+\s+([\d.]+)x$", done.stdout, re.M)
    assert [count for count, _ in rows] == ["1", "2"], done.stdout
    assert rows[0][1] == "1.00"


@pytest.mark.slow
@pytest.mark.realworld  # make test-models (23 s here); `make demo` runs the same walk-through
def test_the_first_contact_walk_through_agrees_on_every_backend_and_prints_no_framework_chatter():
    """scikit-learn's digits: the zoo mlp trained on each installed backend to one accuracy, the
    test split converted into each framework, ONNX Runtime agreeing; stderr stays empty (no
    TensorFlow, torch or ONNX Runtime banner from Python training, unasked)."""
    import xdevice

    pytest.importorskip("sklearn")
    pytest.importorskip("onnxruntime")
    walk_through = Path(__file__).parents[2] / "examples" / "first_contact.py"
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "XDEVICE_VERBOSE")}
    done = subprocess.run([sys.executable, str(walk_through)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("\nOK")
    trained = dict(re.findall(r"^  (\w+)\s+loss .* test accuracy ([\d.]+)%$", done.stdout, re.M))
    assert set(trained) == set(xdevice.backends()) and float(min(trained.values())) >= 90
    assert re.search(r"max abs error \S+, test accuracy ([\d.]+)%", done.stdout).group(1) in trained.values()
    assert done.stderr == ""
