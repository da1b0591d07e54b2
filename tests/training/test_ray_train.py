"""Ray Train's ``TorchTrainer`` running xdevice's training function (deploy/training/ray_train.py):
Ray's two workers join its torch group and end with the losses and weights of one process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FOLDER = Path(__file__).resolve().parents[2] / "deploy" / "training"


@pytest.mark.realworld  # Ray starts a local cluster: over a minute here (make test-models installs Ray)
def test_ray_train_workers_train_the_zoo_mlp_as_one_process(tmp_path):
    pytest.importorskip("ray.train", reason="Ray Train is not installed (pip install 'xdevice[ray]')")
    pytest.importorskip("torch")
    ray = subprocess.run(
        [sys.executable, str(FOLDER / "ray_train.py"), "--workers", "2", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ray.returncode == 0, ray.stderr[-3000:]
    assert "Ray Train finished: 2 workers, error: None" in ray.stdout
    alone = subprocess.run(
        [sys.executable, str(FOLDER / "train_zoo.py"), "--backend", "torch", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert alone.returncode == 0, alone.stderr[-2000:]
    one = json.loads((tmp_path / "rank0of1.json").read_text())
    for rank in (0, 1):
        worker = json.loads((tmp_path / f"rank{rank}of2.json").read_text())
        assert (worker["rank"], worker["size"]) == (rank, 2)
        np.testing.assert_allclose(worker["steps"], one["steps"], rtol=1e-5, atol=1e-6)
        for key, value in one["params"].items():
            np.testing.assert_allclose(worker["params"][key], value, rtol=1e-5, atol=1e-6, err_msg=key)
