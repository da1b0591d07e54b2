"""The conversion matrix: each zoo model from each framework to ONNX, and back into every backend.

For every model and source framework: export to ONNX (verified), then import the ONNX
model on torch, tensorflow, jax and numpy and run it in ONNX Runtime; print the max abs
error of each target against the source framework's own output, the export and import
times, and ONNX Runtime's speed-up over the source framework's eager forward pass at
batch 64, measured in the same run (medians). Run:

    .venv/bin/python benchmarks/convert.py [--models cnn] [--sources torch] [--repeats 20]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import xdevice
from xdevice import models
from xdevice.converters import export
from xdevice.converters.importer import from_onnx

BATCH = 64
TARGETS = ("torch", "tensorflow", "jax", "numpy", "onnxruntime")


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def eager_source(model, source: str):
    """The source framework's own eager forward (no jit, no tf.function)."""
    backend = xdevice.backend(source)
    placed = model.to(source)
    if source == "torch":
        import torch

        module = models.to_native(placed, "torch").eval()

        def run(x):
            with torch.no_grad():
                return module(x)
        return run, backend
    if source == "tensorflow":
        module = models.to_native(placed, "tensorflow")
        return (lambda x: module(x)), backend
    apply_fn, params = models.to_native(placed, "jax")
    return (lambda x: apply_fn(params, x)), backend


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(models.NAMES))
    parser.add_argument("--sources", nargs="+", default=[b for b in ("torch", "tensorflow", "jax")
                                                         if b in xdevice.backends()])
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import onnxruntime

    print(f"max abs error of each target against the source framework (batch {BATCH}); times in seconds;")
    print("ORT speed-up = source eager forward / ONNX Runtime session.run, medians, same run")
    header = f"{'model':<12} {'source':<11} {'export s':>8} " + " ".join(f"{t:>11}" for t in TARGETS)
    print(header + f" {'import s':>8} {'ORT x':>6}")
    for target in TARGETS[:-1]:  # start each framework first: import times are then the import's own
        xdevice.backend(target).ops.to_numpy(xdevice.backend(target).ops.asarray(np.ones(2, np.float32)) * 2)
    for name in args.models:
        model = models.build(name, seed=0)
        x = model.example_input(BATCH, seed=1)
        for source in args.sources:
            result = export(model.to(source), example_inputs=x[:8])
            run_source, backend = eager_source(model, source)
            xin = backend.ops.asarray(x)
            expected = backend.ops.to_numpy(run_source(xin))
            errors, import_seconds = [], []
            for target in TARGETS:
                if target == "onnxruntime":
                    session = onnxruntime.InferenceSession(result.model.SerializeToString(),
                                                           providers=["CPUExecutionProvider"])
                    feed = {session.get_inputs()[0].name: x}
                    got = session.run(None, feed)[0]
                else:
                    start = time.perf_counter()
                    imported = from_onnx(result.model, backend=target)
                    import_seconds.append(time.perf_counter() - start)
                    got = xdevice.backend(target).ops.to_numpy(imported(x))
                errors.append(float(np.max(np.abs(np.asarray(got, dtype=np.float64) - expected))))
            source_ms = median_ms(lambda: backend.ops.to_numpy(run_source(xin)), args.repeats)
            ort_ms = median_ms(lambda: session.run(None, feed), args.repeats)
            print(f"{name:<12} {source:<11} {result.seconds:>8.1f} " + " ".join(f"{e:>11.1e}" for e in errors)
                  + f" {max(import_seconds):>8.2f} {source_ms / ort_ms:>6.1f}", flush=True)


if __name__ == "__main__":
    main()
