"""The prefetcher: epoch time of ``fit`` with ``prefetch=2`` (the default) against ``prefetch=0``.

The prefetcher places the next batches on the device from a background thread while the
current step computes. That pays when producing a batch takes time the step does not need
(reading, decoding, a copy to a GPU); it costs a thread hand-off per batch and a second
thread wanting the GIL and a core when the batch is a slice of an array already in memory.
Each case trains one zoo model for one epoch per sample, the two sides taking turns (A, B,
A, B ...), each side its own ``Trainer`` from the same weights:

- ``digits``: scikit-learn's digits shape (1,797 rows of 64 float32 features, 10 classes) as
  in-memory arrays, the zoo ``mlp`` with ``inputs=64``, batch 32: a small in-memory array;
- ``images``: 256 rows of 3x32x32 float32 as in-memory arrays, the zoo ``cnn``, batch 64;
- ``slow``: an iterable of the digits batches that takes about one step's time to produce
  each batch (``time.sleep``: a stand-in for reading from disk), where prefetching is meant
  to help.

In the in-memory cases (``digits``, ``images``) the prefetcher times its first batches and
steps aside (places the rest on the training thread, as ``prefetch=0`` does) when placing a
batch takes under 10% of a step (``data.WORTH``); a third side, ``thread kept``, runs
``prefetch=2`` with that rule switched off, as it was before, to show what the rule decides
between. ``place/step`` is the share the prefetcher measured in one more epoch after the
timed ones, and what it decided (``aside`` or ``thread``). Prints the median epoch time with its
min-max per side, and the ratios to ``prefetch=0`` (of the medians, with the spread of the
per-round ratios): below 1.00x prefetching helps, above it costs. Run:

    .venv/bin/python benchmarks/prefetch.py [--backends torch jax tensorflow] [--cases digits images slow]
                                            [--samples 9] [--threads 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np
from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

from xdevice import Trainer, models
from xdevice.training import data as prefetching
from xdevice.training import trainer as trainer_module

BACKENDS = ("numpy", "torch", "jax", "tensorflow")
CASES = ("digits", "images", "slow")


class Sleepy:
    """The batches of ``(x, y)``, each taking ``seconds`` to produce (waiting, not computing)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, seconds: float):
        self.x, self.y, self.batch, self.seconds = x, y, batch, seconds

    def __len__(self) -> int:
        return -(-len(self.x) // self.batch)

    def __iter__(self):
        for start in range(0, len(self.x), self.batch):
            time.sleep(self.seconds)
            yield self.x[start : start + self.batch], self.y[start : start + self.batch]


def case(name: str, backend: str) -> tuple[object, object, int]:
    """``(model, data, batch size)`` of one case on ``backend``."""
    rng = np.random.default_rng(0)
    if name == "images":
        model = models.build("cnn", backend=backend, seed=0)
        x = model.example_input(256, seed=1)
        return model, (x, rng.integers(0, 10, len(x))), 64
    model = models.build("mlp", inputs=64, backend=backend, seed=0)
    x = rng.random((1797, 64), dtype=np.float32) * 16
    y = rng.integers(0, 10, len(x))
    if name == "slow":
        probe = Trainer(models.build("mlp", inputs=64, backend=backend, seed=0), "cross_entropy", "adam", lr=1e-3)
        for _ in range(3):
            probe.step(x[:32], y[:32])
        began = time.perf_counter()
        for _ in range(10):
            probe.step(x[:32], y[:32])
        return model, Sleepy(x, y, 32, (time.perf_counter() - began) / 10), 32
    return model, (x, y), 32


def epoch_of(model, data, batch: int, prefetch: int, keep_thread: bool = False):
    """One more epoch of ``fit`` per call, on a trainer of its own; ``keep_thread``: with the
    prefetcher's stepping aside switched off (placing always counts as worth a thread)."""
    trainer = Trainer(model, "cross_entropy", "adam", lr=1e-3)

    def epoch():
        saved = prefetching.WORTH
        if keep_thread:
            prefetching.WORTH = 0.0
        try:
            return trainer.fit(data, trainer.epoch + 1, batch_size=batch, prefetch=prefetch, verbose=0)
        finally:
            prefetching.WORTH = saved

    return epoch


def decided(side) -> str:
    """One more epoch of ``side``, watching its prefetcher: placing's share of a step and
    whether it stepped aside (``-`` for batches that always get the thread)."""
    made = []

    class Watched(trainer_module.Prefetcher):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    trainer_module.Prefetcher = Watched
    try:
        side()
    finally:
        trainer_module.Prefetcher = Watched.__bases__[0]
    share = made[-1].share
    return "-" if share is None else f"{share:.1%} {'aside' if made[-1].stepped_aside else 'thread'}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["torch", "jax", "tensorflow"], choices=BACKENDS)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--samples", type=int, default=9, help="timed epochs per side")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured epochs per side first (compiles)")
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=tuple(args.backends)))
    installed = [b for b in args.backends if b == "numpy" or importlib.util.find_spec(b) is not None]
    print(
        f"one epoch of fit per sample, the sides taking turns, {args.samples} samples after {args.warmup} warm-up "
        "epochs each; ms = epoch time, median (min-max); ratios to prefetch=0 (below 1: prefetching helps)"
    )
    print(
        f"{'case':<8} {'backend':<11} {'prefetch=2 ms':>20} {'thread kept ms':>20} {'prefetch=0 ms':>20} "
        f"{'prefetch=2 / 0':>18} {'thread kept / 0':>18} {'place/step':>16}"
    )
    for name in args.cases:
        for backend in installed:
            model, data, batch = case(name, backend)
            sides = {"on": epoch_of(model, data, batch, 2), "off": epoch_of(model, data, batch, 0)}
            if name != "slow":  # an iterable keeps its thread anyway
                sides["kept"] = epoch_of(model, data, batch, 2, keep_thread=True)
            times = interleaved(sides, samples=args.samples, warmup=args.warmup)
            kept = "kept" in times
            print(
                f"{name:<8} {backend:<11} {cell(times['on'], 'ms'):>20} "
                f"{cell(times['kept'], 'ms') if kept else '-':>20} {cell(times['off'], 'ms'):>20} "
                f"{ratio_cell(times['on'], times['off']):>18} "
                f"{ratio_cell(times['kept'], times['off']) if kept else '-':>18} {decided(sides['on']):>16}",
                flush=True,
            )


if __name__ == "__main__":
    main()
