"""``xdevice serve``: a model repository behind the Open Inference Protocol (KServe V2), over
HTTP and gRPC.

Starlette on uvicorn for HTTP (bodies parsed with orjson and numpy, no per-request schema
objects), ``grpc.aio`` for gRPC on the same event loop, both over one :class:`Models`; ONNX
Runtime runs in a thread pool, off the event loop. Every bad request gets a 4xx with
``{"error": "..."}`` (or its gRPC status) and the server keeps serving; stopping it lets the
requests in flight finish.

It fails loud, as Triton does: a model that fails to load, or an ``.onnx`` file lying at the
repository's root outside a model folder, is named with its reason and, by default
(``exit_on_error``), stops start-up with one line for each; otherwise each is logged on one
line, the repository index carries every model's reason, and with ``strict_readiness`` (the
default) ``/v2/health/ready`` answers 200 only when every model of the repository is ready.
A server with no model loaded (an empty repository) is never ready: it says so in the log at
start-up and in the ready body, ``{"ready": false, "error": "..."}``. ``repository`` may be
one ``.onnx`` file, served as a one-model repository named after its stem.

A client that opens a connection and does not finish its request headers within
``header_timeout`` seconds is disconnected (a slow-loris client would otherwise hold a
connection open indefinitely).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from xdevice._errors import ConfigurationError, InferenceError, XDeviceError, message
from xdevice.serving.metrics import Registry
from xdevice.serving.models import Models, load_model, model_info, retire, server_info, statistics
from xdevice.serving.protocol import HEADER_LENGTH, BadRequest, decode_request, encode_response
from xdevice.serving.repository import ModelNotFound, Repository, triton_config
from xdevice.serving.session import serving_device

if TYPE_CHECKING:
    import subprocess

__all__ = ["Server", "ServerProcess", "create_app", "serve", "ServerNotReady", "GRPC_PORT"]

MAX_BODY = 64 * 2**20
GRPC_PORT = 8001
HEADER_TIMEOUT = 10.0  # seconds a client has to send its request headers
BODY_TIMEOUT = 60.0  # seconds a client has to send its request body
logger = logging.getLogger("xdevice.serving")


class ServerNotReady(InferenceError, RuntimeError):
    """A server that did not start listening, or did not become ready."""


def create_app(
    repository: str | Path,
    *,
    max_body: int = MAX_BODY,
    threads: int | None = None,
    exit_on_error: bool = True,
    strict_readiness: bool = True,
    grpc_port: int | None = None,
    grpc_host: str = "127.0.0.1",
    device: str = "cpu",
):
    """The Starlette app serving ``repository`` (Triton's layout, or one ``.onnx`` file);
    loads every model now.

    Args:
        exit_on_error: raise ``ConfigurationError`` naming every model that failed to load
            (Triton's ``--exit-on-error``); False: serve the others, the index says why.
        strict_readiness: ready only when every model is (Triton's ``--strict-readiness``);
            either way, never with no model loaded.
        grpc_port: also serve gRPC (``GRPCInferenceService``) on this port once the app
            starts (0: a free one, read back from ``app.state.grpc_port``); None: HTTP only.
        device: where a model runs whose configuration does not say (``KIND_AUTO`` or no
            ``instance_group``): ``"cpu"`` or ``"gpu:N"``.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import Response
    from starlette.routing import Route

    registry = Registry()
    repo = Repository(repository, device=_server_device(device))
    models = Models(repo, registry, **({"threads": threads} if threads else {}))
    loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="xdevice-load")
    for name in repo.models():
        with contextlib.suppress(XDeviceError):  # kept in models.failed, logged, and shown in the index
            models.load(name, log_failure=not exit_on_error)  # exiting, the error below names it
    strays = repo.strays()
    if exit_on_error and (models.failed or strays):
        raise ConfigurationError(_failures(models.failed, strays))
    for stray in strays:
        logger.error("%s", stray)
    if not models.loaded:
        logger.warning("%s", models.nothing_served())

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
            except Exception as failure:
                logger.exception("unexpected failure on %s", request.url.path)
                return error(f"{type(failure).__name__}: {failure}", 500)

        return endpoint

    async def server_metadata(request):
        return reply(server_info())

    async def live(request):
        return reply()

    async def ready(request):
        why = models.unready(strict_readiness)
        return reply({"ready": False, "error": why} if why else {"ready": True}, 503 if why else 200)

    async def model_metadata(request, model, version=None):
        return reply(model_info(models, model, version))

    async def model_ready(request, model, version=None):
        loaded = models.get(model, version)
        return reply(None, 200 if loaded.session.ready else 503)

    async def model_config(request, model, version=None):
        loaded = models.get(model, version)
        return reply(triton_config(loaded.config, loaded.session.inputs, loaded.session.outputs))

    async def model_stats(request, model=None, version=None):
        return reply({"model_stats": statistics(models, model, version)})

    async def infer(request, model, version=None):
        start = time.perf_counter()
        loaded = models.get(model, version)
        try:
            body = await asyncio.wait_for(_read_body(request, max_body), BODY_TIMEOUT)
        except asyncio.TimeoutError:
            raise BadRequest(
                message(
                    "The request body did not arrive in time", expected=f"the whole body within {BODY_TIMEOUT:g} s"
                ),
                status=408,
            ) from None
        try:
            parsed = decode_request(body, request.headers.get(HEADER_LENGTH))
        except BadRequest:
            loaded.stats.request(False, time.perf_counter() - start)
            raise
        outputs = await models.infer(loaded, parsed)
        encoding = time.perf_counter()
        content, headers = encode_response(loaded.name, loaded.version, parsed, outputs)
        models.finished(loaded, start, encoding)
        return Response(content, headers=headers)

    async def repository_index(request):
        return reply(models.index())

    async def load(request, model):
        await load_model(models, loader, model)
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
        grpc_server = None
        if grpc_port is not None:
            from xdevice.serving.grpc_service import start_grpc

            grpc_server, app.state.grpc_port = await start_grpc(
                models, loader, grpc_host, grpc_port, strict_readiness, max_body
            )
            logger.info("gRPC (GRPCInferenceService) on %s:%d", grpc_host, app.state.grpc_port)
        yield
        if grpc_server is not None:
            await grpc_server.stop(5)
        for loaded in models.all():
            await retire([loaded])
            loaded.instances.shutdown(wait=True)
        loader.shutdown(wait=True)

    routes = [
        Route("/v2", handled(server_metadata)),
        Route("/v2/health/live", handled(live)),
        Route("/v2/health/ready", handled(ready)),
        Route("/metrics", handled(metrics)),
        Route("/v2/models/stats", handled(model_stats)),
        Route("/v2/repository/index", handled(repository_index), methods=["POST"]),
        Route("/v2/repository/models/{model}/load", handled(load), methods=["POST"]),
        Route("/v2/repository/models/{model}/unload", handled(unload), methods=["POST"]),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix, handled(model_metadata)),
            Route(prefix + "/ready", handled(model_ready)),
            Route(prefix + "/config", handled(model_config)),
            Route(prefix + "/stats", handled(model_stats)),
            Route(prefix + "/infer", handled(infer), methods=["POST"]),
        ]
    handlers = {HTTPException: http_error}  # Starlette's hint wants handlers of any Exception
    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)  # type: ignore[arg-type]  # as above
    app.state.models = models
    app.state.grpc_port = None
    return app


def _failures(failed: dict[str, str], strays: list[str]) -> str:
    """The start-up error: one line per model that failed and per stray file, then the fix."""
    counts = []
    if failed:
        counts.append(f"{len(failed)} model{'s' * (len(failed) > 1)} failed to load")
    if strays:
        counts.append(f"{len(strays)} .onnx file{'s' * (len(strays) > 1)} outside a model folder")
    lines = [f"{' and '.join(counts)}:"]
    lines += [f"  {name}: {reason}" for name, reason in sorted(failed.items())]
    lines += [f"  {stray}" for stray in strays]
    lines.append(
        "Fix: correct each as its line says, or pass --no-exit-on-error (exit_on_error=False) to serve the others."
    )
    return "\n".join(lines)


async def _read_body(request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest(message("Bad Content-Length", received=declared))
        if int(declared) > limit:
            raise BadRequest(
                message(
                    "The request body is too large", expected=f"at most {limit} bytes", received=f"{declared} bytes"
                ),
                status=413,
            )
    body = bytearray()
    async for chunk in request.stream():  # also bounds bodies sent without a Content-Length
        body += chunk
        if len(body) > limit:
            raise BadRequest(message("The request body is too large", expected=f"at most {limit} bytes"), status=413)
    return bytes(body)


def _http_protocol(header_timeout: float):
    """uvicorn's httptools protocol, closing a connection whose request headers do not all
    arrive within ``header_timeout`` seconds of the connection or of the request's start."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(HttpToolsProtocol):
        _header_timer = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self):
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self):
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self):
            self._disarm()
            self._header_timer = self.loop.call_later(header_timeout, self._expire)

        def _disarm(self):
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _expire(self):
            if not self.transport.is_closing():
                self.transport.close()

    return Protocol


class Server:
    """The server on a thread of this process (tests, benchmarks, notebooks).

    >>> with Server("models/") as server:          # doctest: +SKIP
    ...     client = tritonclient.http.InferenceServerClient(server.url)
    """

    def __init__(
        self,
        repository: str | Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        grace: float = 10.0,
        grpc_port: int | None = 0,
        header_timeout: float = HEADER_TIMEOUT,
        **options: Any,
    ):
        import uvicorn

        self.app = create_app(repository, grpc_port=grpc_port, grpc_host=host, **options)
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=grace,  # type: ignore[arg-type]  # seconds for asyncio.wait_for: a float works; the hint says int
            http=_http_protocol(header_timeout),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="xdevice-serve", daemon=True)
        self.host, self.port = host, port

    @property
    def url(self) -> str:
        """``host:port`` of HTTP, as the standard clients take it."""
        return f"{self.host}:{self.port}"

    @property
    def grpc_url(self) -> str:
        """``host:port`` of gRPC (``tritonclient.grpc``)."""
        return f"{self.host}:{self.app.state.grpc_port}"

    def start(self, timeout: float = 30.0) -> Server:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ServerNotReady(
                    message(
                        "The server did not start", received=self.url, fix="is the port free? (port=0 picks a free one)"
                    )
                )
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

    def __init__(
        self, repository: str | Path, *, threads: int | None = None, timeout: float = 120.0, options: Sequence[str] = ()
    ):
        import sys

        self.port, self.grpc_port = _free_port(), _free_port()
        self.url, self.grpc_url = f"127.0.0.1:{self.port}", f"127.0.0.1:{self.grpc_port}"
        self.command = [
            sys.executable,
            "-m",
            "xdevice",
            "serve",
            str(repository),
            "--port",
            str(self.port),
            "--grpc-port",
            str(self.grpc_port),
            *options,
        ]
        if threads is not None:
            self.command += ["--threads", str(threads)]
        self.timeout = timeout
        self.process: subprocess.Popen[bytes] | None = None

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
                raise ServerNotReady(
                    message(
                        "xdevice serve did not become ready",
                        received=" ".join(self.command),
                        fix="run that command by hand to see its error",
                    )
                )
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        """Stop it the way a deployment does (SIGTERM): requests in flight finish first."""
        if self.process is not None:
            self.process.terminate()
            self.process.wait(30)


def _server_device(spec: str) -> str:
    """``--device`` as the repository writes devices: ``"cpu"`` or ``"gpu:N"``.

    >>> _server_device("cuda:1"), _server_device("cpu:0")
    ('gpu:1', 'cpu')
    """
    where = serving_device(spec)
    return str(where) if where.kind == "gpu" else "cpu"


def serve(
    repository: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    grpc_port: int | None = GRPC_PORT,
    access_log: bool = False,
    header_timeout: float = HEADER_TIMEOUT,
    log_level: str = "info",
    **options: Any,
) -> None:
    """Serve ``repository`` until interrupted (what ``xdevice serve`` runs).

    Raises:
        ConfigurationError: a model failed to load (with ``exit_on_error``, the default).
    """
    import uvicorn

    app = create_app(repository, grpc_port=grpc_port or None, grpc_host=host, **options)
    models = app.state.models
    logger.info(
        "serving %s from %s on http://%s:%d%s (KServe V2; metrics at /metrics)",
        ", ".join(models.loaded) or "no models",
        repository,
        host,
        port,
        f" and grpc://{host}:{grpc_port}" if grpc_port else "",
    )
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=log_level if access_log else "warning",
        access_log=access_log,
        timeout_graceful_shutdown=10,
        http=_http_protocol(header_timeout),
    )


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
