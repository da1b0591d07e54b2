"""Train the zoo's mlp on a synthetic task, on the framework one argument names: the script the
manifests in this folder run under ``xdevice launch``, on every node of the job.

Run alone it trains in one process; under ``xdevice launch`` each process takes its slice of
every global batch and all end with the weights one process reaches (tests/training/test_cluster_launch.py).
``ray_train.py`` runs the same :func:`train` inside Ray Train's workers.

    python deploy/training/train_zoo.py --backend torch
    xdevice launch deploy/training/train_zoo.py --backend jax --out /tmp/run   # inside a cluster job
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

import xdevice
from xdevice import fit, models
from xdevice.training.launch import world


def train(backend: str, epochs: int = 2, out: str | None = None) -> dict:
    """Train the mlp in this process (one rank of a group, or alone); return and optionally
    write (``out/rank{R}of{N}.json``) this rank's losses, step by step, and final weights."""
    xdevice.join_processes(backend)  # before the model is built: JAX and TF join before computing
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64")
    model = models.build("mlp", backend=backend, hidden=[16], inputs=6, classes=2, seed=0)
    history = fit(model, (x, y), optimizer="adam", lr=0.01, epochs=epochs, batch_size=16, verbose=0)
    rank, size = world()
    print(f"rank {rank} of {size}: final loss {history.steps[-1]:.6f}", flush=True)
    result = {
        "rank": rank,
        "size": size,
        "steps": history.steps,
        "params": {k: v.ravel().tolist() for k, v in model.numpy_params().items()},
    }
    if out:
        (Path(out) / f"rank{rank}of{size}.json").write_text(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax", "tensorflow"])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=None, help="write each rank's losses and final weights here (JSON)")
    args = parser.parse_args()
    train(args.backend, args.epochs, args.out)


if __name__ == "__main__":
    main()
