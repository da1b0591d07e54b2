"""``xdevice serve``: a model repository behind the Open Inference Protocol (KServe V2) over HTTP.

Starlette on uvicorn; request bodies are parsed with orjson and numpy (no per-request
schema objects); ONNX Runtime runs in a thread pool, off the event loop. Every bad request
gets a 4xx with ``{"error": "..."}`` and the server keeps serving; stopping it lets the
requests in flight finish.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from xdevice._errors import InferenceError, XDeviceError, message
from xdevice.serving.batcher import Batcher
from xdevice.serving.metrics import Metrics, Registry
from xdevice.serving.protocol import HEADER_LENGTH, BadRequest, InferRequest, decode_request, encode_response
from xdevice.serving.repository import V2_DATATYPES, ModelConfig, ModelNotFound, Repository, triton_config
from xdevice.serving.session import Session

__all__ = ["Server", "ServerProcess", "create_app", "serve"]

MAX_BODY = 64 * 2**20


class ServerNotReady(InferenceError, RuntimeError):
    """A server that did not start listening, or did not become ready."""


@dataclasses.dataclass
class _Loaded:
    name: str
    version: str
    session: Session
    config: ModelConfig
    metrics: Metrics
    batcher: Batcher | None
    instances: concurrent.futures.ThreadPoolExecutor  # one thread per instance: one run at a time each


class _Models:
    """The repository's models as loaded sessions: the newest version of each, warmed up."""

    def __init__(self, repository: Repository, registry: Registry, **session_options: Any):
        self.repository, self.registry = repository, registry
        self.session_options = session_options
        self.loaded: dict[str, _Loaded] = {}
        self.failed: dict[str, str] = {}
        self.lock = threading.Lock()

    def load(self, name: str) -> _Loaded:
        config = self.repository.config(name)
        version = self.repository.latest(name)
        try:
            session = Session(self.repository.path(name, version), device=config.device, **self.session_options)
        except XDeviceError as error:
            self.failed[name] = str(error)
            raise
        metrics = self.registry.of(name, str(version))
        instances = concurrent.futures.ThreadPoolExecutor(config.instance_count, thread_name_prefix=f"xdevice-{name}")
        batcher = None
        if config.dynamic_batching and config.max_batch_size > 0:
            batcher = Batcher(session.run, max_batch_size=config.max_batch_size,
                              max_queue_delay=config.max_queue_delay_us / 1e6, executor=instances,
                              metrics=metrics, instances=config.instance_count,
                              preferred=config.preferred_batch_size)
        model = _Loaded(name, str(version), session, config, metrics, batcher, instances)
        with self.lock:
            self.loaded[name] = model
            self.failed.pop(name, None)
        return model

    def unload(self, name: str) -> _Loaded | None:
        self.repository.config(name)  # an unknown name fails here, with the valid ones
        with self.lock:
            return self.loaded.pop(name, None)

    def get(self, name: str, version: str | None = None) -> _Loaded:
        model = self.loaded.get(name)
        if model is None:
            known = self.repository.models()
            if name in known:
                raise BadRequest(message(f"Model {name!r} is not loaded", received=name,
                                         fix=f"POST /v2/repository/models/{name}/load"), status=400)
            raise BadRequest(message("Unknown model", received=name, choices=known), status=404)
        if version not in (None, "", model.version):
            raise BadRequest(message(f"Model {name!r} has no such version loaded", received=version,
                                     choices=[model.version]), status=404)
        return model


def create_app(repository: str | Path, *, max_body: int = MAX_BODY, threads: int | None = None):
    """The Starlette app serving ``repository`` (Triton's layout); loads every model now."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import Response
    from starlette.routing import Route

    registry = Registry()
    repo = Repository(repository)
    loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xdevice-load")
    models = _Models(repo, registry, **({"threads": threads} if threads else {}))
    for name in repo.models():
        with contextlib.suppress(XDeviceError):  # its reason shows in the repository index
            models.load(name)

    def reply(value: Any = None, status: int = 200) -> Response:
        body = b"" if value is None else orjson.dumps(value)
        return Response(body, status_code=status, media_type="application/json")

    def error(text: str, status: int) -> Response:
        return reply({"error": text}, status)

    def handled(handler):
        async def endpoint(request):
            try:
                return await handler(request, **request.path_params)
            except BadRequest as bad:
                return error(str(bad), bad.status)
            except ModelNotFound as missing:
                return error(str(missing), 404)
            except XDeviceError as failure:
                return error(str(failure), 400)
            except Exception as failure:  # noqa: BLE001 - answer, log nothing secret, keep serving
                return error(f"{type(failure).__name__}: {failure}", 500)
        return endpoint

    async def server_metadata(request):
        from xdevice import __version__

        return reply({"name": "xdevice", "version": __version__,
                      "extensions": ["binary_tensor_data", "model_repository", "statistics"]})

    async def live(request):
        return reply()

    async def ready(request):
        return reply(None, 200 if all(m.session.ready for m in models.loaded.values()) else 503)

    async def model_metadata(request, model, version=None):
        loaded = models.get(model, version)
        return reply({"name": loaded.name, "versions": [loaded.version], "platform": "onnxruntime_onnx",
                      "inputs": [_spec(s) for s in loaded.session.inputs],
                      "outputs": [_spec(s) for s in loaded.session.outputs]})

    async def model_ready(request, model, version=None):
        loaded = models.get(model, version)
        return reply(None, 200 if loaded.session.ready else 503)

    async def model_config(request, model, version=None):
        loaded = models.get(model, version)
        return reply(triton_config(loaded.config, loaded.session.inputs, loaded.session.outputs))

    async def infer(request, model, version=None):
        start = time.perf_counter()
        loaded = models.get(model, version)
        try:
            body = await _read_body(request, max_body)
            parsed = decode_request(body, request.headers.get(HEADER_LENGTH))
            inputs = _check_inputs(loaded, parsed)
            if loaded.batcher is not None:
                outputs = await loaded.batcher.submit(inputs)
            else:
                outputs = await asyncio.get_running_loop().run_in_executor(loaded.instances, _run, loaded, inputs)
            content, headers = encode_response(loaded.name, loaded.version, parsed, outputs)
        except Exception:
            loaded.metrics.request(False, time.perf_counter() - start)
            raise
        loaded.metrics.request(True, time.perf_counter() - start)
        return Response(content, headers=headers)

    async def repository_index(request):
        entries = []
        for name in repo.models():
            for version in repo.versions(name):
                loaded = models.loaded.get(name)
                state = "READY" if loaded and loaded.version == str(version) else "UNAVAILABLE"
                entry = {"name": name, "version": str(version), "state": state}
                if name in models.failed:
                    entry["reason"] = models.failed[name]
                entries.append(entry)
        return reply(entries)

    async def retire(old: _Loaded | None) -> None:
        """Stop a replaced or unloaded model; the runs it already started still finish."""
        if old is not None:
            if old.batcher is not None:
                await old.batcher.close()
            old.instances.shutdown(wait=False)

    async def load(request, model):
        old = models.loaded.get(model)
        await asyncio.get_running_loop().run_in_executor(loader, models.load, model)
        await retire(old)
        return reply()

    async def unload(request, model):
        await retire(models.unload(model))
        return reply()

    async def metrics(request):
        return Response(registry.render(), media_type="text/plain; version=0.0.4")

    async def http_error(request, failure: HTTPException):
        return error(f"{failure.detail}: {request.method} {request.url.path}", failure.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        for loaded in list(models.loaded.values()):
            await retire(loaded)
            loaded.instances.shutdown(wait=True)
        loader.shutdown(wait=True)

    routes = [Route("/v2", handled(server_metadata)), Route("/v2/health/live", handled(live)),
              Route("/v2/health/ready", handled(ready)), Route("/metrics", handled(metrics)),
              Route("/v2/repository/index", handled(repository_index), methods=["POST"]),
              Route("/v2/repository/models/{model}/load", handled(load), methods=["POST"]),
              Route("/v2/repository/models/{model}/unload", handled(unload), methods=["POST"])]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [Route(prefix, handled(model_metadata)), Route(prefix + "/ready", handled(model_ready)),
                   Route(prefix + "/config", handled(model_config)),
                   Route(prefix + "/infer", handled(infer), methods=["POST"])]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.models = models
    return app


def _run(loaded: _Loaded, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    start = time.perf_counter()
    outputs = loaded.session.run(inputs)
    rows = next(iter(inputs.values())).shape[0] if loaded.config.max_batch_size > 0 else 1
    loaded.metrics.executed(rows, time.perf_counter() - start)
    return outputs


def _spec(spec) -> dict:
    shape = [-1 if d is None else d for d in spec.shape]
    return {"name": spec.name, "datatype": V2_DATATYPES[spec.dtype], "shape": shape}


def _check_inputs(loaded: _Loaded, request: InferRequest) -> dict[str, np.ndarray]:
    """The request's inputs checked by the session (names, datatypes, shapes), plus what
    only the server knows: the outputs asked for and the batch limits. Checked per request,
    before batching, so one bad request never fails the batch it would have joined."""
    inputs = loaded.session.check_inputs(request.inputs)
    outputs = [s.name for s in loaded.session.outputs]
    for name, _ in request.outputs or []:
        if name not in outputs:
            raise BadRequest(message(f"Model {loaded.name!r} has no such output", received=name, choices=outputs))
    rows = {value.shape[0] for value in inputs.values() if value.ndim}
    limit = loaded.config.max_batch_size
    if limit > 0 and rows and max(rows) > limit:
        raise BadRequest(message(f"The batch is larger than model {loaded.name!r} allows",
                                 expected=f"at most {limit} rows (max_batch_size)", received=max(rows)))
    if loaded.batcher is not None and len(rows) > 1:
        raise BadRequest(message("Inputs disagree on the batch size", received=sorted(rows)))
    return inputs


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(message("Bad Content-Length", received=declared))
        if int(declared) > limit:
            raise BadRequest(message("The request body is too large", expected=f"at most {limit} bytes",
                                     received=f"{declared} bytes"), status=413)
    body = bytearray()
    async for chunk in request.stream():  # also bounds bodies sent without a Content-Length
        body += chunk
        if len(body) > limit:
            raise BadRequest(message("The request body is too large", expected=f"at most {limit} bytes"),
                             status=413)
    return bytes(body)


class Server:
    """The server on a thread of this process (tests, benchmarks, notebooks).

    >>> with Server("models/") as server:          # doctest: +SKIP
    ...     client = tritonclient.http.InferenceServerClient(server.url)
    """

    def __init__(self, repository: str | Path, host: str = "127.0.0.1", port: int = 0, *,
                 grace: float = 10.0, **options: Any):
        import uvicorn

        self.app = create_app(repository, **options)
        config = uvicorn.Config(self.app, host=host, port=port, log_level="warning",
                                timeout_graceful_shutdown=grace)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="xdevice-serve", daemon=True)
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        """``host:port``, as the standard clients take it."""
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> Server:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ServerNotReady(message("The server did not start", received=self.url,
                                             fix="is the port free? (port=0 picks a free one)"))
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        """Stop accepting; requests in flight finish first (up to ``grace`` seconds)."""
        self.server.should_exit = True
        self.thread.join()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerProcess:
    """``xdevice serve`` as its own process on a free loopback port, as it is deployed
    (examples, benchmarks); entering waits until ``/v2/health/ready`` answers 200.

    >>> with ServerProcess("models/") as server:     # doctest: +SKIP
    ...     client = tritonclient.http.InferenceServerClient(server.url)
    """

    def __init__(self, repository: str | Path, *, threads: int | None = None, timeout: float = 120.0):
        import socket
        import sys

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"127.0.0.1:{self.port}"
        self.command = [sys.executable, "-m", "xdevice", "serve", str(repository), "--port", str(self.port)]
        if threads is not None:
            self.command += ["--threads", str(threads)]
        self.timeout = timeout
        self.process = None

    def __enter__(self) -> ServerProcess:
        import os
        import subprocess
        import urllib.request

        self.process = subprocess.Popen(self.command, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=5) as answer:
                    if answer.status == 200:
                        return self
            except OSError:  # not listening yet, or not ready (503)
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise ServerNotReady(message("xdevice serve did not become ready", received=" ".join(self.command),
                                             fix="run that command by hand to see its error"))
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        """Stop it the way a deployment does (SIGTERM): requests in flight finish first."""
        self.process.terminate()
        self.process.wait(30)


def serve(repository: str | Path, host: str = "127.0.0.1", port: int = 8000, **options: Any) -> None:
    """Serve ``repository`` until interrupted (what ``xdevice serve`` runs)."""
    import uvicorn

    app = create_app(repository, **options)
    print(f"serving {', '.join(app.state.models.loaded) or 'no models'} from {repository} "
          f"on http://{host}:{port} (KServe V2; metrics at /metrics)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=10)
