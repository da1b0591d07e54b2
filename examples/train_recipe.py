"""The training recipe a Lightning Fabric or Accelerate user writes, on the framework one argument names.

A zoo model trained with mixed precision (bfloat16, or float16 with dynamic loss scaling),
AdamW on a cosine schedule with linear warmup, gradient clipping, gradient accumulation,
early stopping, the best checkpoint kept, TensorBoard and CSV logs:

1. estimate the memory one training step takes per device, and whether it fits;
2. train with the recipe, printing one line per epoch (a live bar on a terminal);
3. load the best checkpoint into a fresh model and check it scores what the run recorded.

    .venv/bin/python examples/train_recipe.py --backend jax     # or torch, tensorflow
    .venv/bin/python examples/train_recipe.py --backend torch --precision float16 --logdir runs/
    tensorboard --logdir runs/                                  # the curves, if TensorBoard is installed
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import xdevice
from xdevice import Trainer, models
from xdevice.training import BestCheckpoint, CSVLogger, EarlyStopping, TensorBoard, cosine


def dataset(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Points in 20 dimensions; the label (of 4) is which of two directions they lean along, and how far."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 20)).astype(np.float32)
    return x, (x[:, 0] > 0).astype("int64") * 2 + (x[:, 1] + 0.5 * x[:, 2] > 0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax", "tensorflow"])
    parser.add_argument("--precision", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--epochs", type=int, default=30, help="at most this many (early stopping may end sooner)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per micro-batch")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per optimizer step")
    parser.add_argument("--logdir", default=None, help="keep checkpoints and logs here (default: a temporary folder)")
    args = parser.parse_args()

    x, y = dataset(1280)
    train, held_out = (x[:1024], y[:1024]), (x[1024:], y[1024:])
    spec = {"hidden": [64, 64], "inputs": 20, "classes": 4, "seed": 0}
    model = models.build("mlp", backend=args.backend, **spec)

    print(f"1. memory for one step of the mlp at batch {args.batch_size}, AdamW, {args.precision}, on {args.backend}:")
    estimate = xdevice.estimate_memory(
        "mlp", batch=args.batch_size, optimizer="adamw", precision=args.precision, backend=args.backend, **spec
    )
    measured = f", measured {estimate.measured['total'] / 2**20:.1f} MiB" if estimate.measured else ""
    print(
        f"  arithmetic {estimate.total / 2**20:.1f} MiB{measured}; "
        f"{'fits' if estimate.fits else 'does not fit'} {estimate.available_from}"
    )

    steps_per_epoch = -(-len(train[0]) // (args.batch_size * args.accumulate))
    total = steps_per_epoch * args.epochs
    with tempfile.TemporaryDirectory(prefix="xdevice-recipe-") as scratch:
        folder = Path(args.logdir or scratch)
        print(
            f"2. train: AdamW, cosine from 3e-3 over {total} steps after {steps_per_epoch} of warmup, "
            f"clip_norm=1, accumulate={args.accumulate}, {args.precision}; logs in {folder}"
        )
        trainer = Trainer(
            model,
            optimizer="adamw",
            lr=cosine(3e-3, total_steps=total, warmup_steps=steps_per_epoch),
            weight_decay=0.01,
            precision=args.precision,
            clip_norm=1.0,
            accumulate=args.accumulate,
        )
        stop = EarlyStopping("val_loss", patience=2, min_delta=2e-3)
        best = BestCheckpoint(str(folder / "best"), monitor="val_accuracy", mode="max")
        history = trainer.fit(
            train,
            epochs=args.epochs,
            batch_size=args.batch_size,
            validation=held_out,
            checkpoint_dir=str(folder / "last"),
            callbacks=[stop, best, CSVLogger(str(folder / "epochs.csv")), TensorBoard(str(folder / "tensorboard"))],
        )
        ran = len(history.epochs)
        stopped = (
            f"early stopping ended it after epoch {stop.stopped_epoch}" if stop.stopped_epoch else "it ran every epoch"
        )
        skipped = sum(history["skipped_steps"]) if args.precision == "float16" else None
        print(
            f"  {ran} epochs, {trainer.step_count} optimizer steps; {stopped}; "
            f"val accuracy {history['val_accuracy'][0]:.0%} -> {history.last('val_accuracy'):.0%}"
            + (f"; {skipped} float16 step(s) skipped" if skipped is not None else "")
        )

        print(f"3. load the best checkpoint (epoch {best.best_epoch}) into a fresh model")
        fresh = Trainer(
            models.build("mlp", backend=args.backend, **{**spec, "seed": 1}),
            optimizer="adamw",
            lr=cosine(3e-3, total_steps=total, warmup_steps=steps_per_epoch),
            weight_decay=0.01,
            precision=args.precision,
            clip_norm=1.0,
            accumulate=args.accumulate,
        ).load(str(folder / "best"))
        scored = fresh.evaluate(held_out)["accuracy"]
        recorded = history["val_accuracy"][best.best_epoch - 1]
        print(f"  held-out accuracy {scored:.1%} (the run recorded {recorded:.1%} for that epoch)")
        logs = sorted(p.name for p in (folder / "tensorboard").iterdir())
        print(
            f"  TensorBoard event files: {len(logs)}; epochs.csv rows: "
            f"{len((folder / 'epochs.csv').read_text().splitlines()) - 1}"
        )
        if abs(scored - recorded) > 1e-6 or history.last("val_accuracy") < 0.5:
            print("  unexpected: the checkpoint does not score what was recorded, or the model did not learn")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
