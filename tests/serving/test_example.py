"""The whole story as a user runs it: train, parity, export, `xdevice serve`, query."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).parents[2] / "examples" / "serve_end_to_end.py"


@pytest.mark.slow
def test_train_export_serve_and_query_with_the_standard_client():
    pytest.importorskip("torch")
    pytest.importorskip("tritonclient.http")
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "max abs error against the trained torch model" in done.stdout
    assert "MISMATCH" not in done.stdout and "tensorflow max abs error" in done.stdout.replace("  ", " ")
    loss = next(line for line in done.stdout.splitlines() if line.strip().startswith("loss"))
    first, last = (float(v) for v in loss.split()[1:4:2])
    assert last < first  # it trained
