"""What xdevice costs over the framework it wraps: hot calls and the optimizer update.

1. Hot calls (``--parts hot``), each beside the framework's own call doing the same thing, on
   a small CPU array (so the call, not the copy, is measured): ``to_device`` vs ``Tensor.to`` /
   ``jax.device_put``; ``device_of`` vs ``Tensor.device``; ``backend_of`` vs ``isinstance``;
   entering and leaving ``on("cpu:0")`` vs ``torch.device`` + ``jax.default_device`` entered by
   hand; ``convert`` vs the raw DLPack call (``jax.dlpack.from_dlpack`` / ``torch.from_dlpack``).
2. Optimizer updates (``--parts optimizer``): the update xdevice's trainer makes on the zoo
   mlp's parameters and gradients, torch backend (``update(..., inplace=True)``), against
   ``torch.optim`` ``Adam``, ``AdamW`` and ``SGD(momentum=0.9)`` stepping the same parameters
   with their defaults (on the CPU, torch's for-loop kernel), and ``Adam(foreach=True)``.

3. The server (``--parts server``): ``xdevice serve`` in its own process (serve.py's ``_plain``
   repository of the zoo mlp and cnn: each request runs alone), driven at concurrency 1 by
   clients whose own cost is a few tens of microseconds: ``http.client`` sending a prebuilt
   body (binary tensors, or JSON) and a raw gRPC channel sending a prebuilt serialized
   ``ModelInferRequest``, beside ONNX Runtime's bare ``session.run`` in this process. Each
   request's round trip minus ``session.run`` is the server's overhead plus loopback and the
   raw client; the server's own part is also read from its statistics (``/v2/models/m/stats``:
   the time from the body's arrival to the response's encoding, less the model's run), and
   ``/v2/health/live`` (HTTP) and ``ServerLive`` (gRPC) show the floor of transport and framing.

Each cell is microseconds per call, median (min-max) over ``--samples`` rounds in which the two
sides take turns (``--inner`` calls per round); the ratio is of the medians (with the spread of
the per-round ratios). Every framework runs on ``--threads`` threads. Run:

    .venv/bin/python benchmarks/overhead.py [--parts hot optimizer server] [--samples 15] [--threads 1]
"""

from __future__ import annotations

import argparse
import contextlib
import time

from _timing import THREADS_HELP, cell, interleaved, pin_threads, ratio_cell

TARGETS = {"to_device": 5.0, "device_of": 10.0, "backend_of": 10.0, "on": 10.0, "convert": 1.5, "optimizer": 1.2}
#: the server's overhead over session.run at concurrency 1, milliseconds, per transport
SERVER_TARGETS = {"binary": 0.5, "json": 1.0, "grpc": 0.5}


def hot_calls() -> list[tuple[str, str, dict, str]]:
    """(call, native, the two sides, target key) for every hot call of an installed framework."""
    import numpy as np

    import xdevice

    rows = []
    if "torch" in xdevice.backends():
        import torch

        t = torch.ones(16)
        cpu = torch.device("cpu")
        rows += [
            (
                "to_device(torch, 'cpu')",
                "t.to('cpu')",
                {"xdevice": lambda: xdevice.to_device(t, "cpu"), "native": lambda: t.to("cpu")},
                "to_device",
            ),
            (
                "device_of(torch)",
                "t.device",
                {"xdevice": lambda: xdevice.device_of(t), "native": lambda: t.device},
                "device_of",
            ),
            (
                "backend_of(torch)",
                "isinstance(t, Tensor)",
                {"xdevice": lambda: xdevice.backend_of(t), "native": lambda: isinstance(t, torch.Tensor)},
                "backend_of",
            ),
        ]
    if "jax" in xdevice.backends():
        import jax
        import jax.numpy as jnp

        a = jnp.ones(16)
        first = jax.devices("cpu")[0]
        rows += [
            (
                "to_device(jax, 'cpu')",
                "jax.device_put",
                {"xdevice": lambda: xdevice.to_device(a, "cpu"), "native": lambda: jax.device_put(a, first)},
                "to_device",
            )
        ]
        if "torch" in xdevice.backends():

            def enter_native():
                with torch.device(cpu), jax.default_device(first):
                    pass

            def enter_xdevice():
                with xdevice.on("cpu:0"):
                    pass

            rows.append(
                (
                    "with on('cpu:0')",
                    "torch.device + jax.default_device",
                    {"xdevice": enter_xdevice, "native": enter_native},
                    "on",
                )
            )
            rows.append(
                (
                    "convert(torch, to='jax')",
                    "jax.dlpack.from_dlpack(t)",
                    {"xdevice": lambda: xdevice.convert(t, to="jax"), "native": lambda: jax.dlpack.from_dlpack(t)},
                    "convert",
                )
            )
    x = np.ones(16, np.float32)
    rows.append(
        (
            "backend_of(numpy)",
            "isinstance(x, ndarray)",
            {"xdevice": lambda: xdevice.backend_of(x), "native": lambda: isinstance(x, np.ndarray)},
            "backend_of",
        )
    )
    return rows


def optimizer_rows() -> list[tuple[str, str, dict, str]]:
    """The trainer's update against torch.optim on the zoo mlp's parameters (torch backend)."""
    import torch

    from xdevice import models
    from xdevice.training.optimizers import SGD, Adam, AdamW

    model = models.build("mlp", backend="torch", seed=0)
    ops = model.ops
    rows = []
    for ours, theirs, how in (
        (Adam(lr=1e-3), torch.optim.Adam, ""),
        (AdamW(lr=1e-3), torch.optim.AdamW, ""),
        (SGD(lr=1e-2, momentum=0.9), lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=0.9), ""),
        (Adam(lr=1e-3), lambda ps, lr: torch.optim.Adam(ps, lr=lr, foreach=True), "(foreach=True)"),
    ):
        params = {k: model.params[k].clone() for k in model.trainable}
        grads = {k: torch.randn_like(v) * 1e-3 for k, v in params.items()}
        state = {"value": ours.init(ops, params), "params": params}

        def step_xdevice(ours=ours, grads=grads, state=state):
            state["params"], state["value"] = ours.update(ops, state["params"], grads, state["value"], inplace=True)

        native = [torch.nn.Parameter(v.clone()) for v in params.values()]
        for p, g in zip(native, grads.values()):
            p.grad = g.clone()
        optimizer = theirs(native, lr=ours.lr)
        rows.append(
            (
                f"{type(ours).__name__} update, zoo mlp",
                f"torch.optim.{type(ours).__name__}.step{how}",
                {"xdevice": step_xdevice, "native": optimizer.step},
                "optimizer",
            )
        )
    return rows


class RawClients:
    """Concurrency-1 clients of one server whose own cost is small: ``http.client`` on one
    keep-alive connection and a raw gRPC channel, each sending a body built once."""

    def __init__(self, url: str, grpc_url: str):
        import http.client

        import grpc

        host, port = url.split(":")
        self.http = http.client.HTTPConnection(host, int(port))
        self.channel = grpc.insecure_channel(grpc_url)
        service = "/inference.GRPCInferenceService/"
        self.grpc_infer = self.channel.unary_unary(service + "ModelInfer")  # bytes in, bytes out
        self.grpc_live = self.channel.unary_unary(service + "ServerLive")

    def post(self, path: str, body: bytes, headers: dict) -> bytes:
        self.http.request("POST", path, body, headers)
        answer = self.http.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise SystemExit(f"POST {path}: {answer.status} {data[:300]!r}")
        return data

    def get(self, path: str) -> bytes:
        self.http.request("GET", path)
        answer = self.http.getresponse()
        return answer.read()

    def calls(self, model: str, x, output: str) -> dict:
        """transport -> a call sending one prebuilt batch-1 request for ``model``."""
        import orjson
        from tritonclient.grpc import service_pb2

        path = f"/v2/models/{model}/infer"
        shape = list(x.shape)
        header = orjson.dumps(
            {
                "inputs": [
                    {"name": "input", "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
                ],
                "outputs": [{"name": output, "parameters": {"binary_data": True}}],
            }
        )
        binary = header + x.tobytes()
        binary_headers = {
            "Inference-Header-Content-Length": str(len(header)),
            "Content-Type": "application/octet-stream",
        }
        json_body = orjson.dumps(
            {
                "inputs": [{"name": "input", "shape": shape, "datatype": "FP32", "data": x.reshape(-1).tolist()}],
                "outputs": [{"name": output}],
            }
        )
        json_headers = {"Content-Type": "application/json"}
        request = service_pb2.ModelInferRequest(model_name=model)
        tensor = request.inputs.add(name="input", datatype="FP32", shape=shape)
        del tensor
        request.outputs.add(name=output)
        request.raw_input_contents.append(x.tobytes())
        grpc_body = request.SerializeToString()
        return {
            "binary": lambda: self.post(path, binary, binary_headers),
            "json": lambda: self.post(path, json_body, json_headers),
            "grpc": lambda: self.grpc_infer(grpc_body),
        }

    def floors(self) -> dict:
        """transport -> a call of the cheapest endpoint (liveness): transport and framing alone."""
        live = b""  # an empty ServerLiveRequest
        return {"http live": lambda: self.get("/v2/health/live"), "grpc live": lambda: self.grpc_live(live)}

    def stats(self, model: str) -> tuple[int, int, int]:
        """(successful requests, their ns inside the data plane, ns running the model) so far."""
        import orjson

        found = orjson.loads(self.get(f"/v2/models/{model}/stats"))["model_stats"][0]["inference_stats"]
        return found["success"]["count"], found["success"]["ns"], found["compute_infer"]["ns"]

    def close(self) -> None:
        self.http.close()
        self.channel.close()


def server_overhead(names: list[str], samples: int, inner: int, threads: int) -> None:
    """The server's overhead at concurrency 1 over ``session.run``, per model and transport."""
    import statistics
    import tempfile
    from pathlib import Path

    import onnxruntime
    from serve import build_repository

    from xdevice.serving import ServerProcess

    def p50_ms(call) -> float:
        times = []
        for _ in range(inner):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    with tempfile.TemporaryDirectory(prefix="xdevice-overhead-") as tmp:
        root = Path(tmp)
        inputs = build_repository(root, names)
        raw, outputs = {}, {}
        for name in names:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            session = onnxruntime.InferenceSession(
                str(root / f"{name}_plain" / "1" / "model.onnx"), options, providers=["CPUExecutionProvider"]
            )
            outputs[name] = session.get_outputs()[0].name
            feed = {"input": inputs[name]}
            raw[name] = lambda session=session, feed=feed: session.run(None, feed)
        with ServerProcess(root, threads=threads) as server:
            clients = RawClients(server.url, server.grpc_url)
            try:
                sides = {"floor": clients.floors()}
                for name in names:
                    sides[name] = {
                        "session.run": raw[name],
                        **clients.calls(f"{name}_plain", inputs[name], outputs[name]),
                    }
                for group in sides.values():  # warm up every path
                    for call in group.values():
                        for _ in range(50):
                            call()
                rounds: dict[tuple[str, str], list[float]] = {}
                inside: dict[tuple[str, str], list[float]] = {}
                running: dict[tuple[str, str], list[float]] = {}
                for _ in range(samples):  # every cell once a round, in turn
                    for group_name, group in sides.items():
                        for side, call in group.items():
                            before = clients.stats(f"{group_name}_plain") if side in SERVER_TARGETS else None
                            rounds.setdefault((group_name, side), []).append(p50_ms(call))
                            if before is not None:
                                count, ns, infer = (b - a for a, b in zip(before, clients.stats(f"{group_name}_plain")))
                                inside.setdefault((group_name, side), []).append((ns - infer) / count / 1e6)
                                running.setdefault((group_name, side), []).append(infer / count / 1e6)
            finally:
                clients.close()
    print(
        f"\nserver at concurrency 1: ms, median (min-max) of {samples} rounds of {inner} requests taken in turn; "
        "round trip = p50 of a raw client (http.client, raw gRPC channel, prebuilt bodies); "
        "overhead = round trip - session.run; in data plane = the server's own mean time from the body read to "
        "the response encoded, less the model's run; run in server = the model's run there (mean)"
    )
    print(
        f"{'model':<6} {'transport':<12} {'round trip':>20} {'overhead':>10} {'in data plane':>20} "
        f"{'run in server':>20} {'target':>8}"
    )
    for (group_name, side), times in rounds.items():
        if group_name == "floor":
            print(f"{'-':<6} {side:<12} {_ms_cell(times):>20}")
            continue
        if side == "session.run":
            print(f"{group_name:<6} {side:<12} {_ms_cell(times):>20}")
            continue
        extra = statistics.median(times) - statistics.median(rounds[group_name, "session.run"])
        print(
            f"{group_name:<6} {side:<12} {_ms_cell(times):>20} {extra:>10.3f} "
            f"{_ms_cell(inside[group_name, side]):>20} {_ms_cell(running[group_name, side]):>20} "
            f"{'<=' + format(SERVER_TARGETS[side], 'g'):>8}",
            flush=True,
        )


def _ms_cell(values: list[float]) -> str:
    import statistics

    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["hot", "optimizer"], choices=["hot", "optimizer", "server"])
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument(
        "--inner", type=int, default=0, help="calls per round (default: 2000 hot, 50 optimizer, 300 server)"
    )
    parser.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], help="zoo models the server part serves")
    args = parser.parse_args()
    print(pin_threads(args.threads, frameworks=("torch",)))  # TF left out: on() would enter its scope too
    rows = []
    if "hot" in args.parts:
        rows += [(r, args.inner or 2000) for r in hot_calls()]
    if "optimizer" in args.parts:
        rows += [(r, args.inner or 50) for r in optimizer_rows()]
    if "server" in args.parts:
        server_overhead(args.models, args.samples, args.inner or 300, args.threads)
    if rows:
        print(f"\nus per call, median (min-max) of {args.samples} rounds taken in turn; ratio = xdevice / native")
        print(f"{'call':<28} {'xdevice us':>20} {'native':<34} {'native us':>18} {'ratio':>18} {'target':>7}")
    for (call, native, sides, target), inner in rows:
        with contextlib.suppress(KeyboardInterrupt):
            times = interleaved(sides, samples=args.samples, inner=inner)
        print(
            f"{call:<28} {cell(times['xdevice']):>20} {native:<34} {cell(times['native']):>18} "
            f"{ratio_cell(times['xdevice'], times['native']):>18} {'<=' + format(TARGETS[target], 'g') + 'x':>7}",
            flush=True,
        )


if __name__ == "__main__":
    main()
