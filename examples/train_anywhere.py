"""Train the same model on PyTorch, JAX, TensorFlow or numpy, changing one argument; export it to ONNX.

1. make a small synthetic dataset that can be learned: noisy 3x32x32 images with one brighter
   quadrant, labelled by which quadrant is the brightest (4 classes);
2. build the zoo `cnn` on the chosen backend and train it with `xdevice.fit` (Adam, a few epochs),
   watching the loss fall and the held-out accuracy rise;
3. export the trained model to ONNX in a temporary folder and run it in ONNX Runtime on the
   held-out rows: its answers must match the trained model's own (max abs error < 1e-4).

The backend is the only thing that changes between runs; the weights (drawn from one seed) and
the batches are the same, so the printed losses agree across backends to about four digits:

    .venv/bin/python examples/train_anywhere.py --backend torch   # or jax, tensorflow, numpy
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import xdevice
from xdevice import models
from xdevice.converters import export


def dataset(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noise images with a brighter quadrant; the label is the brightest quadrant, read off the image."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 3, 32, 32)).astype(np.float32)
    for row, quadrant in enumerate(rng.integers(0, 4, size=rows)):
        top, left = 16 * (quadrant // 2), 16 * (quadrant % 2)
        x[row, :, top : top + 16, left : left + 16] += 0.2
    quadrants = x.reshape(rows, 3, 2, 16, 2, 16).mean(axis=(1, 3, 5)).reshape(rows, 4)
    return x, quadrants.argmax(axis=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="torch", choices=["torch", "jax", "tensorflow", "numpy"])
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    x, y = dataset(576)
    train, held_out = (x[:512], y[:512]), (x[512:], y[512:])

    print(f"1. train the zoo cnn on {args.backend}: {len(train[0])} rows, {args.epochs} epochs")
    model = models.build("cnn", backend=args.backend, classes=4, seed=0)
    history = xdevice.fit(
        model,
        train,
        loss="cross_entropy",
        optimizer="adam",
        lr=1e-3,
        epochs=args.epochs,
        batch_size=32,
        validation=held_out,
        verbose=1,
    )
    first, last = history.epochs[0]["loss"], history.epochs[-1]["loss"]
    print(
        f"  loss {first:.3f} -> {last:.3f} (first step {history.steps[0]:.3f}); "
        f"held-out accuracy {history.last('val_accuracy'):.0%}"
    )

    with tempfile.TemporaryDirectory(prefix="xdevice-train-") as folder:
        path = Path(folder) / "cnn.onnx"
        print(f"2. export to {path}")
        # numpy has no tracer, so a numpy model is exported from torch (the same weights)
        result = export(history.model, path, backend="torch" if args.backend == "numpy" else None)
        print(f"  exported by {result.producer}, opset {result.opset}")

        import onnxruntime

        print(f"3. ONNX Runtime against the trained {args.backend} model on {len(held_out[0])} held-out rows")
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        served = session.run([result.outputs[0].name], {result.inputs[0].name: held_out[0]})[0]
    own = model.ops.to_numpy(model(held_out[0]))
    error = float(np.abs(served - own).max())
    agree = float((served.argmax(1) == own.argmax(1)).mean())
    print(f"  ONNX max abs error {error:.1e}; same predicted class on {agree:.0%} of the rows")

    ok = last < first and error < 1e-4
    print("OK" if ok else "FAILED: " + ("the loss did not fall" if last >= first else "ONNX disagrees"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
