"""The whole story: train once, check every backend agrees, export, serve, query.

1. train the zoo `cnn` with `xdevice.fit` on one backend (`--backend`, default torch) on
   synthetic data it can learn;
2. parity: the trained weights on every installed backend, compared with the numpy float64
   reference;
3. export it to ONNX (verified in ONNX Runtime) into a Triton-style repository, with dynamic
   batching switched on in its config.pbtxt;
4. start `xdevice serve REPO` (127.0.0.1) as its own process and wait until it is ready;
5. query it with tritonclient, unmodified, and compare the answer with the trained model's.

    .venv/bin/python examples/serve_end_to_end.py [--backend torch|jax|tensorflow]
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
from xdevice.serving import ServerProcess


def train(backend: str):
    model = models.build("cnn", seed=0, backend=backend)
    x = model.example_input(128, seed=1)
    labels = np.random.default_rng(0).integers(0, 10, size=128)  # memorise random labels: the loss must fall
    history = xdevice.fit(model, (x, labels), optimizer="adam", lr=1e-3, epochs=8, batch_size=32, verbose=0)
    print(
        f"  loss {history.epochs[0]['loss']:.3f} -> {history.last('loss'):.3f} in {len(history.steps)} steps, "
        f"accuracy {history.last('accuracy'):.2f}"
    )
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description="train, check parity, export, serve, query")
    parser.add_argument("--backend", default="torch", choices=["torch", "jax", "tensorflow", "numpy"])
    backend = parser.parse_args().backend

    print(f"1. train the cnn with xdevice.fit on {backend}")
    model = train(backend)

    print("2. parity: the trained weights on every backend against the numpy float64 reference")
    report = xdevice.parity(model, grads=False)
    for _subject, name, _count, worst_abs, _, ok in report.summary():
        print(f"  {name:<10} max abs error {worst_abs:.1e} {'ok' if ok else 'MISMATCH'}")

    with tempfile.TemporaryDirectory(prefix="xdevice-repo-") as folder:  # removed afterwards
        return serve(model, report, Path(folder), backend)


def serve(model, report, repo: Path, backend: str) -> int:
    import tritonclient.http as httpclient

    print(f"3. export to {repo}/cnn/1/model.onnx")
    result = export(model, repo / "cnn" / "1" / "model.onnx")
    print(f"  opset {result.opset}, verified in ONNX Runtime: max abs error {result.max_abs_error:.1e}")
    (repo / "cnn" / "config.pbtxt").write_text(
        "max_batch_size: 64\ndynamic_batching { max_queue_delay_microseconds: 1000 }\n"
    )

    with ServerProcess(repo) as server:  # runs `python -m xdevice serve REPO --port P`, waits until ready
        print(f"4. {' '.join(server.command[2:])}: ready")
        client = httpclient.InferenceServerClient(server.url)
        print(f"  model inputs: {client.get_model_metadata('cnn')['inputs']}")

        print("5. query it with tritonclient (binary tensors)")
        x = models.build("cnn").example_input(8, seed=5)
        request = httpclient.InferInput("input", list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        served = client.infer("cnn", [request]).as_numpy(result.outputs[0].name)
        expected = model.ops.to_numpy(model(x))
        error = float(np.abs(served - expected).max())
        print(f"  served logits {served.shape}, predicted classes {served.argmax(1).tolist()}")
        print(f"  max abs error against the trained {backend} model: {error:.1e}")
        return 0 if error < 1e-4 and report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
