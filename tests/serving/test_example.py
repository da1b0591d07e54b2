"""The whole story as a user runs it: train, parity, export, `xdevice serve`, query."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "serve_end_to_end.py"


@pytest.mark.slow
@pytest.mark.realworld  # make test-models (21 s here); `make demo` runs the same example
def test_train_export_serve_and_query_with_the_standard_client(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("tritonclient.http")
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not list(tmp_path.glob("xdevice-*")), "the example left its model repository behind"
    assert "max abs error against the trained torch model" in done.stdout
    assert "MISMATCH" not in done.stdout and "tensorflow max abs error" in done.stdout.replace("  ", " ")
    loss = next(line for line in done.stdout.splitlines() if line.strip().startswith("loss"))
    first, last = (float(v) for v in loss.split()[1:4:2])
    assert last < first  # it trained


ROUND_TRIP = Path(__file__).parents[2] / "examples" / "finetune_imported.py"


@pytest.mark.slow
def test_a_torch_model_fine_tuned_in_jax_is_served_with_its_fine_tuned_answers(tmp_path):
    """torch -> ONNX -> from_onnx on JAX -> fit -> export from JAX -> xdevice serve -> tritonclient."""
    for needed in ("torch", "jax", "jax2onnx", "tritonclient.http"):
        pytest.importorskip(needed)
    done = subprocess.run(
        [sys.executable, str(ROUND_TRIP)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TMPDIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not list(tmp_path.glob("xdevice-*")), "the example left its files behind"
    served = next(line for line in done.stdout.splitlines() if "served vs fine-tuned" in line)
    error, moved = float(served.split("max abs error ")[1].split(";")[0]), float(served.rsplit(" ", 1)[1])
    assert error < 1e-4 and moved > 1e-2  # the fine-tuned answers, not the original's
