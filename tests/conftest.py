"""Shared test helpers. Fixtures `backend` and `device` come from xdevice's pytest plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def run_python():
    """Run code in a fresh interpreter (a runtime not yet started); returns the result."""

    def run(code: str, env: dict[str, str] | None = None, timeout: int = 300):
        merged = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
        return subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=merged, timeout=timeout
        )

    return run
