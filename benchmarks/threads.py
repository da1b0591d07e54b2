"""Does the thread count change a seeded fit? The table of docs/training.md ("Reproducible runs").

Each backend trains each zoo model twice with the same seed, data and options, once pinned to
1 thread and once to 2 (``_timing.pin_threads``, in a fresh process each, since a framework
reads its thread settings when it starts), and the final weights are compared: ``bitwise
equal``, or the largest difference relative to the weight's own largest value. Run:

    .venv/bin/python benchmarks/threads.py [--backends torch jax tensorflow] [--models cnn lstm transformer]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

#: the LSTM of tests/training/test_reproducible.py: wide embeddings, short hidden state, few tokens
SPECS = {
    "cnn": {},
    "lstm": {"vocab": 8, "embedding": 64, "hidden": 8, "length": 16, "classes": 3},
    "transformer": {"length": 16},
}


def child(backend: str, name: str, threads: int, out: str) -> None:
    """Train ``name`` on ``backend`` at ``threads`` threads and save its weights to ``out``."""
    from _timing import pin_threads

    pin_threads(threads, frameworks=(backend,) if backend in ("torch", "tensorflow") else ())
    import xdevice
    from xdevice import models

    model = models.build(name, backend=backend, seed=0, **SPECS[name])
    x = model.example_input(256, seed=1)
    y = np.random.default_rng(0).integers(0, model.spec["classes"], size=256)
    history = xdevice.fit(model, (x, y), epochs=2, batch_size=32, seed=0, verbose=0)
    np.savez(out, **history.model.numpy_params())


def compare(one: Path, two: Path) -> str:
    first, second = np.load(one), np.load(two)
    worst = max(float(np.abs(first[k] - second[k]).max() / max(np.abs(first[k]).max(), 1e-30)) for k in first)
    return "bitwise equal" if worst == 0 else f"differ: largest difference {worst:.1e} of the weight's largest value"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "jax", "tensorflow"])
    parser.add_argument("--models", nargs="+", default=list(SPECS), choices=list(SPECS))
    parser.add_argument("--child", nargs=4, metavar=("BACKEND", "MODEL", "THREADS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        backend, name, threads, out = args.child
        child(backend, name, int(threads), out)
        return
    print("seeded fit (2 epochs, 256 rows, batch 32), 1 thread against 2 threads")
    with tempfile.TemporaryDirectory() as folder:
        for backend in args.backends:
            for name in args.models:
                files = [Path(folder) / f"{backend}-{name}-{threads}.npz" for threads in (1, 2)]
                for threads, out in zip((1, 2), files):
                    command = [sys.executable, __file__, "--child", backend, name, str(threads), str(out)]
                    subprocess.run(command, check=True, cwd=Path(__file__).parent)
                print(f"{backend:<11} {name:<12} {compare(*files)}", flush=True)


if __name__ == "__main__":
    main()
