"""``xdevice serve`` side by side with its peers, MLServer and KServe, on the same ONNX model,
the same ONNX Runtime threads and the same ``tritonclient`` load.

Each peer serves the zoo model's ``model.onnx`` through its own custom-model class (MLServer's
``MLModel`` with ``parallel_workers: 0``, so inference runs in the server process as in
xdevice; KServe's ``kserve.Model`` started with ``ModelServer``), calling
``onnxruntime.InferenceSession.run`` at ``--threads`` intra-op threads. The peers live in their
own virtual environments, never in the project's (``--mlserver-python``, ``--kserve-python``;
by default ``.peers/<name>``); a peer whose environment is missing, or that does not start, is
reported as such and left out. ``make peers`` sets them up (MLServer 1.7.1, KServe 0.21.0,
each with the ONNX Runtime xdevice runs, 1.31.1).

All servers run at once, each in its own process on loopback; every cell (model, transport,
concurrency) is measured on each server in turn, ``--rounds`` times, so load from elsewhere
on a shared machine falls on all alike; the table shows medians (and the min-max over the
rounds). Transports: ``json`` (``tritonclient.http`` with ``binary_data=False`` both ways),
``binary`` (``binary_data=True``), ``grpc`` (``tritonclient.grpc``). The raw baseline is a bare
``session.run`` at batch 1 in this process, measured in every round too.

Each row also gives the CPU milliseconds per request, server + client, at both concurrencies:
the CPU seconds the server's processes (psutil) and this process (the ``tritonclient``
load and its event loop) used over the measured window, over the requests answered. They say
where a rate comes from when the clock cannot: the client and the servers share this machine's
cores, and one client event loop sends at most 1000 / (client ms) requests a second, whatever
the server (printed under the table with the two-core ceiling, cores x 1000 / (server + client)).
On a shared machine rely on these rather than req/s: contention inflates them less.

One client event loop spends more CPU on a JSON request than xdevice's server does
(``tritonclient`` rebuilds the body with ``json.dumps`` every call), so at concurrency 32 one
client process measures the client. ``--client-processes N`` spreads each cell's coroutines
over N client processes started together (the same for every server), as a load generator
with threads would; their requests/s add up. Run:

    .venv/bin/python benchmarks/peers.py [--models mlp cnn] [--duration 3] [--rounds 3]
        [--concurrency 1 32] [--transports json binary grpc] [--servers xdevice mlserver kserve]
        [--client-processes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
from serve import Clients, load, raw_baseline  # benchmarks/serve.py: the same client load

from xdevice import models
from xdevice.converters import export
from xdevice.serving import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
TRANSPORTS = {"json": "http-json", "binary": "http-binary", "grpc": "grpc"}
SERVERS = ("xdevice", "mlserver", "kserve")

MLSERVER_MODEL = '''
import onnxruntime
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class OnnxModel(MLModel):
    """model.onnx through ONNX Runtime at THREADS threads, run in the server process."""

    async def load(self) -> bool:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        self.session = onnxruntime.InferenceSession(
            self.settings.parameters.uri, options, providers=["CPUExecutionProvider"]
        )
        self.output = self.session.get_outputs()[0].name
        self.ready = True
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        y = self.session.run(None, {payload.inputs[0].name: x})[0]
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.output, y)])
'''

KSERVE_MODEL = '''
import sys

import onnxruntime
from kserve import InferOutput, InferRequest, InferResponse, Model, ModelServer


class OnnxModel(Model):
    """model.onnx through ONNX Runtime at THREADS threads."""

    def __init__(self, name, path):
        super().__init__(name)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
        self.session = onnxruntime.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.output = self.session.get_outputs()[0].name
        self.ready = True

    def predict(self, payload: InferRequest, headers=None) -> InferResponse:
        x = payload.inputs[0].as_numpy()
        y = self.session.run(None, {payload.inputs[0].name: x})[0]
        output = InferOutput(name=self.output, shape=list(y.shape), datatype="FP32")
        output.set_data_from_numpy(y, binary_data=payload.use_binary_outputs)
        return InferResponse(
            response_id=payload.id or "",
            model_name=self.name,
            infer_outputs=[output],
            from_grpc=payload.from_grpc,
            use_binary_outputs=payload.use_binary_outputs,
            requested_outputs=payload.request_outputs,
        )


if __name__ == "__main__":
    folder, names = sys.argv.pop(1), sys.argv.pop(1).split(",")  # the rest are ModelServer's own flags
    ModelServer().start([OnnxModel(name, f"{folder}/{name}/model.onnx") for name in names])
'''


class PeerClients(Clients):
    """serve.py's clients, with two headers on every HTTP request so that all servers get the
    same request: ``Content-Type: application/json`` on JSON bodies (``tritonclient`` sends
    ``application/octet-stream``, which KServe's REST server refuses for a body without
    ``Inference-Header-Content-Length``) and ``Accept-Encoding: identity`` (aiohttp, under
    ``tritonclient.http.aio``, offers ``gzip, deflate, br`` by default; servers that honour it,
    xdevice and MLServer, would otherwise be timed compressing every response)."""

    def call(self, transport: str, model: str, x: np.ndarray, output: str):
        if transport == "grpc":
            return super().call(transport, model, x, output)
        from tritonclient.http import InferInput, InferRequestedOutput

        binary = transport == "http-binary"
        request = InferInput("input", list(x.shape), "FP32")
        request.set_data_from_numpy(x, binary_data=binary)
        wanted = [InferRequestedOutput(output, binary_data=binary)]
        headers = {"Accept-Encoding": "identity"}
        if not binary:
            headers["Content-Type"] = "application/json"
        return lambda: self.http.infer(model, [request], outputs=wanted, headers=dict(headers))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Peer:
    """A peer server in its own process, from its own virtual environment: ``url`` (HTTP) and
    ``grpc_url`` once started; ``problem`` says why it could not run (then it is left out)."""

    def __init__(self, name: str, python: str, folder: Path, names: list[str], threads: int):
        self.name, self.python, self.folder, self.names, self.threads = name, python, folder, names, threads
        self.port, self.grpc_port = free_port(), free_port()
        self.url, self.grpc_url = f"127.0.0.1:{self.port}", f"127.0.0.1:{self.grpc_port}"
        self.process: subprocess.Popen | None = None
        self.problem = "" if Path(python).exists() else f"no interpreter at {python}"
        self.log = folder / "server.log"

    def _command(self) -> list[str]:
        """Writes the peer's model class (and MLServer's settings) into its folder; returns
        the command that serves every model."""
        threads = f"THREADS = {self.threads}\n"
        if self.name == "kserve":
            (self.folder / "kserve_model.py").write_text(threads + textwrap.dedent(KSERVE_MODEL))
            return [
                self.python,
                str(self.folder / "kserve_model.py"),
                str(self.folder),
                ",".join(self.names),
                f"--http_port={self.port}",
                f"--grpc_port={self.grpc_port}",
                "--workers=1",
            ]
        (self.folder / "models.py").write_text(threads + textwrap.dedent(MLSERVER_MODEL))
        settings = {
            "http_port": self.port,
            "grpc_port": self.grpc_port,
            "metrics_port": free_port(),
            "parallel_workers": 0,
            "gzip_enabled": False,
            "host": "127.0.0.1",
        }
        (self.folder / "settings.json").write_text(json.dumps(settings))
        for model in self.names:
            model_settings = {
                "name": model,
                "implementation": "models.OnnxModel",
                "parallel_workers": 0,
                "parameters": {"uri": str(self.folder / model / "model.onnx")},
            }
            (self.folder / model / "model-settings.json").write_text(json.dumps(model_settings))
        return [str(Path(self.python).parent / "mlserver"), "start", str(self.folder)]

    def start(self, timeout: float = 120.0) -> bool:
        if self.problem:
            return False
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "PYTHONPATH": str(self.folder)}
        env["MLSERVER_PARALLEL_WORKERS"] = "0"
        env.pop("VIRTUAL_ENV", None)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self._command(), cwd=self.folder, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            if all(_ready(f"http://{self.url}/v2/models/{m}/ready") for m in self.names):
                return True
            time.sleep(0.3)
        self.stop()
        tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
        self.problem = f"did not become ready ({' | '.join(tail)[:300]})"
        return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def build(root: Path, names: list[str], servers: list[str], instances: int) -> tuple[dict, dict, dict]:
    """Each zoo model exported once to ONNX and laid out for every server: xdevice's
    repository ``root/xdevice/<model>/1/model.onnx`` (``instances`` instances, no batching), and
    ``root/<peer>/<model>/model.onnx``. Returns each model's batch-1 input, ORT's own output
    for it, and the output's name."""
    import onnxruntime

    inputs, expected, outputs = {}, {}, {}
    for name in names:
        model = models.build(name, seed=0, backend="torch")
        folder = root / "xdevice" / name
        (folder / "1").mkdir(parents=True)
        path = folder / "1" / "model.onnx"
        export(model, path)
        if instances > 1:
            (folder / "config.pbtxt").write_text(f"instance_group [{{ count: {instances} kind: KIND_CPU }}]\n")
        for peer in servers:
            if peer != "xdevice":
                (root / peer / name).mkdir(parents=True)
                (root / peer / name / "model.onnx").write_bytes(path.read_bytes())
        inputs[name] = model.example_input(1, seed=0)
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        outputs[name] = session.get_outputs()[0].name
        expected[name] = session.run(None, {"input": inputs[name]})[0]
    return inputs, expected, outputs


async def measure(url: str, grpc_url: str, pid: int, model: str, x, expected, output, args) -> dict:
    """One server's cells for ``model`` (the server's process is ``pid``): {(transport,
    concurrency): load's cell}; a transport whose answer differs from ORT's, or fails, gives a
    cell with ``problem``."""
    clients = PeerClients(url, grpc_url, max(args.concurrency) + 4)
    cells = {}
    try:
        for transport in args.transports:
            try:
                answer = await clients.call(TRANSPORTS[transport], model, x, output)()
                diff = float(np.max(np.abs(answer.as_numpy(output) - expected)))
                problem = f"output differs from ORT's by {diff:.1e}" if diff > 1e-4 else ""
            except Exception as error:  # noqa: BLE001 - a peer that cannot speak a transport is reported
                problem = f"{type(error).__name__}: {str(error).splitlines()[0][:150]}"
            for concurrency in args.concurrency:
                if problem:
                    cells[transport, concurrency] = {"problem": problem}
                    continue
                cells[transport, concurrency] = await spread_load(
                    clients, url, grpc_url, pid, transport, model, x, output, concurrency, args
                )
    finally:
        await clients.close()
    return cells


async def spread_load(clients, url, grpc_url, pid, transport, model, x, output, concurrency, args) -> dict:
    """``load`` at ``concurrency`` spread over ``--client-processes`` client processes (this one
    and the rest started for the cell, all starting at the same moment), as one cell: requests/s
    summed, client CPU per request over every client's requests, the server's CPU over the
    requests of all (this process's window, which the others' windows cover)."""
    share = min(args.client_processes, concurrency)
    call = clients.call(TRANSPORTS[transport], model, x, output)
    if share == 1:
        return await load([call], output, concurrency, args.duration, args.warmup, server_pid=pid)
    start_at = time.time() + 3.0  # time for the other clients to import tritonclient and connect
    with tempfile.TemporaryDirectory(prefix="xdevice-peers-client-") as folder:
        np.save(Path(folder) / "x.npy", x)
        others = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--client",
                    json.dumps(
                        {
                            "url": url,
                            "grpc_url": grpc_url,
                            "transport": transport,
                            "model": model,
                            "output": output,
                            "x": str(Path(folder) / "x.npy"),
                            "concurrency": n,
                            "duration": args.duration,
                            "warmup": args.warmup,
                            "start_at": start_at,
                        }
                    ),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for n in _split(concurrency, share)[1:]
        ]
        await asyncio.sleep(max(0.0, start_at - time.time()))
        mine = await load([call], output, _split(concurrency, share)[0], args.duration, args.warmup, server_pid=pid)
        theirs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in others]
    cells = [mine, *theirs]
    rps = sum(c["rps"] for c in cells)
    return {
        "rps": rps,
        "p50": statistics.median(c["p50"] for c in cells),
        "p99": max(c["p99"] for c in cells),
        "errors": sum(c["errors"] for c in cells),
        "first_error": next((c["first_error"] for c in cells if c["first_error"]), ""),
        "client_cpu_ms": sum(c["client_cpu_ms"] * c["rps"] for c in cells) / max(rps, 1e-9),
        "server_cpu_ms": mine["server_cpu_ms"] * mine["rps"] / max(rps, 1e-9),
    }


def _split(concurrency: int, processes: int) -> list[int]:
    """``concurrency`` coroutines over ``processes`` clients, as evenly as they go."""
    return [concurrency // processes + (i < concurrency % processes) for i in range(processes)]


def client_process(spec: dict) -> None:
    """One of ``spread_load``'s other clients: the same tritonclient load from its own event
    loop, starting at ``start_at``; prints its cell as JSON."""

    async def run() -> dict:
        clients = PeerClients(spec["url"], spec["grpc_url"], spec["concurrency"] + 4)
        try:
            x = np.load(spec["x"])
            call = clients.call(TRANSPORTS[spec["transport"]], spec["model"], x, spec["output"])
            await call()  # connected before the start
            await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
            return await load([call], spec["output"], spec["concurrency"], spec["duration"], spec["warmup"])
        finally:
            await clients.close()

    print(json.dumps(asyncio.run(run())), flush=True)


def loadavg() -> str:
    return " ".join(f"{load:.2f}" for load in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=0.5, help="unmeasured seconds before each cell")
    parser.add_argument("--rounds", type=int, default=3, help="times each cell is measured on each server")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 32])
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=list(TRANSPORTS))
    parser.add_argument("--servers", nargs="+", default=list(SERVERS), choices=SERVERS)
    parser.add_argument("--threads", type=int, default=1, help="ORT intra-op threads, every server and raw")
    parser.add_argument("--instances", type=int, default=1, help="xdevice model instances (peers: one session)")
    parser.add_argument(
        "--client-processes",
        type=int,
        default=1,
        help="client processes sharing each cell's coroutines (one event loop each; the same for every server)",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)  # one of the other client processes
    parser.add_argument("--mlserver-python", default=str(ROOT / ".peers" / "mlserver" / "bin" / "python"))
    parser.add_argument("--kserve-python", default=str(ROOT / ".peers" / "kserve" / "bin" / "python"))
    args = parser.parse_args()
    if args.client:
        client_process(json.loads(args.client))
        return
    low, high = min(args.concurrency), max(args.concurrency)
    print(
        f"loopback; tritonclient aio load, batch-1 requests; ORT {args.threads} thread(s) everywhere; "
        f"{args.warmup:g} s warm-up + {args.duration:g} s per cell, {args.rounds} rounds with the servers "
        f"taking turns; {args.client_processes} client process(es) at c={high}; load average at start "
        f"{loadavg()} on {os.cpu_count()} CPUs",
        flush=True,
    )
    results: dict = {}  # (server, model, transport, concurrency) -> [cells]
    raw: dict = {name: [] for name in args.models}
    problems: dict = {}
    with tempfile.TemporaryDirectory(prefix="xdevice-peers-") as tmp:
        root = Path(tmp)
        inputs, expected, outputs = build(root, args.models, args.servers, args.instances)
        peers = {
            name: Peer(name, getattr(args, f"{name}_python"), root / name, args.models, args.threads)
            for name in args.servers
            if name != "xdevice"
        }
        xdevice = ServerProcess(root / "xdevice", threads=args.threads) if "xdevice" in args.servers else None
        try:
            if xdevice is not None:
                xdevice.__enter__()
            for peer in peers.values():
                if not peer.start():
                    problems[peer.name] = peer.problem
            running = {}
            if xdevice is not None and xdevice.process is not None:
                running["xdevice"] = (xdevice.url, xdevice.grpc_url, xdevice.process.pid)
            for peer in peers.values():
                if peer.name not in problems and peer.process is not None:
                    running[peer.name] = (peer.url, peer.grpc_url, peer.process.pid)
            for name in args.models:
                model = root / "xdevice" / name / "1" / "model.onnx"
                for round_ in range(args.rounds):
                    raw[name].append(raw_baseline(model, inputs[name], args.threads, args.duration))
                    order = list(running) if round_ % 2 == 0 else list(reversed(running))
                    for server in order:
                        cells = asyncio.run(
                            measure(
                                *running[server],
                                name,
                                inputs[name],
                                expected[name],
                                outputs[name],
                                args,
                            )
                        )
                        for (transport, concurrency), cell in cells.items():
                            results.setdefault((server, name, transport, concurrency), []).append(cell)
                    print(f"  {name}: round {round_ + 1}/{args.rounds} done, load average {loadavg()}", flush=True)
        finally:
            for peer in peers.values():
                peer.stop()
            if xdevice is not None:
                xdevice.__exit__()
    report(results, raw, problems, args, low, high)


def _median(cells: list, key: str) -> tuple[float, str]:
    values = [c[key] for c in cells if "problem" not in c]
    if not values:
        return float("nan"), next(c["problem"] for c in cells)
    return statistics.median(
        values
    ), f"{min(values):.0f}-{max(values):.0f}" if key == "rps" else f"{min(values):.2f}-{max(values):.2f}"


def _cpu_medians(cells: list) -> tuple[float, float] | None:
    """A cell's server and client CPU milliseconds per request (medians of the rounds)."""
    cells = [c for c in cells if "problem" not in c]
    if not cells:
        return None
    srv, cli = (statistics.median(c[k] for c in cells) for k in ("server_cpu_ms", "client_cpu_ms"))
    return srv, cli


def _cpu(cells: list) -> str:
    """A cell's ``server + client`` CPU milliseconds per request."""
    medians = _cpu_medians(cells)
    return "-" if medians is None else f"{medians[0]:.2f} + {medians[1]:.2f}"


def report(results: dict, raw: dict, problems: dict, args, low: int, high: int) -> None:
    servers = [s for s in args.servers if any(k[0] == s for k in results)]
    print(f"\nload average at the end {loadavg()}")
    for peer, problem in problems.items():
        print(f"{peer}: left out, {problem}")
    for name in args.models:
        p50s = [r[0] for r in raw[name]]
        rates = [r[2] for r in raw[name]]
        print(
            f"\n{name}: raw session.run batch 1, p50 {statistics.median(p50s):.3f} ms, "
            f"{statistics.median(rates):.0f} runs/s (median of {len(rates)})"
        )
        head = f"{'server':<9} {'transport':<9} {f'c={low} p50 ms':>20} {'overhead':>9} {f'c={high} req/s':>18}"
        print(f"{head}  {f'CPU ms/req c={low}':>17}  {f'c={high}':>11}  errors")
        for transport in args.transports:
            for server in servers:
                cells_low = results.get((server, name, transport, low), [])
                cells_high = results.get((server, name, transport, high), [])
                p50, spread50 = _median(cells_low, "p50")
                rps, spread_rps = _median(cells_high, "rps")
                if np.isnan(p50) and np.isnan(rps):
                    print(f"{server:<9} {transport:<9} n/a: {spread50}")
                    continue
                errors = sum(c.get("errors", 0) for c in cells_low + cells_high)
                overhead = p50 - statistics.median(p50s)
                print(
                    f"{server:<9} {transport:<9} {p50:>7.2f} ({spread50:>11}) {overhead:>+8.2f} "
                    f"{rps:>7.0f} ({spread_rps:>9})  {_cpu(cells_low):>17}  {_cpu(cells_high):>11}  {errors}"
                )
        print(
            f"CPU ms/req: server + client (the client processes: tritonclient and its event loop) CPU seconds "
            f"over the measured window / requests (medians of the rounds). At c={high} the clients cap the "
            f"rate at {min(args.client_processes, high)}000/client req/s (one event loop per client process), "
            f"and both at {os.cpu_count()}000/(server + client) "
            f"on {os.cpu_count()} CPUs:"
        )
        for transport in args.transports:
            caps = []
            for server in servers:
                medians = _cpu_medians(results.get((server, name, transport, high), []))
                if medians is not None:
                    srv, cli = medians
                    clients = min(args.client_processes, high)
                    caps.append(f"{server} {clients * 1000 / cli:.0f} / {os.cpu_count() * 1000 / (srv + cli):.0f}")
            print(f"  {transport:<7} req/s at most (client / both): " + "; ".join(caps))
        print(f"xdevice / peer at c={high} (req/s, ratio of medians); at c={low} (p50, peer / xdevice):")
        for transport in args.transports:
            mine_rps = _median(results.get(("xdevice", name, transport, high), [{"problem": "-"}]), "rps")[0]
            mine_p50 = _median(results.get(("xdevice", name, transport, low), [{"problem": "-"}]), "p50")[0]
            parts = []
            for peer in servers:
                if peer == "xdevice":
                    continue
                rps = _median(results.get((peer, name, transport, high), [{"problem": "-"}]), "rps")[0]
                p50 = _median(results.get((peer, name, transport, low), [{"problem": "-"}]), "p50")[0]
                if rps != rps or p50 != p50:  # NaN: the peer could not serve this transport
                    parts.append(f"{peer} n/a")
                else:
                    parts.append(f"{peer} {mine_rps / rps:.2f}x req/s, {p50 / mine_p50:.2f}x p50")
            print(f"  {transport:<7} " + "; ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
