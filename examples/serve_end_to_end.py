"""Train in PyTorch, export to ONNX, serve with `xdevice serve`, query with the standard client.

1. train the zoo `cnn` for a few steps as a plain torch.nn.Module on synthetic data;
2. export it to ONNX (verified against torch in ONNX Runtime) into a Triton-style repository,
   with dynamic batching switched on in its config.pbtxt;
3. start `xdevice serve REPO` (127.0.0.1) as its own process and wait until it is ready;
4. query it with tritonclient, unmodified, and compare the answer with the torch model's.

    .venv/bin/python examples/serve_end_to_end.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from xdevice import models
from xdevice.converters import export
from xdevice.serving import ServerProcess


def train(steps: int = 30):
    import torch

    model = models.build("cnn", seed=0, backend="torch")
    module = models.to_native(model, "torch")
    rng = np.random.default_rng(0)
    x = torch.as_tensor(model.example_input(64, seed=1))
    labels = torch.as_tensor(rng.integers(0, 10, size=64))  # memorise random labels: the loss must fall
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
    for step in range(steps):
        loss = torch.nn.functional.cross_entropy(module(x), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step in (0, steps - 1):
            print(f"  step {step:>2}: loss {loss.item():.3f}")
    return module.eval()


def main() -> int:
    import torch
    import tritonclient.http as httpclient

    print("1. train the cnn in torch")
    module = train()

    repo = Path(tempfile.mkdtemp(prefix="xdevice-repo-"))
    print(f"2. export to {repo}/cnn/1/model.onnx")
    result = export(models.from_native(module), repo / "cnn" / "1" / "model.onnx")
    print(f"  opset {result.opset}, verified in ONNX Runtime: max abs error {result.max_abs_error:.1e}")
    (repo / "cnn" / "config.pbtxt").write_text(
        "max_batch_size: 64\ndynamic_batching { max_queue_delay_microseconds: 1000 }\n")

    with ServerProcess(repo) as server:  # runs `python -m xdevice serve REPO --port P`, waits until ready
        print(f"3. {' '.join(server.command[2:])}: ready")
        client = httpclient.InferenceServerClient(server.url)
        print(f"  model inputs: {client.get_model_metadata('cnn')['inputs']}")

        print("4. query it with tritonclient (binary tensors)")
        x = models.build("cnn").example_input(8, seed=5)
        request = httpclient.InferInput("input", list(x.shape), "FP32")
        request.set_data_from_numpy(x)
        served = client.infer("cnn", [request]).as_numpy(result.outputs[0].name)
        with torch.no_grad():
            expected = module(torch.as_tensor(x)).numpy()
        error = float(np.abs(served - expected).max())
        print(f"  served logits {served.shape}, predicted classes {served.argmax(1).tolist()}")
        print(f"  max abs error against the torch model: {error:.1e}")
        return 0 if error < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
