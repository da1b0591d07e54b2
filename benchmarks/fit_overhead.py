"""The cost of ``fit``'s loop: one epoch of ``Trainer.fit`` against the hand-written loop.

For each zoo model and backend: one trainer (``"cross_entropy"``, ``"adam"``, ``lr`` 1e-3),
built and warmed up once (the first epoch compiles), then each round trains one more epoch
of ``--rows`` rows in batches of ``--batch`` (``trainer.fit(data, epochs=trainer.epoch + 1,
verbose=0)``: shuffling, checks, placing, the step, the loss and metrics read back, the
history). The hand-written loop does what a user writes without ``fit``: a permutation of the
rows each epoch, each batch sliced from numpy and made the framework's tensor, the native step
of ``benchmarks/train.py`` (torch: ``torch.optim.Adam``; JAX: ``optax.adam`` under ``jax.jit``;
TensorFlow: ``keras.optimizers.Adam`` under ``tf.function``), and the loss read back as a
Python float each step. The two take turns, round by round (``_timing.interleaved``), so load
from elsewhere falls on both alike; the ratio fit / hand is of the medians, with the spread of
the per-round ratios. 1.00 means ``fit`` costs nothing beyond the loop a user would write.

    .venv/bin/python benchmarks/fit_overhead.py [--models mlp cnn] [--backends torch jax tensorflow]
                                                [--rows 2048] [--batch 64] [--rounds 9] [--threads 1]
                                                [--clock wall|cpu]

``--clock cpu`` times each epoch by this process's CPU seconds (``time.process_time``, every
thread) instead of the wall clock: on a shared machine other processes' load moves it less.
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import numpy as np
from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

BACKENDS = ("torch", "jax", "tensorflow")
LR = 1e-3


def data_for(model, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` of the model's own input and valid class ids."""
    x = model.example_input(rows, seed=0)
    y = np.random.default_rng(0).integers(0, model.spec["classes"], size=rows)
    return x, y


def batches(x: np.ndarray, y: np.ndarray, batch: int, epoch: int):
    """The hand loop's batches: a fresh permutation each epoch, sliced from numpy."""
    order = np.random.default_rng(epoch).permutation(len(x))
    for start in range(0, len(x), batch):
        rows = order[start : start + batch]
        yield x[rows], y[rows]


def torch_epoch(model, x, y, batch):
    import torch

    from xdevice import models

    module = models.to_native(model, "torch").train()
    optimizer = torch.optim.Adam(module.parameters(), lr=LR)
    epoch = [0]

    def run():
        for xb, yb in batches(x, y, batch, epoch[0]):
            loss = torch.nn.functional.cross_entropy(module(torch.as_tensor(xb)), torch.as_tensor(yb))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss.item()
        epoch[0] += 1

    return run


def jax_epoch(model, x, y, batch):
    import jax
    import jax.numpy as jnp
    import optax

    from xdevice import models

    apply_fn, params = models.to_native(model, "jax")
    optimizer = optax.adam(LR)

    def objective(trainable, buffers, x, y):
        out, updates = apply_fn({**trainable, **buffers}, x, train=True)
        return optax.softmax_cross_entropy_with_integer_labels(out, y).mean(), updates

    @jax.jit
    def update(trainable, buffers, state, x, y):
        (loss, updates), grads = jax.value_and_grad(objective, has_aux=True)(trainable, buffers, x, y)
        changes, state = optimizer.update(grads, state, trainable)
        return optax.apply_updates(trainable, changes), {**buffers, **updates}, state, loss

    trainable = {k: params[k] for k in model.trainable}
    held = {"p": trainable, "b": {k: params[k] for k in model.buffers}, "s": optimizer.init(trainable)}
    epoch = [0]

    def run():
        for xb, yb in batches(x, y, batch, epoch[0]):
            held["p"], held["b"], held["s"], loss = update(held["p"], held["b"], held["s"], jnp.asarray(xb), yb)
            float(loss)
        epoch[0] += 1

    return run


def tensorflow_epoch(model, x, y, batch):
    import keras
    import tensorflow as tf

    from xdevice import models

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

    epoch = [0]

    def run():
        for xb, yb in batches(x, y, batch, epoch[0]):
            float(update(tf.convert_to_tensor(xb), tf.convert_to_tensor(yb)))
        epoch[0] += 1

    return run


HAND = {"torch": torch_epoch, "jax": jax_epoch, "tensorflow": tensorflow_epoch}


def fit_epoch(model, x, y, batch):
    from xdevice import Trainer

    trainer = Trainer(model, "cross_entropy", "adam", lr=LR)
    return lambda: trainer.fit((x, y), epochs=trainer.epoch + 1, batch_size=batch, verbose=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "resnet", "lstm", "transformer"])
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--rows", type=int, default=2048, help="rows per epoch")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9, help="timed epochs of each side, taken in turns")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="stop a cell's rounds after this long")
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time (every thread), moved less by other processes",
    )
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=tuple(args.backends)))
    from xdevice import models

    installed = [b for b in args.backends if importlib.util.find_spec(b) is not None]
    print(f"one epoch of {args.rows} rows, batch {args.batch}, Adam lr {LR}; {args.rounds} rounds taken in turns")
    print(f"{args.clock} ms per epoch: median (min-max); ratio = fit / hand-written loop (medians; per-round spread)")
    print(f"{'model':<12} {'backend':<11} {'fit ms':>22} {'hand ms':>22} {'ratio':>20}")
    for name in args.models:
        for backend in installed:
            mine = models.build(name, backend=backend, seed=0)
            twin = models.build(name, backend=backend, seed=0)
            x, y = data_for(mine, args.rows)
            sides = {"fit": fit_epoch(mine, x, y, args.batch), "hand": HAND[backend](twin, x, y, args.batch)}
            clock = time.process_time if args.clock == "cpu" else time.perf_counter
            times = interleaved(sides, samples=args.rounds, warmup=1, budget=args.max_seconds, clock=clock)
            print(
                f"{name:<12} {backend:<11} {cell(times['fit'], 'ms'):>22} {cell(times['hand'], 'ms'):>22} "
                f"{ratio_cell(times['fit'], times['hand']):>20}",
                flush=True,
            )


if __name__ == "__main__":
    main()
