"""The server under load from the standard clients: throughput, latency and errors, batched against
plain, over HTTP (JSON and binary tensors) and gRPC.

For each zoo model: a repository in a temporary folder with the same ONNX model twice,
``<model>_batched`` (``max_batch_size: 64``, dynamic batching with a 0.5 ms queue delay) and
``<model>_plain`` (``max_batch_size: 64``, each request runs alone); both have two instances
(one per core here), each running one execution at a time, as in Triton. The server is
``xdevice serve`` in its own process on loopback, as it is deployed; ``tritonclient.http.aio``
(JSON or binary tensors) and ``tritonclient.grpc.aio`` in this process send batch-1 requests
from N coroutines, each looping for ``--duration`` seconds, at concurrency 1 and 32. The raw
baseline is ``onnxruntime.InferenceSession.run`` at batch 1 in a loop, in the same run and
with the same ORT threads; it also runs at batch 32, and the ratio of rows/s at batch 32 to
rows/s at batch 1 is the most batching can save in compute (the rest it saves is per-request
dispatch). Prints requests/s, p50 and p99 latency, errors, the CPU milliseconds per request
of the server's process and of this one (the client), and the mean requests a model run held
(from the statistics extension: above 1 where requests were merged, 1 where the batcher
stepped aside or the model does not batch) per cell (``--rounds`` times, batched and plain
interleaved), then the batching speed-up at the highest concurrency (median of the
rounds' batched / plain requests/s, with min-max), the server
overhead at concurrency 1 (server p50 - raw p50) and the total errors. ``--soak SECONDS``
also runs ``cnn_batched`` at the highest concurrency that long, half the coroutines on HTTP
and half on gRPC, and reports the server process's resident memory over the second half. Run:

    .venv/bin/python benchmarks/serve.py [--models mlp cnn] [--duration 8] [--concurrency 1 32]
                                         [--transports http-json http-binary grpc] [--threads 1] [--soak 60]
                                         [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from xdevice import models
from xdevice.converters import export
from xdevice.serving import ServerProcess

MAX_BATCH = 64
DELAY_US = 500
INSTANCES = "instance_group [{ count: 2 kind: KIND_CPU }]\n"
CONFIGS = {
    "batched": f"max_batch_size: {MAX_BATCH}\ndynamic_batching {{ max_queue_delay_microseconds: {DELAY_US} }}\n"
    + INSTANCES,
    "plain": f"max_batch_size: {MAX_BATCH}\n" + INSTANCES,
}


def rss_mib(pid: int) -> float:
    """The resident memory of process ``pid`` (the server), in MiB."""
    import psutil

    return psutil.Process(pid).memory_info().rss / 2**20


def build_repository(root: Path, names: list[str]) -> dict[str, np.ndarray]:
    """``<name>_batched`` and ``<name>_plain`` for each zoo model; returns each model's batch-1 input."""
    inputs = {}
    for name in names:
        model = models.build(name, seed=0, backend="torch")
        onnx_bytes = None
        for kind, config in CONFIGS.items():
            folder = root / f"{name}_{kind}"
            (folder / "1").mkdir(parents=True)
            if onnx_bytes is None:
                export(model, folder / "1" / "model.onnx")
                onnx_bytes = (folder / "1" / "model.onnx").read_bytes()
            else:
                (folder / "1" / "model.onnx").write_bytes(onnx_bytes)
            (folder / "config.pbtxt").write_text(config)
        inputs[name] = model.example_input(1, seed=0)
    return inputs


def raw_baseline(path: Path, x: np.ndarray, threads: int, duration: float) -> tuple[float, float, float]:
    """ORT's ``session.run`` on ``x`` in a loop: (p50 ms, p99 ms, runs/s)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {"input": x}
    for _ in range(20):
        session.run(None, feed)
    times = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        t = time.perf_counter()
        session.run(None, feed)
        times.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - start
    p50, p99 = np.percentile(times, [50, 99])
    return float(p50), float(p99), len(times) / elapsed


TRANSPORTS = ("http-json", "http-binary", "grpc")


class Clients:
    """One aio client per protocol (tritonclient.http.aio, tritonclient.grpc.aio), made when
    first used (gRPC's client keeps a polling thread that would load the HTTP cells), and the
    request each transport sends."""

    def __init__(self, url: str, grpc_url: str, connections: int):
        from tritonclient.http.aio import InferenceServerClient as HttpClient

        self.http, self.grpc_url, self._grpc = HttpClient(url, conn_limit=connections), grpc_url, None

    @property
    def grpc(self):
        if self._grpc is None:
            from tritonclient.grpc.aio import InferenceServerClient as GrpcClient

            self._grpc = GrpcClient(self.grpc_url)
        return self._grpc

    def call(self, transport: str, model: str, x: np.ndarray, output: str):
        """A coroutine factory for one request on ``transport``."""
        if transport == "grpc":
            from tritonclient.grpc import InferInput, InferRequestedOutput

            request = InferInput("input", list(x.shape), "FP32")
            request.set_data_from_numpy(x)
            wanted, client = [InferRequestedOutput(output)], self.grpc
        else:
            from tritonclient.http import InferInput, InferRequestedOutput

            binary = transport == "http-binary"
            request = InferInput("input", list(x.shape), "FP32")
            request.set_data_from_numpy(x, binary_data=binary)
            wanted, client = [InferRequestedOutput(output, binary_data=binary)], self.http
        return lambda: client.infer(model, [request], outputs=wanted)

    async def runs(self, model: str) -> tuple[int, int]:
        """(requests, runs) the model has served so far, from the statistics extension."""
        stats = (await self.http.get_inference_statistics(model))["model_stats"][0]
        sizes = {entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats.get("batch_stats", [])}
        return sum(size * count for size, count in sizes.items()), sum(sizes.values())

    async def close(self) -> None:
        await self.http.close()
        if self._grpc is not None:
            await self._grpc.close()


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (a server's workers)."""
    import psutil

    root = psutil.Process(pid)
    return [root.pid, *(child.pid for child in root.children(recursive=True))]


def cpu_seconds(pids: list[int]) -> float:
    """CPU seconds (user + system, every thread) the processes ``pids`` have used so far."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:  # a worker that ended: its time is lost, as it is from ps
            continue
        total += times.user + times.system
    return total


def own_cpu_seconds() -> float:
    """CPU seconds (user + system, every thread) this process has used so far."""
    times = os.times()
    return times.user + times.system


async def load(
    calls: list, output: str, concurrency: int, duration: float, warmup: float, server_pid: int | None = None
) -> dict:
    """``concurrency`` coroutines (taking the ``calls`` in turn) sending batch-1 requests for
    ``warmup + duration`` seconds.

    Requests that start in the warm-up are not counted; the measured window runs from the end
    of the warm-up until the last request in flight returns. Over that window, the CPU time
    of this process (the client: ``client_cpu_ms`` per counted request) and, given
    ``server_pid``, of the server's processes (``server_cpu_ms``) says where the time of a
    request goes: on a machine with few cores the client's share bounds the request rate as
    much as the server's does.
    """
    latencies: list[float] = []
    errors: list[str] = []
    server = process_tree(server_pid) if server_pid is not None else []
    begin = time.perf_counter()
    measure, end = begin + warmup, begin + warmup + duration
    start_cpu: list[float] = []

    async def mark() -> None:  # the CPU clocks at the end of the warm-up
        await asyncio.sleep(max(0.0, measure - time.perf_counter()))
        start_cpu.extend((own_cpu_seconds(), cpu_seconds(server)))

    async def worker(call):
        while (now := time.perf_counter()) < end:
            try:
                result = await call()
                ok = result.as_numpy(output) is not None
                failure = None if ok else "no output"
            except Exception as error:  # noqa: BLE001 - count every failure, keep loading
                failure = f"{type(error).__name__}: {error}"
            if now >= measure:
                if failure is None:
                    latencies.append((time.perf_counter() - now) * 1000)
                else:
                    errors.append(failure)

    await asyncio.gather(mark(), *(worker(calls[i % len(calls)]) for i in range(concurrency)))
    elapsed = time.perf_counter() - measure
    client_cpu, server_cpu = own_cpu_seconds() - start_cpu[0], cpu_seconds(server) - start_cpu[1]
    p50, p99 = np.percentile(latencies, [50, 99]) if latencies else (float("nan"),) * 2
    counted = max(len(latencies), 1)
    return {
        "rps": len(latencies) / elapsed,
        "p50": float(p50),
        "p99": float(p99),
        "errors": len(errors),
        "first_error": errors[0] if errors else "",
        "client_cpu_ms": client_cpu * 1000 / counted,
        "server_cpu_ms": server_cpu * 1000 / counted if server else float("nan"),
    }


async def check(
    clients: Clients, transport: str, model: str, x: np.ndarray, output: str, expected: np.ndarray
) -> float:
    """The max abs difference between the server's answer and ORT's own."""
    result = await clients.call(transport, model, x, output)()
    return float(np.max(np.abs(result.as_numpy(output) - expected)))


async def soak(clients: Clients, pid: int, x: np.ndarray, output: str, concurrency: int, seconds: float) -> None:
    samples: list[tuple[float, float]] = []
    stop = threading.Event()
    start = time.perf_counter()

    def sample():  # a thread, so the once-a-second samples do not wait on a busy event loop
        while not stop.is_set():
            samples.append((time.perf_counter() - start, rss_mib(pid)))
            stop.wait(1.0)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    calls = [clients.call("http-binary", "cnn_batched", x, output), clients.call("grpc", "cnn_batched", x, output)]
    cell = await load(calls, output, concurrency, seconds, 0.0)
    stop.set()
    sampler.join()
    samples.append((time.perf_counter() - start, rss_mib(pid)))
    half = [(t, r) for t, r in samples if t >= seconds / 2]
    first, last = half[0], half[-1]
    print(
        f"\nsoak: cnn_batched, concurrency {concurrency} (half HTTP binary, half gRPC), {seconds:.0f} s, "
        f"{cell['rps']:.0f} req/s, p99 {cell['p99']:.2f} ms, {cell['errors']} errors; RSS sampled once a second "
        f"({len(samples)} samples)"
    )
    print(f"  RSS at start {samples[0][1]:.1f} MiB, peak {max(r for _, r in samples):.1f} MiB")
    print(
        f"  second half: {first[1]:.1f} MiB at {first[0]:.0f} s -> {last[1]:.1f} MiB at {last[0]:.0f} s, "
        f"change {last[1] - first[1]:+.1f} MiB"
    )
    if cell["errors"]:
        print(f"  first error: {cell['first_error']}")


async def drive(
    url: str, grpc_url: str, pid: int, names: list[str], inputs: dict, expected: dict, outputs: dict, args
) -> dict:
    clients = Clients(url, grpc_url, max(args.concurrency) + 4)
    try:
        cells = {}
        for transport in args.transports:  # HTTP first: the gRPC client starts with the gRPC cells
            for name in names:
                for kind in CONFIGS:
                    diff = await check(
                        clients, transport, f"{name}_{kind}", inputs[name], outputs[name], expected[name]
                    )
                    if diff > 1e-4:
                        raise SystemExit(
                            f"{name}_{kind} over {transport}: the server's output differs from ORT's by {diff:.2e}"
                        )
            for name in names:
                for concurrency in args.concurrency:
                    for _ in range(args.rounds):  # batched, plain, batched, plain ...: the same load on both
                        for kind in CONFIGS:
                            model = f"{name}_{kind}"
                            before = await clients.runs(model)
                            cell = await load(
                                [clients.call(transport, model, inputs[name], outputs[name])],
                                outputs[name],
                                concurrency,
                                args.duration,
                                args.warmup,
                                server_pid=pid,
                            )
                            after = await clients.runs(model)
                            cell["batch"] = (after[0] - before[0]) / max(after[1] - before[1], 1)
                            cells.setdefault((name, kind, transport, concurrency), []).append(cell)
                            print(
                                f"{model:<13} {transport:<12} {concurrency:>5} {cell['rps']:>9.0f} "
                                f"{cell['p50']:>8.2f} {cell['p99']:>8.2f} {cell['errors']:>7} "
                                f"{cell['server_cpu_ms']:>9.2f} {cell['client_cpu_ms']:>9.2f} {cell['batch']:>6.1f}",
                                flush=True,
                            )
                            if cell["errors"]:
                                print(f"  first error: {cell['first_error']}", flush=True)
        if args.soak > 0:
            await soak(clients, pid, inputs["cnn"], outputs["cnn"], max(args.concurrency), args.soak)
        return cells
    finally:
        await clients.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--duration", type=float, default=8.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each cell")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--rounds", type=int, default=1, help="batched/plain pairs per cell, interleaved")
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads, server and raw alike")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of cnn_batched under load; 0 skips")
    args = parser.parse_args()
    import onnxruntime

    low, high = min(args.concurrency), max(args.concurrency)
    with tempfile.TemporaryDirectory(prefix="xdevice-serve-bench-") as tmp:
        root = Path(tmp)
        names = list(dict.fromkeys(args.models + (["cnn"] if args.soak > 0 else [])))
        inputs = build_repository(root, names)
        expected, outputs, raw, economy = {}, {}, {}, {}
        for name in names:
            path = root / f"{name}_plain" / "1" / "model.onnx"
            session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            outputs[name] = session.get_outputs()[0].name
            expected[name] = session.run(None, {"input": inputs[name]})[0]
        print(
            f"loopback, tritonclient.http.aio (JSON or binary tensors) and tritonclient.grpc.aio, batch-1 "
            f"requests; server = xdevice serve in its own process with ORT threads={args.threads}; "
            f"{args.warmup:g} s warm-up + {args.duration:g} s per cell; batched = dynamic batching, "
            f"max_batch_size {MAX_BATCH}, max_queue_delay {DELAY_US} us; plain = each request alone"
        )
        print(
            f"{'model':<13} {'transport':<12} {'conc':>5} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7} "
            f"{'server CPU':>9} {'client CPU':>9} (ms per request) {'batch':>6}"
        )
        for name in args.models:
            raw[name] = raw_baseline(
                root / f"{name}_plain" / "1" / "model.onnx", inputs[name], args.threads, args.duration
            )
            p50, p99, rate = raw[name]
            print(
                f"{name + '_raw':<13} {'-':<12} {'-':>5} {rate:>9.0f} {p50:>8.3f} {p99:>8.3f} {'-':>7}  "
                f"(onnxruntime session.run, batch 1)",
                flush=True,
            )
            x32 = np.repeat(inputs[name], 32, axis=0)
            economy[name] = (
                raw_baseline(root / f"{name}_plain" / "1" / "model.onnx", x32, args.threads, args.duration / 2)[2]
                * 32
                / rate
            )
        with ServerProcess(root, threads=args.threads) as server:
            cells = asyncio.run(
                drive(server.url, server.grpc_url, server.process.pid, args.models, inputs, expected, outputs, args)
            )

    print(
        f"\nbatching speed-up at concurrency {high} (batched req/s / plain req/s; targets: never below 1x, "
        f">= 1.4x on the mlp):"
    )
    for name in args.models:
        for transport in args.transports:
            batched, plain = cells[name, "batched", transport, high], cells[name, "plain", transport, high]
            ratios = [b["rps"] / p["rps"] for b, p in zip(batched, plain)]
            spread = f", {min(ratios):.2f}x-{max(ratios):.2f}x over {len(ratios)} rounds" if len(ratios) > 1 else ""
            print(
                f"  {name:<5} {transport:<12} {statistics.median(ratios):.2f}x  "
                f"({median(batched, 'rps'):.0f} / {median(plain, 'rps'):.0f}{spread})"
            )
    print("compute saved by batching in ORT itself (rows/s at batch 32 / rows/s at batch 1):")
    for name in args.models:
        print(f"  {name:<5} {economy[name]:.2f}x")
    print(f"server overhead at concurrency {low} (server p50 - raw session.run p50; target < 1 ms):")
    for name in args.models:
        raw_p50 = raw[name][0]
        for transport in args.transports:
            plain, batched = cells[name, "plain", transport, low], cells[name, "batched", transport, low]
            print(
                f"  {name:<5} {transport:<12} plain {median(plain, 'p50') - raw_p50:+.2f} ms  "
                f"(batched {median(batched, 'p50') - raw_p50:+.2f} ms: the queue delay too, unless the "
                f"batcher stepped aside)"
            )
    total = sum(cell["errors"] for runs in cells.values() for cell in runs)
    print(
        f"total errors: {total} (target 0); median req/s over cells: "
        f"{statistics.median(median(runs, 'rps') for runs in cells.values()):.0f}"
    )


def median(runs: list[dict], key: str) -> float:
    """The median of ``key`` over the rounds of one cell."""
    return statistics.median(run[key] for run in runs)


if __name__ == "__main__":
    main()
