"""Scaling across processes: step time and samples/s of ``fit`` over 1, 2 and 4 processes.

For each process count N and strategy (``replicate``: data parallel, every process holds the
whole model; ``fsdp``: parameters, gradients and optimizer state sharded across the processes),
``xdevice launch --nproc-per-node N`` starts N processes of this script (gloo on the CPU, NCCL
on GPUs) and each trains the zoo mlp with ``fit`` for ``--epochs`` timed epochs after one
warm-up epoch. Weak scaling, as GPU scaling tables are quoted: every process steps
``--batch`` rows, so the global batch is ``N * batch`` and N processes see N times the rows per
step. Rank 0 writes its epoch times; printed: median step ms (min-max over epochs), samples/s,
the speed-up over one process, and the reference scaling the seed quotes for data parallel on
GPUs (1.7x on 2, 3.5x on 4, 6.2x on 8).

On this machine the processes share 2 CPU cores, so N = 4 cannot go faster than N = 2: the
table says what the machine does, not what a GPU node would. A strategy the backend refuses is
printed with the refusal.

    .venv/bin/python benchmarks/scaling.py [--processes 1 2 4] [--strategies replicate fsdp]
        [--backend torch] [--hidden 1024] [--batch 64] [--steps 16] [--epochs 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from _timing import THREADS_HELP, pin_threads

#: the seed's data-parallel speed-up on 2, 4, 8 GPUs
REFERENCE = {1: 1.0, 2: 1.7, 4: 3.5, 8: 6.2}
#: the settings every launched process gets from the command line
SHARED = ("backend", "hidden", "inputs", "batch", "steps", "epochs", "threads")


def worker(args: argparse.Namespace) -> None:
    """One launched process: train, time each epoch, rank 0 writes the times."""
    import time

    print(pin_threads(args.threads, frameworks=(args.backend,)), flush=True)
    import xdevice
    from xdevice import Trainer, models
    from xdevice.training.launch import world

    xdevice.join_processes(args.backend)
    rank, size = world()
    rows = args.steps * args.batch * size  # the global batch is size * batch rows
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, args.inputs)).astype("float32")
    y = rng.integers(0, 10, size=rows)
    model = models.build(
        "mlp", backend=args.backend, inputs=args.inputs, hidden=[args.hidden, args.hidden], classes=10, seed=0
    )
    trainer = Trainer(model, "cross_entropy", "adam", lr=1e-3, strategy=args.strategy)
    trainer.fit((x, y), epochs=1, batch_size=args.batch * size, verbose=0)  # warm-up (compiles, joins)
    times = []
    for epoch in range(2, args.epochs + 2):
        start = time.perf_counter()
        trainer.fit((x, y), epochs=epoch, batch_size=args.batch * size, verbose=0)
        times.append((time.perf_counter() - start) / args.steps)
    if rank == 0:
        Path(args.out).write_text(json.dumps({"size": size, "step_seconds": times}))


def run(args: argparse.Namespace, processes: int, strategy: str) -> dict | str:
    """Launch ``processes`` workers; their rank 0's times, or the last error line."""
    with tempfile.TemporaryDirectory(prefix="xdevice-scaling-") as folder:
        out = Path(folder) / "times.json"
        command = [
            sys.executable,
            "-m",
            "xdevice",
            "launch",
            "--nproc-per-node",
            str(processes),
            __file__,
            "--worker",
            "--out",
            str(out),
            "--strategy",
            strategy,
            *(f"--{k}={getattr(args, k)}" for k in SHARED),
        ]
        done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        if done.returncode != 0 or not out.exists():
            lines = [line for line in (done.stderr + done.stdout).splitlines() if "Error" in line or "error" in line]
            return (lines or (done.stderr or done.stdout).splitlines() or ["no output"])[-1].strip()[:160]
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--strategies", nargs="+", default=["replicate", "fsdp"], choices=["replicate", "fsdp"])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax", "tensorflow"])
    parser.add_argument("--hidden", type=int, default=1024, help="width of the mlp's two hidden layers")
    parser.add_argument("--inputs", type=int, default=256)
    parser.add_argument("--batch", type=int, default=64, help="rows per process per step")
    parser.add_argument("--steps", type=int, default=16, help="steps per epoch")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs (after one warm-up epoch)")
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--strategy", default="replicate", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(
        f"zoo mlp {args.inputs}-{args.hidden}-{args.hidden}-10 on {args.backend}, Adam; {args.batch} rows per process "
        f"per step (global batch N x {args.batch}); {args.threads} thread(s) per process; {os.cpu_count()} CPU cores"
    )
    print(f"{'N':>2} {'strategy':<10} {'step ms':>24} {'samples/s':>10} {'speed-up':>9} {'reference (GPUs)':>17}")
    for strategy in args.strategies:
        single = None
        for processes in args.processes:
            result = run(args, processes, strategy)
            if isinstance(result, str):
                print(f"{processes:>2} {strategy:<10} refused or failed: {result}", flush=True)
                continue
            steps = result["step_seconds"]
            median = statistics.median(steps)
            samples = processes * args.batch / median
            single = samples if processes == 1 else single
            speedup = f"{samples / single:.2f}x" if single else "-"
            reference = f"{REFERENCE[processes]:.1f}x" if processes in REFERENCE else "-"
            cell = f"{median * 1e3:.1f} ({min(steps) * 1e3:.1f}-{max(steps) * 1e3:.1f})"
            print(f"{processes:>2} {strategy:<10} {cell:>24} {samples:>10.0f} {speedup:>9} {reference:>17}", flush=True)


if __name__ == "__main__":
    main()
