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

``--memory`` prints, instead of times, what one device holds against what
``xdevice.estimate_memory(..., backend=..., measure=False)`` says it holds: the parameter bytes
and the optimizer-state bytes (Adam's two slots) of device 0 (rank 0's shards, the largest),
for N = 1, 2, 4 and three layouts: ``replicate`` and ``fsdp`` of the zoo mlp (``--inputs``,
``--hidden``), and tensor parallel (a mesh ``{"model": N}``) of the zoo gpt2 at its small
config. The shards are the ones a ``Trainer`` places for real (its parameters and optimizer
state, before the first step; ``--after-step`` measures after one training step, which costs
JAX a compile per layout, about two minutes more): on torch in ``N`` processes started by
``xdevice launch --nproc-per-node N`` (gloo; one launch per N builds the three layouts, tensor
parallel at N = 1 being one process without a mesh); on JAX in one process over N of its
virtual CPU devices (``xdevice.configure(cpu_devices=4)``, in a subprocess: it must come before
JAX starts). ``measured / estimate`` reads 1.0000 where the estimate counts what the engine
holds. Parameters and slots fall to about 1/N under fsdp; under tensor parallel only the split
attention and MLP weights and the token embedding do (gpt2 small's 96-token vocabulary splits
over 2 and 4; its position embedding, norms and the closing layers' biases stay whole).
About a minute on 2 cores:

    .venv/bin/python benchmarks/scaling.py --memory [--processes 1 2 4] [--hidden 1024] [--after-step]
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


#: the layouts the memory table measures: (strategy shown, zoo model, Trainer's strategy, mesh or not)
LAYOUTS = (
    ("replicate", "mlp", "replicate", False),
    ("fsdp", "mlp", "fsdp", False),
    ("tensor parallel", "gpt2", "replicate", True),
)
#: the optimizer whose state the memory table counts (two slots per parameter)
OPTIMIZER = "adam"


def memory_spec(args: argparse.Namespace, model: str) -> dict:
    """The zoo model a memory row builds: the mlp at ``--inputs``/``--hidden``, gpt2 small."""
    if model == "mlp":
        return {"inputs": args.inputs, "hidden": [args.hidden, args.hidden], "classes": 10, "seed": 0}
    from xdevice import models

    return {**models.definition(model).SMALL, "seed": 0}


def held_bytes(arrays: dict) -> int:
    """The bytes device 0 holds of ``arrays``: a JAX array's shards on device 0, a torch
    DTensor's local shard (this rank's), or a whole array."""
    total = 0
    for value in arrays.values():
        if hasattr(value, "addressable_shards"):  # JAX: the pieces on device 0
            total += sum(shard.data.nbytes for shard in value.addressable_shards if shard.device.id == 0)
        else:  # torch: a DTensor's shard on this rank, or a plain tensor
            local = value.to_local() if hasattr(value, "to_local") else value
            total += local.numel() * local.element_size()
    return total


def memory_worker(args: argparse.Namespace) -> None:
    """Build each layout's trainer (and step it, ``--after-step``), write device 0's bytes: on
    torch, one of the launched processes (rank 0 writes); on JAX, one process over N of its
    virtual CPU devices for each N."""
    print(pin_threads(args.threads, frameworks=(args.backend,)), flush=True)
    import xdevice

    if args.backend == "jax":  # virtual CPU devices, before JAX starts
        xdevice.configure(cpu_devices=max(args.processes), backends=["jax"])
    from xdevice import Trainer, models
    from xdevice.training.launch import world

    if args.backend == "torch":
        xdevice.join_processes("torch")
        rank, size = world()
        counts = [size]
    else:
        rank, counts = 0, args.processes
    found = []
    for count in counts:
        devices = [f"cpu:{i}" for i in range(count)] if args.backend == "jax" else None
        for shown, name, strategy, split in LAYOUTS:
            mesh = {"model": count} if split and (args.backend == "jax" or count > 1) else None
            reference = models.build(name, backend="numpy", **memory_spec(args, name))
            model = reference.to(args.backend)
            trainer = Trainer(model, "cross_entropy", OPTIMIZER, devices=devices, strategy=strategy, mesh=mesh)
            if args.after_step:  # the layout a training step leaves (JAX compiles each layout's step)
                x = reference.example_input(2 * count)  # two rows per device; labels: class indices
                *inner, classes = reference(reference.example_input(1)).shape[1:]
                y = np.arange(x.shape[0] * int(np.prod(inner, dtype=int))) % classes
                trainer.step(x, y.reshape(x.shape[0], *inner).astype("int64"))
            slots = {k: v for k, v in trainer.state.items() if "/" in k}  # m/ and v/; not the step count
            found.append(
                {
                    "strategy": shown,
                    "model": name,
                    "N": count,
                    "parameters": held_bytes(trainer.program.params),
                    "optimizer state": held_bytes(slots),
                }
            )
    if rank == 0:
        Path(args.out).write_text(json.dumps(found))


def measure_memory(args: argparse.Namespace, backend: str) -> list[dict] | str:
    """Device 0's bytes per layout and N on ``backend``, or the last error line."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="xdevice-memory-") as folder:
        out = Path(folder) / "bytes.json"
        shared = [__file__, "--memory-worker", "--out", str(out), f"--backend={backend}", f"--threads={args.threads}"]
        shared += ["--after-step"] if args.after_step else []
        shared += [f"--inputs={args.inputs}", f"--hidden={args.hidden}", "--processes", *map(str, args.processes)]
        if backend == "jax":  # one process, N virtual devices
            launches = [[sys.executable, *shared]]
        else:  # N processes, one launch per N
            launches = [
                [sys.executable, "-m", "xdevice", "launch", "--nproc-per-node", str(n), *shared] for n in args.processes
            ]
        for command in launches:
            done = subprocess.run(
                command, capture_output=True, text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
            )
            if done.returncode != 0 or not out.exists():
                lines = [line for line in (done.stderr + done.stdout).splitlines() if "Error" in line]
                return (lines or (done.stderr or done.stdout).splitlines() or ["no output"])[-1].strip()[:160]
            rows += json.loads(out.read_text())
            out.unlink()
    return rows


def memory_table(args: argparse.Namespace) -> None:
    """Print measured against estimated bytes per device, for each backend, layout and N."""
    import importlib.util

    from xdevice import estimate_memory

    print(
        f"bytes on device 0 (rank 0) {'after one step' if args.after_step else 'as the Trainer placed them'}, "
        f"{OPTIMIZER}: zoo mlp {args.inputs}-{args.hidden}-{args.hidden}-10 (replicate, fsdp), zoo gpt2 small "
        f"config (tensor parallel, mesh {{'model': N}}); estimate: xdevice.estimate_memory(..., measure=False)"
    )
    head = f"{'backend':<7} {'strategy':<16} {'N':>2} {'params':>10} {'estimate':>10} {'ratio':>7}"
    print(f"{head} {'optimizer':>10} {'estimate':>10} {'ratio':>7}")
    for backend in ("torch", "jax"):
        if importlib.util.find_spec(backend) is None:
            print(f"{backend:<7} not installed")
            continue
        rows = measure_memory(args, backend)
        if isinstance(rows, str):
            print(f"{backend:<7} failed: {rows}", flush=True)
            continue
        for row in sorted(rows, key=lambda r: ([s for s, *_ in LAYOUTS].index(r["strategy"]), r["N"])):
            split = row["strategy"] == "tensor parallel"
            options = {"mesh": {"model": row["N"]}} if split else {"strategy": row["strategy"], "devices": row["N"]}
            spec = memory_spec(args, row["model"])
            # backend= matters: FSDP2 chunks the first axis, where JAX splits the largest divisible one
            parts = estimate_memory(
                row["model"], batch=2, optimizer=OPTIMIZER, backend=backend, measure=False, **options, **spec
            ).parts
            cells = []
            for part in ("parameters", "optimizer state"):
                measured, estimate = row[part], parts[part]
                cells.append(f"{measured:>10} {estimate:>10} {measured / estimate:>7.4f}")
            print(f"{backend:<7} {row['strategy']:<16} {row['N']:>2} {cells[0]} {cells[1]}", flush=True)


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
    parser.add_argument("--memory", action="store_true", help="print bytes per device, measured against the estimate")
    parser.add_argument("--after-step", action="store_true", help="--memory: measure after one training step")
    parser.add_argument("--memory-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.memory_worker:
        memory_worker(args)
        return
    if args.memory:
        memory_table(args)
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
