"""Peak memory of a zoo model trained under tensor parallel, phase by phase, per process.

``xdevice launch --nproc-per-node N`` starts N processes of this script (``N = 1``: one process,
no mesh); each builds ``--model`` at the zoo's default (real) size, makes a ``Trainer`` with
``mesh={"model": N}`` and SGD, and fits ``--steps`` steps on one batch of two rows of 16 tokens.
Printed per rank: the peak resident memory (``ru_maxrss``) at the end of each phase (the build,
the trainer's making, the fit), in GB, and the losses (the same for every N). The table in
docs/training.md comes from this script::

    .venv/bin/python benchmarks/tp_memory.py --backend torch --model llama [--processes 1 2] [--blocks 16]

At llama's 16 blocks one process peaks near 12 GB and each of two near 8 GB: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def peak() -> float:
    """This process's peak resident memory so far, GB (Linux counts ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def worker(args: argparse.Namespace) -> None:
    import xdevice
    from xdevice import Trainer, models
    from xdevice.training.launch import world

    if args.backend == "jax":
        xdevice.join_processes("jax")
    rank, size = world()
    phases = {}
    sizes = {"blocks": args.blocks} if args.blocks else {}
    model = models.build(args.model, backend=args.backend, **sizes, seed=0)
    phases["build"] = peak()
    x = np.random.default_rng(0).integers(0, model.spec["vocab"], size=(2, 16)).astype("int32")
    trainer = Trainer(model, "cross_entropy", "sgd", lr=1e-3, mesh={"model": size} if size > 1 else None)
    phases["trainer"] = peak()
    history = trainer.fit((x, np.roll(x, -1, axis=1)), epochs=args.steps, batch_size=2, verbose=0, seed=0)
    phases["fit"] = peak()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"phases": phases, "losses": history.steps}))


def run(args: argparse.Namespace, processes: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="xdevice-tp-memory-") as folder:
        command = [sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", str(processes), __file__]
        command += ["--worker", "--out", folder, "--backend", args.backend, "--model", args.model]
        command += ["--blocks", str(args.blocks), "--steps", str(args.steps)]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if done.returncode != 0:
            sys.exit(f"{processes} process(es) failed:\n{(done.stderr or done.stdout)[-2000:]}")
        return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("rank*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax"])
    parser.add_argument("--model", default="llama", choices=["bert", "gpt2", "llama"])
    parser.add_argument("--blocks", type=int, default=0, help="blocks of the model (0: its default)")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"{args.model} ({args.blocks or 'default'} blocks) on {args.backend}, SGD, 2 x 16 tokens, {args.steps} steps")
    print(f"{'processes':>9} {'rank':>4} {'build GB':>9} {'trainer GB':>10} {'fit GB':>7}  losses")
    for processes in args.processes:
        for rank, result in enumerate(run(args, processes)):
            p = result["phases"]
            losses = ", ".join(f"{v:.6f}" for v in result["losses"])
            print(f"{processes:>9} {rank:>4} {p['build']:>9.2f} {p['trainer']:>10.2f} {p['fit']:>7.2f}  {losses}")


if __name__ == "__main__":
    main()
