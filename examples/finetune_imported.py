"""A model trained in one framework, fine-tuned in another, served: the ONNX round trip.

1. a torch MLP (a plain ``torch.nn.Sequential``) exported to ONNX, verified in ONNX Runtime;
2. imported into JAX with ``from_onnx``: its weights are JAX arrays, its constants fixed;
3. fine-tuned there with ``xdevice.fit`` on data the torch model never saw (the loss falls);
4. exported again: the imported graph with its fine-tuned weights, verified in ONNX Runtime;
5. served with ``xdevice serve`` (127.0.0.1) and queried with tritonclient: the answers are
   the fine-tuned model's, not the original's.

    .venv/bin/python examples/finetune_imported.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

import xdevice
from xdevice.converters import export, from_onnx
from xdevice.serving import ServerProcess


def main() -> int:
    argparse.ArgumentParser(description="torch -> ONNX -> fine-tune in JAX -> ONNX -> serve").parse_args()
    backend = "jax"
    with tempfile.TemporaryDirectory(prefix="xdevice-roundtrip-") as folder:  # removed afterwards
        return roundtrip(Path(folder), backend)


def roundtrip(folder: Path, backend: str) -> int:
    import torch
    import tritonclient.http as httpclient

    rng = np.random.default_rng(0)
    x = rng.normal(size=(512, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(np.int64)

    print("1. a torch MLP, exported to ONNX")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(32, 2))
    first = export(net, folder / "original.onnx", example_inputs=x[:4])
    print(f"  {first.producer}, opset {first.opset}, max abs error in ONNX Runtime {first.max_abs_error:.1e}")

    print(f"2. imported into {backend}")
    model = from_onnx(first.path, backend=backend)
    print(f"  {model}")
    print(f"  weights {sorted(model.params)}; constants {sorted(model.constants)}")
    before = xdevice.backend(backend).ops.to_numpy(model(x))

    print(f"3. fine-tuned on {backend} with xdevice.fit")
    history = xdevice.fit(model, (x, y), optimizer="adam", lr=0.01, epochs=6, batch_size=64, verbose=0)
    print(
        f"  loss {history.epochs[0]['loss']:.3f} -> {history.last('loss'):.3f}, accuracy {history.last('accuracy'):.2f}"
    )
    tuned = xdevice.backend(backend).ops.to_numpy(model(x))

    print(f"4. exported again from {backend}")
    repo = folder / "repo"
    second = export(model, repo / "tuned" / "1" / "model.onnx", example_inputs=x[:4])
    print(f"  {second.producer}, max abs error in ONNX Runtime {second.max_abs_error:.1e}")
    (repo / "tuned" / "config.pbtxt").write_text("max_batch_size: 64\n")

    with ServerProcess(repo) as server:
        print(f"5. {' '.join(server.command[2:])}: ready; query with tritonclient")
        client = httpclient.InferenceServerClient(server.url)
        name = client.get_model_metadata("tuned")["inputs"][0]["name"]
        request = httpclient.InferInput(name, [16, 8], "FP32")
        request.set_data_from_numpy(x[:16])
        served = client.infer("tuned", [request]).as_numpy(second.outputs[0].name)
    error = float(np.abs(served - tuned[:16]).max())
    moved = float(np.abs(tuned[:16] - before[:16]).max())
    print(f"  served vs fine-tuned: max abs error {error:.1e}; fine-tuning moved the outputs by {moved:.2f}")
    return 0 if error < 1e-4 and moved > 1e-2 and history.last("loss") < history.epochs[0]["loss"] else 1


if __name__ == "__main__":
    sys.exit(main())
