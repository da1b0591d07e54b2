"""The server's memory under large JSON bodies: ``--clients`` concurrent requests, each a JSON
body of ``--rows`` x 4 FP32 values (700,000 rows: about 55 MiB of text, a 10.7 MiB tensor), to
``xdevice serve`` running a one-layer dense model; prints the server's resident memory before,
at its peak (sampled every 10 ms) and after, and every answer's status.

    .venv/bin/python benchmarks/large_bodies.py [--rows 700000] [--clients 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psutil

from xdevice.serving import ServerProcess


def repository(root: Path) -> None:
    """``dense``: y = x @ W for x of shape (batch, 4), version 1 (``dense/1/model.onnx``)."""
    from onnx import TensorProto, helper, numpy_helper, save

    weight = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    (root / "dense" / "1").mkdir(parents=True)
    save(model, str(root / "dense" / "1" / "model.onnx"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=700_000)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    x = np.random.default_rng(0).normal(size=(args.rows, 4)).astype(np.float32)
    tensor = {"name": "x", "shape": [args.rows, 4], "datatype": "FP32", "data": x.ravel().tolist()}
    body = json.dumps({"inputs": [tensor]}).encode()
    print(f"{args.clients} concurrent bodies of {len(body) / 2**20:.1f} MiB (tensor {x.nbytes / 2**20:.1f} MiB)")
    with tempfile.TemporaryDirectory(prefix="xdevice-bodies-") as folder:
        repository(Path(folder))
        with ServerProcess(folder) as server:
            assert server.process is not None
            process = psutil.Process(server.process.pid)
            baseline = peak = process.memory_info().rss
            done = threading.Event()

            def watch() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, process.memory_info().rss)
                    time.sleep(0.01)

            statuses: list[int] = []

            def send() -> None:
                connection = http.client.HTTPConnection(server.url, timeout=300)
                connection.request("POST", "/v2/models/dense/infer", body, {"Content-Type": "application/json"})
                answer = connection.getresponse()
                answer.read()
                statuses.append(answer.status)

            watcher = threading.Thread(target=watch)
            watcher.start()
            clients = [threading.Thread(target=send) for _ in range(args.clients)]
            for client in clients:
                client.start()
            for client in clients:
                client.join()
            done.set()
            watcher.join()
            after = process.memory_info().rss
    mib = 2**20
    print(
        f"answers {sorted(statuses)}; server RSS before {baseline / mib:.0f} MiB, peak {peak / mib:.0f} MiB "
        f"(+{(peak - baseline) / mib:.0f}), after {after / mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()
