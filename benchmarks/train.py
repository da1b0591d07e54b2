"""Training speed: steps/s of ``xdevice`` per backend and zoo model, against native loops, and input stalls.

1. For each zoo model and backend, at batch 64 (``--batch``): ``Trainer(model, "cross_entropy",
   "adam").step(x, y)`` on one fixed synthetic batch (numpy in, the loss back as a Python
   float, so every step is waited for). ``--warmup`` unmeasured steps first (the first one
   compiles: ``jax.jit``, ``tf.function``), then ``--steps`` steps timed one by one, fewer when
   a cell would pass ``--max-seconds``; steps/s is 1 / the median step time.
2. Native baselines, in the same run, on the same weights and batch, timed the same way and
   taking turns with xdevice's step by step (so load from elsewhere falls on both alike).
   PyTorch: ``models.to_native(model, "torch")`` in the plain loop (forward, ``cross_entropy``,
   ``zero_grad``, ``backward``, ``torch.optim.Adam.step``, ``loss.item()``); JAX: the
   ``(apply_fn, params)`` pair with ``jax.value_and_grad`` and ``optax.adam`` under one
   ``jax.jit``; TensorFlow: the ``tf.Module`` with ``GradientTape`` and
   ``keras.optimizers.Adam`` under ``tf.function``. The ratio xdevice / native (steps/s) is the
   cost of the training loop itself; 1.00 means none. The native modules run the zoo's own
   forward, so the forward is not part of the ratio (``benchmarks/zoo.py`` measures that).
3. Input stalls: ``fit`` for two epochs on one model (``--stall-model``, on the first backend
   other than numpy) from an iterable of batches that is deliberately slow to produce, about
   one training step per batch, with ``prefetch=0`` and ``prefetch=2``; prints the last
   epoch's ``input_wait`` (the fraction of the epoch spent waiting for input) and its steps/s.
   Two sources: numpy work (a stand-in for decoding and augmenting: it needs a core, which the
   step's own threads also want) and sleeping (a stand-in for reading from disk: it needs none).
4. With several GPUs: rows/s on 1 GPU against all of them, data-parallel in one process
   (``fit(..., devices=[...])``: JAX's mesh, TensorFlow's ``MirroredStrategy``), ``--batch``
   rows per device; otherwise one line saying so. ``--scaling-on cpu`` runs the same path
   over ``--cpu-devices`` virtual CPUs (they share the cores: it shows the path works, not
   a speed-up). ``--parts`` picks the measurements.

The numpy reference backend is slow (about a second a step for the resnet on two cores), so
``--max-seconds`` bounds each cell, and it has no native loop to compare with; input stalls
are measured on the first other backend. Run:

    .venv/bin/python benchmarks/train.py [--models cnn lstm] [--backends torch jax] [--steps 30]
                                         [--batch 64] [--warmup 3] [--max-seconds 10] [--threads 1]
                                         [--parts speed stalls scaling] [--scaling-on cpu --cpu-devices 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import numpy as np
from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

import xdevice
from xdevice import Trainer, models

BACKENDS = ("numpy", "torch", "jax", "tensorflow")
LR = 1e-3


def batch_for(model, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A synthetic batch of the model's own input and valid class ids."""
    x = model.example_input(batch, seed=seed)
    y = np.random.default_rng(seed).integers(0, model.spec["classes"], size=batch)
    return x, y


def timed(*steps_to_time, warmup: int, steps: int, budget: float) -> list[float]:
    """The median seconds of each ``step()`` over ``steps`` timed calls, taken in turns (A B A B...)
    so that load from elsewhere on the machine falls on all of them alike; fewer calls once
    ``budget`` seconds per step function have passed (at least 3)."""
    for step in steps_to_time:
        for _ in range(warmup):
            step()
    times: list[list[float]] = [[] for _ in steps_to_time]
    began = time.perf_counter()
    while len(times[0]) < steps and (len(times[0]) < 3 or time.perf_counter() - began < budget * len(steps_to_time)):
        for step, taken in zip(steps_to_time, times):
            start = time.perf_counter()
            step()
            taken.append(time.perf_counter() - start)
    return [statistics.median(taken) for taken in times]


# -- native training loops, one per framework ---------------------------------------------------


def torch_native(model, x, y):
    import torch

    module = models.to_native(model, "torch").train()
    optimizer = torch.optim.Adam(module.parameters(), lr=LR)
    x, y = torch.as_tensor(x), torch.as_tensor(y)

    def step():
        loss = torch.nn.functional.cross_entropy(module(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def jax_native(model, x, y):
    import jax
    import optax

    apply_fn, params = models.to_native(model, "jax")
    trainable = {k: params[k] for k in model.trainable}
    buffers = {k: params[k] for k in model.buffers}
    optimizer = optax.adam(LR)

    def objective(trainable, buffers, x, y):
        out, updates = apply_fn({**trainable, **buffers}, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), updates

    @jax.jit
    def update(trainable, buffers, state, x, y):
        (loss, updates), grads = jax.value_and_grad(objective, has_aux=True)(trainable, buffers, x, y)
        changes, state = optimizer.update(grads, state, trainable)
        return optax.apply_updates(trainable, changes), {**buffers, **updates}, state, loss

    state = {"trainable": trainable, "buffers": buffers, "optimizer": optimizer.init(trainable)}

    def step():
        state["trainable"], state["buffers"], state["optimizer"], loss = update(
            state["trainable"], state["buffers"], state["optimizer"], x, y
        )
        return float(loss)

    return step


def tensorflow_native(model, x, y):
    import keras
    import tensorflow as tf

    module = models.to_native(model, "tensorflow")
    variables = list(module.trainable_variables)
    optimizer = keras.optimizers.Adam(LR)

    @tf.function
    def update(x, y):
        with tf.GradientTape() as tape:
            out = module(x, training=True)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, out))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return lambda: float(update(x, y))


NATIVE = {"torch": torch_native, "jax": jax_native, "tensorflow": tensorflow_native}


# -- data sources that are slow to produce batches ---------------------------------------------


class SlowBatches:
    """Batches of ``(x, y)`` rows, each taking about ``seconds`` to produce: numpy work on the
    CPU (``"numpy"``, a stand-in for decoding and augmenting) or waiting (``"sleep"``, a
    stand-in for reading from disk or the network)."""

    def __init__(self, x: np.ndarray, y: np.ndarray, batch: int, count: int, seconds: float, kind: str):
        self.x, self.y, self.batch, self.count, self.kind = x, y, batch, count, kind
        self.seconds = seconds
        self.size = self._calibrate(seconds) if kind == "numpy" else 0

    @staticmethod
    def _work(size: int, seed: int) -> None:
        np.sort(np.random.default_rng(seed).standard_normal(size))

    def _calibrate(self, seconds: float) -> int:
        size = 100_000
        start = time.perf_counter()
        for seed in range(5):
            self._work(size, seed)
        return max(1_000, int(size * seconds / ((time.perf_counter() - start) / 5)))

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        for index in range(self.count):
            if self.kind == "numpy":
                self._work(self.size, index)
            else:
                time.sleep(self.seconds)
            rows = np.arange(index * self.batch, (index + 1) * self.batch) % len(self.x)
            yield self.x[rows], self.y[rows]


def stalls(name: str, backend: str, device: str, batch: int, step_seconds: float, count: int = 30) -> None:
    model = models.build(name, backend=backend, device=device, seed=0)
    x, y = batch_for(model, batch * 4)
    print(
        f"\ninput stalls: {name} on {backend}, fit for 2 epochs of {count} batches of {batch} from an iterable "
        f"that takes ~{step_seconds * 1e3:.1f} ms (one step) to produce each batch; the last epoch:"
    )
    print(f"{'source':<8} {'prefetch':>8} {'input_wait':>11} {'steps/s':>8} {'epoch s':>8}")
    for kind in ("numpy", "sleep"):
        data = SlowBatches(x, y, batch, count, step_seconds, kind)
        for prefetch in (0, 2):
            history = xdevice.fit(
                models.build(name, backend=backend, device=device, seed=0),
                data,
                epochs=2,
                prefetch=prefetch,
                lr=LR,
                verbose=0,
            )
            last = history.epochs[-1]
            print(
                f"{kind:<8} {prefetch:>8} {last['input_wait']:>10.1%} {count / last['seconds']:>8.1f} "
                f"{last['seconds']:>8.2f}",
                flush=True,
            )


def scaling(
    names: list[str], backends: list[str], batch: int, warmup: int, steps: int, budget: float, kind: str = "gpu"
) -> None:
    """1 device against all of them (``kind``: GPUs, or virtual CPUs to try the path without
    GPUs), data-parallel in one process, ``batch`` rows per device."""
    print(f"\nscaling over {kind} devices in one process (fit(..., devices=[...])), {batch} rows per device:")
    print(f"{'model':<12} {'backend':<11} {'devices':>7} {'steps/s':>8} {'rows/s':>9} {'speed-up':>9}")
    for backend in backends:
        found = xdevice.devices(kind=kind, backend=backend) if backend != "numpy" else []
        engine = xdevice.backend(backend)
        if not engine.supports_replication:
            print(
                f"{'':<12} {backend:<11} "
                + (
                    "replicates across processes only (xdevice launch); not measured here"
                    if engine.supports_processes
                    else "does not replicate"
                )
            )
            continue
        if len(found) < 2:
            print(f"{'':<12} {backend:<11} {len(found)} {kind} device(s): 1 vs N scaling needs at least two")
            continue
        for name in names:
            rates = {}
            for count in sorted({1, len(found)}):
                model = models.build(name, backend=backend, device=found[0], seed=0)
                trainer = Trainer(model, "cross_entropy", "adam", devices=found[:count], lr=LR)
                x, y = batch_for(model, batch * count)
                (seconds,) = timed(lambda: trainer.step(x, y), warmup=warmup, steps=steps, budget=budget)
                rates[count] = batch * count / seconds
                print(
                    f"{name:<12} {backend:<11} {count:>7} {rates[count] / (batch * count):>8.1f} "
                    f"{rates[count]:>9.0f} {rates[count] / rates[1]:>8.2f}x",
                    flush=True,
                )


def speed(
    names: list[str],
    backends: list[str],
    skipped: list[str],
    device: str,
    batch: int,
    warmup: int,
    steps: int,
    budget: float,
) -> None:
    """Steps/s of xdevice's step against the native loop, per model and backend (part 1)."""
    missing = f"; not installed: {', '.join(skipped)}" if skipped else ""
    print(
        f"training steps/s at batch {batch}, Adam lr {LR}, on {device}; up to {steps} timed steps "
        f"each after {warmup} warm-up steps, taken in turns{missing}"
    )
    print(
        "ms = step time, median (min-max); ratio = xdevice steps/s / native steps/s (of the medians, "
        "with the spread of the per-step ratios)"
    )
    print(
        f"{'model':<12} {'backend':<11} {'xdevice/s':>10} {'native/s':>9} {'ratio':>20}  "
        f"{'xdevice ms':>20} {'native ms':>20}"
    )
    for name in names:
        for backend in backends:
            model = models.build(name, backend=backend, device=device, seed=0)
            x, y = batch_for(model, batch)
            trainer = Trainer(model, "cross_entropy", "adam", lr=LR)
            sides = {"xdevice": lambda: trainer.step(x, y)}
            if backend in NATIVE:
                twin = models.build(name, backend=backend, device=device, seed=0)
                sides["native"] = NATIVE[backend](twin, x, y)
            times = interleaved(sides, samples=steps, warmup=warmup, budget=budget * len(sides))
            ours = statistics.median(times["xdevice"])
            if "native" in times:
                native = statistics.median(times["native"])
                shown = (
                    f"{1 / native:>9.1f} {ratio_cell(times['native'], times['xdevice']):>20}  "
                    f"{cell(times['xdevice'], 'ms'):>20} {cell(times['native'], 'ms'):>20}"
                )
            else:
                shown = f"{'-':>9} {'-':>20}  {cell(times['xdevice'], 'ms'):>20} {'-':>20}"
            print(f"{name:<12} {backend:<11} {1 / ours:>10.1f} {shown}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(models.NAMES), choices=models.NAMES)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per cell")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps first (the first compiles)")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="stop timing a cell after this long")
    parser.add_argument("--stall-model", default="cnn", choices=models.NAMES)
    parser.add_argument("--device", default="cpu", help="where to train (default cpu)")
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["speed", "stalls", "scaling"],
        choices=["speed", "stalls", "scaling"],
        help="which measurements to run",
    )
    parser.add_argument(
        "--scaling-on",
        default="gpu",
        choices=["gpu", "cpu"],
        help="cpu: scale over --cpu-devices virtual CPUs (tries the path; no speed-up to expect)",
    )
    parser.add_argument("--cpu-devices", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=tuple(args.backends)))
    if args.scaling_on == "cpu":
        xdevice.configure(cpu_devices=args.cpu_devices)

    installed = [b for b in args.backends if b == "numpy" or importlib.util.find_spec(b) is not None]
    skipped = sorted(set(args.backends) - set(installed))
    if "speed" in args.parts:
        speed(args.models, installed, skipped, args.device, args.batch, args.warmup, args.steps, args.max_seconds)
    if "stalls" in args.parts:
        stall_backend = next((b for b in installed if b != "numpy"), installed[0])
        model = models.build(args.stall_model, backend=stall_backend, device=args.device, seed=0)
        trainer = Trainer(model, "cross_entropy", "adam", lr=LR)
        x, y = batch_for(model, args.batch)
        # the step time now (not the table's: load from elsewhere may have changed), to match the source to it
        (step_seconds,) = timed(lambda: trainer.step(x, y), warmup=args.warmup, steps=10, budget=args.max_seconds)
        stalls(args.stall_model, stall_backend, args.device, args.batch, step_seconds)
    if "scaling" in args.parts:
        scaling(args.models, installed, args.batch, args.warmup, args.steps, args.max_seconds, args.scaling_on)


if __name__ == "__main__":
    main()
