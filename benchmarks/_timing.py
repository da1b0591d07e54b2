"""What every benchmark here shares: the same threads for every framework, the compared sides
taking turns, and medians printed with their spread.

On a shared 2-core machine an unpinned framework swings from 1x to 29x between runs, so:

- :func:`pin_threads` gives torch, TensorFlow, JAX (XLA's CPU client), numpy's BLAS and ONNX
  Runtime (``ort_options``) the same number of threads (default 1), before they start;
- :func:`interleaved` times the sides A, B, A, B ... so load from elsewhere falls on all alike;
- :func:`cell` prints a median with its min-max; ratios are of medians from the same run.
"""

from __future__ import annotations

import importlib.util
import os
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["pin_threads", "ort_options", "interleaved", "cell", "ratio_cell", "THREADS_HELP"]

THREADS_HELP = "threads for every framework (torch, TF, JAX/XLA, BLAS, ONNX Runtime), default 1"
_threads = 1


def pin_threads(threads: int = 1, frameworks: tuple[str, ...] = ("torch", "tensorflow")) -> str:
    """Pin every framework to ``threads`` threads; call it before anything imports a framework.
    ``frameworks``: those of torch and tensorflow the benchmark uses (they are imported here to
    set their pools; JAX, BLAS and ONNX Runtime read the settings when they start). Returns a
    line saying what was set."""
    global _threads
    _threads = threads
    for name in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "TF_NUM_INTRAOP_THREADS",
        "TF_NUM_INTEROP_THREADS",
    ):
        os.environ[name] = str(threads)
    if threads == 1:  # XLA's CPU client runs Eigen on its own pool unless told not to
        os.environ["XLA_FLAGS"] = " ".join(
            filter(
                None,
                [
                    os.environ.get("XLA_FLAGS", ""),
                    "--xla_cpu_multi_thread_eigen=false",
                    "intra_op_parallelism_threads=1",
                ],
            )
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    set_in = []
    if "torch" in frameworks and importlib.util.find_spec("torch"):
        import torch

        torch.set_num_threads(threads)
        torch.set_num_interop_threads(threads)
        set_in.append("torch")
    if "tensorflow" in frameworks and importlib.util.find_spec("tensorflow"):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
        set_in.append("tensorflow")
    return f"threads: {threads} for {', '.join(set_in + ['jax (XLA_FLAGS)', 'BLAS', 'ONNX Runtime'])}"


def ort_options() -> Any:
    """ONNX Runtime session options with the pinned thread count."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = _threads
    options.inter_op_num_threads = 1
    return options


def interleaved(
    sides: dict[str, Callable[[], Any]],
    *,
    samples: int = 15,
    inner: int = 1,
    warmup: int = 3,
    budget: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each side: ``samples`` rounds in which every side runs ``inner``
    calls in turn (after ``warmup`` calls each); stops early, after at least 3 rounds, once
    ``budget`` seconds are spent. ``clock``: wall time by default; ``time.process_time`` counts
    this process's CPU seconds instead (every thread's), which other processes' load on a
    shared machine moves less. The order of the sides is shuffled each round (seeded): a
    call right after another framework's can pay for it (a JAX call right after ONNX
    Runtime's, at batch 1), and every side should follow every other equally
    often (a fixed or rotated order makes one side follow it more often)."""
    for fn in sides.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    order, shuffle = list(sides.items()), random.Random(0).shuffle
    start = time.perf_counter()
    for round_ in range(samples):
        shuffle(order)
        for name, fn in order:
            begin = clock()
            for _ in range(inner):
                fn()
            times[name].append((clock() - begin) / inner)
        if budget is not None and round_ >= 2 and time.perf_counter() - start > budget:
            break
    return times


def cell(seconds: list[float], unit: str = "us") -> str:
    """``median (min-max)`` in ``unit`` (``us`` or ``ms``)."""
    scale = {"us": 1e6, "ms": 1e3, "s": 1.0}[unit]
    values = [s * scale for s in seconds]
    digits = 2 if statistics.median(values) < 10 else 1 if statistics.median(values) < 100 else 0
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def ratio_cell(mine: list[float], theirs: list[float]) -> str:
    """The ratio of medians, with the spread of the per-round ratios (rounds taken in turn)."""
    per_round = [a / b for a, b in zip(mine, theirs)]
    return f"{statistics.median(mine) / statistics.median(theirs):.2f}x ({min(per_round):.2f}-{max(per_round):.2f})"
