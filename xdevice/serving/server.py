"""``xdevice serve``: a model repository behind the Open Inference Protocol (KServe V2), over
HTTP and gRPC.

Starlette on uvicorn for HTTP (bodies parsed with orjson and numpy, no per-request schema
objects), ``grpc.aio`` for gRPC on the same event loop, both thin adapters over one
:class:`~xdevice.serving.dataplane.DataPlane`; ONNX Runtime runs in a thread pool, off the
event loop. Every bad request gets a 4xx with
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
import contextlib
import logging
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from xdevice._errors import ConfigurationError, InferenceError, message
from xdevice.serving.cuda_memory import raw_handle
from xdevice.serving.dataplane import MAX_BODY, DataPlane, error_status
from xdevice.serving.protocol import HEADER_LENGTH, BadRequest, decode_request, encode_response
from xdevice.serving.session import serving_device

if TYPE_CHECKING:
    import subprocess

__all__ = ["Server", "ServerProcess", "create_app", "rest_app", "serve", "ServerNotReady", "PortTaken", "GRPC_PORT"]

GRPC_PORT = 8001
SHUTDOWN_TIMEOUT = 10.0  # seconds requests in flight get to finish when the server stops
HEADER_TIMEOUT = 10.0  # seconds a client has to send its request headers
BODY_TIMEOUT = 60.0  # seconds a client has to send its request body
logger = logging.getLogger("xdevice.serving")
T = TypeVar("T")


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
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
):
    """The Starlette app serving ``repository`` (Triton's layout, or one ``.onnx`` file);
    loads every model now (:class:`~xdevice.serving.dataplane.DataPlane`, whose arguments
    these are).

    Args:
        grpc_port: also serve gRPC (``GRPCInferenceService``) on this port once the app
            starts (0: a free one, read back from ``app.state.grpc_port``); None: HTTP only.
        device: where a model runs whose configuration does not say (``KIND_AUTO`` or no
            ``instance_group``): ``"cpu"`` or ``"gpu:N"``.
        shutdown_timeout: seconds the gRPC calls in flight get to finish when it stops.
    """
    plane = DataPlane(
        repository,
        device=_server_device(device),
        threads=threads,
        exit_on_error=exit_on_error,
        strict_readiness=strict_readiness,
        max_body=max_body,
    )
    return rest_app(plane, grpc_port=grpc_port, grpc_host=grpc_host, shutdown_timeout=shutdown_timeout)


def rest_app(
    plane: DataPlane,
    *,
    grpc_port: int | None = None,
    grpc_host: str = "127.0.0.1",
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
):
    """The HTTP endpoints over ``plane`` as a Starlette app, which also runs the gRPC service
    on ``grpc_port`` (None: none) while it runs; ``app.state.dataplane`` is ``plane``."""
    from starlette.exceptions import HTTPException
    from starlette.routing import Route

    rest = _Endpoints(plane)

    async def http_error(request, failure: HTTPException):
        return _reply({"error": f"{failure.detail}: {request.method} {request.url.path}"}, failure.status_code)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        grpc_server = None
        if grpc_port is not None:
            from xdevice.serving.grpc_service import start_grpc

            reservation = getattr(app.state, "grpc_reservation", None)
            if reservation is not None:  # serve() held the port from before the models loaded
                reservation.close()

            grpc_server, app.state.grpc_port = await start_grpc(plane, grpc_host, grpc_port)
            logger.info("gRPC (GRPCInferenceService) on %s:%d", grpc_host, app.state.grpc_port)
        yield
        if grpc_server is not None:
            await grpc_server.stop(shutdown_timeout)
        await plane.close()

    def route(path: str, handler, method: str = "GET") -> Route:
        async def endpoint(request):
            try:
                return await handler(request, **request.path_params)
            except Exception as failure:  # noqa: BLE001 - every failure is answered (_failure_reply)
                return _failure_reply(failure, request.url.path)

        return Route(path, endpoint, methods=[method])

    class InferRoute:  # Starlette's way in, where App's is not taken (an object: an ASGI app to Starlette)
        async def __call__(self, scope, receive, send) -> None:
            params = scope["path_params"]
            await rest.infer(scope, receive, send, params["model"], params.get("version"))

    infer_route = InferRoute()
    # inference first: Starlette tries the routes in order, and an infer request is the one
    # whose latency counts (no other route's path can match an infer route's)
    routes = [
        Route("/v2/models/{model}/infer", infer_route, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/infer", infer_route, methods=["POST"]),
        route("/v2", rest.server_metadata),
        route("/v2/health/live", rest.live),
        route("/v2/health/ready", rest.ready),
        route("/metrics", rest.metrics),
        route("/v2/models/stats", rest.model_stats),
        route("/v2/repository/index", rest.repository_index, "POST"),
        route("/v2/repository/models/{model}/load", rest.load, "POST"),
        route("/v2/repository/models/{model}/unload", rest.unload, "POST"),
        route("/v2/logging", rest.log_settings),
        route("/v2/logging", rest.log_settings, "POST"),
        route("/v2/trace/setting", rest.trace_settings),
        route("/v2/trace/setting", rest.trace_settings, "POST"),
        route("/v2/systemsharedmemory/status", rest.system_memory_status),
        route("/v2/systemsharedmemory/region/{name}/status", rest.system_memory_status),
        route("/v2/systemsharedmemory/region/{name}/register", rest.register_system_memory, "POST"),
        route("/v2/systemsharedmemory/unregister", rest.unregister_system_memory, "POST"),
        route("/v2/systemsharedmemory/region/{name}/unregister", rest.unregister_system_memory, "POST"),
        route("/v2/cudasharedmemory/status", rest.cuda_memory_status),
        route("/v2/cudasharedmemory/region/{name}/status", rest.cuda_memory_status),
        route("/v2/cudasharedmemory/region/{name}/register", rest.register_cuda_memory, "POST"),
        route("/v2/cudasharedmemory/unregister", rest.unregister_cuda_memory, "POST"),
        route("/v2/cudasharedmemory/region/{name}/unregister", rest.unregister_cuda_memory, "POST"),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            route(prefix, rest.model_metadata),
            route(prefix + "/ready", rest.model_ready),
            route(prefix + "/config", rest.model_config),
            route(prefix + "/stats", rest.model_stats),
        ]
    routes += [
        route("/v2/models/{model}/trace/setting", rest.trace_settings),
        route("/v2/models/{model}/trace/setting", rest.trace_settings, "POST"),
    ]
    handlers = {HTTPException: http_error}
    app = _app_class()(rest, routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.state.dataplane = plane
    app.state.models = plane.models
    app.state.grpc_port = None
    return app


def _reply(value: Any = None, status: int = 200):
    from starlette.responses import Response

    body = b"" if value is None else orjson.dumps(value)
    return Response(body, status_code=status, media_type="application/json")


def _failure_reply(failure: Exception, path: str):
    """What a failed request answers: ``{"error": ...}`` with the status the data plane's
    table gives (a 500 is logged with its traceback); an answer sent before the body was read
    to its end closes the connection."""
    status, _, text = error_status(failure)
    if status == 500:
        logger.exception("unexpected failure on %s", path)
    reply = _reply({"error": text}, status)
    if status in _UNREAD_BODY:  # the rest of the body is not read: close, not keep-alive
        reply.headers["connection"] = "close"
    return reply


def _app_class() -> type:
    """Starlette's app, answering ``POST /v2/models/<m>[/versions/<v>]/infer`` before its
    middleware and routing: the two wrap every request in closures, exception guards, a
    ``Request`` and a ``Response`` (in process, a quarter to a third of an infer request's
    time on a tiny model), and the infer endpoint needs none of it (it answers its own
    failures, :func:`_failure_reply`).
    Every other request, and an infer request under a ``root_path``, goes to Starlette as it
    is; Starlette's infer routes lead to the same endpoint."""
    from starlette.applications import Starlette

    class App(Starlette):
        def __init__(self, rest: _Endpoints, **options: Any):
            super().__init__(**options)
            self._rest = rest

        async def __call__(self, scope, receive, send) -> None:
            if scope["type"] == "http":
                target = _infer_target(scope)
                if target is not None:
                    scope["app"] = self
                    await self._rest.infer(scope, receive, send, *target)
                    return
            await super().__call__(scope, receive, send)

    return App


def _infer_target(scope: dict) -> tuple[str, str | None] | None:
    """``(model, version)`` of a request that Starlette's infer routes would take, matched by
    splitting the path (as ``{model}`` and ``{version}`` match: one non-empty segment each);
    None for any other request, and under a ``root_path`` (Starlette strips it first).

    >>> _infer_target({"method": "POST", "path": "/v2/models/m/versions/2/infer"})
    ('m', '2')
    >>> _infer_target({"method": "POST", "path": "/v2/models/m/infer"})
    ('m', None)
    >>> _infer_target({"method": "GET", "path": "/v2/models/m/infer"}) is None
    True
    """
    if scope["method"] != "POST" or scope.get("root_path"):
        return None
    parts = scope["path"].split("/")
    if parts[-1] != "infer" or len(parts) not in (5, 7) or parts[0] or parts[1] != "v2" or parts[2] != "models":
        return None
    if len(parts) == 5:
        return (parts[3], None) if parts[3] else None
    if parts[4] == "versions" and parts[3] and parts[5]:
        return parts[3], parts[5]
    return None


class _Endpoints:
    """The Open Inference Protocol's HTTP endpoints, each a translation to one data-plane call."""

    def __init__(self, plane: DataPlane):
        self.plane = plane

    async def server_metadata(self, request):
        return _reply(self.plane.server_metadata())

    async def live(self, request):
        return _reply(self.plane.live())

    async def ready(self, request):
        ready, body = self.plane.ready()
        return _reply(body, 200 if ready else 503)

    async def model_metadata(self, request, model, version=None):
        return _reply(self.plane.model_metadata(model, version))

    async def model_ready(self, request, model, version=None):
        body = self.plane.model_ready(model, version)
        return _reply(body, 200 if body["ready"] else 503)

    async def model_config(self, request, model, version=None):
        return _reply(self.plane.model_config(model, version))

    async def model_stats(self, request, model=None, version=None):
        return _reply(self.plane.statistics(model, version))

    async def repository_index(self, request):
        body = await _read_json(request, self.plane.max_body)
        return _reply(self.plane.index(ready_only=bool(body.get("ready"))))

    async def load(self, request, model):
        body = await _read_json(request, self.plane.max_body)
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise BadRequest(message("`parameters` must be an object", received=parameters))
        await self.plane.load(model, {key: _file_bytes(key, value) for key, value in parameters.items()})
        return _reply()

    async def unload(self, request, model):
        await self.plane.unload(model)
        return _reply()

    async def log_settings(self, request):
        changes = await _read_json(request, self.plane.max_body) if request.method == "POST" else None
        return _reply(self.plane.log(changes))

    async def trace_settings(self, request, model=None):
        changes = await _read_json(request, self.plane.max_body) if request.method == "POST" else None
        return _reply(self.plane.trace(changes, model))

    async def system_memory_status(self, request, name=None):
        return _reply(self.plane.system_memory_status(name))

    async def register_system_memory(self, request, name):
        body = await _read_json(request, self.plane.max_body)
        self.plane.register_system_memory(name, body.get("key", ""), body.get("offset", 0), body.get("byte_size", 0))
        return _reply()

    async def unregister_system_memory(self, request, name=None):
        self.plane.unregister_system_memory(name)
        return _reply()

    async def cuda_memory_status(self, request, name=None):
        return _reply(self.plane.cuda_memory_status(name))

    async def register_cuda_memory(self, request, name):
        body = await _read_json(request, self.plane.max_body)
        handle = raw_handle(body.get("raw_handle"))
        self.plane.register_cuda_memory(name, handle, body.get("device_id"), body.get("byte_size"))
        return _reply()

    async def unregister_cuda_memory(self, request, name=None):
        self.plane.unregister_cuda_memory(name)
        return _reply()

    async def metrics(self, request):
        from starlette.responses import Response

        return Response(self.plane.metrics(), media_type="text/plain; version=0.0.4")

    async def infer(self, scope, receive, send, model: str, version: str | None = None) -> None:
        """``POST .../infer`` as a bare ASGI app (the hot path: no Starlette request or
        response objects): the body read within ``BODY_TIMEOUT`` and ``max_body`` bytes,
        decompressed as ``Content-Encoding`` says, the answer compressed as ``Accept-Encoding``
        allows; every failure answered by :func:`_failure_reply`."""
        headers = dict(reversed(scope["headers"]))  # as Starlette's lookup: the first of a repeated name
        limit = self.plane.max_body

        async def decode():
            try:
                body = await _within(
                    BODY_TIMEOUT,
                    _read_chunks(
                        _header(headers, b"content-length"),
                        _header(headers, b"content-encoding"),
                        _received(receive),
                        limit,
                    ),
                )
            except asyncio.TimeoutError:
                raise BadRequest(
                    message(
                        "The request body did not arrive in time",
                        expected=f"the whole body within {BODY_TIMEOUT:g} s",
                    ),
                    status=408,
                ) from None
            return decode_request(body, _header(headers, HEADER_LENGTH.encode()))

        def encode(loaded, parsed, outputs):
            content, fields = encode_response(loaded.name, loaded.version, parsed, outputs)
            coding = _accepted_encoding(_header(headers, b"accept-encoding") or "")
            if coding is not None and len(content) >= MIN_COMPRESSED:
                content = _compress(content, coding)
                fields["content-encoding"] = coding
            return content, fields

        try:
            content, fields = await self.plane.infer(model, version, decode, encode)
        except Exception as failure:  # noqa: BLE001 - every failure is answered (_failure_reply)
            await _failure_reply(failure, scope["path"])(scope, receive, send)
            return
        # as Starlette's Response(content, headers=fields) sends it
        raw = [(key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in fields.items()]
        raw.append((b"content-length", str(len(content)).encode("latin-1")))
        await send({"type": "http.response.start", "status": 200, "headers": raw})
        await send({"type": "http.response.body", "body": content})


def _header(headers: dict, name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


async def _received(receive) -> AsyncIterator[bytes]:
    """A request's body as its chunks arrive (Starlette's ``Request.stream`` without the
    request object; a client gone midway raises its ``ClientDisconnect``, as there)."""
    while True:
        arrived = await receive()
        if arrived["type"] == "http.request":
            chunk = arrived.get("body", b"")
            if chunk:
                yield chunk
            if not arrived.get("more_body", False):
                return
        elif arrived["type"] == "http.disconnect":
            from starlette.requests import ClientDisconnect

            raise ClientDisconnect()


async def _within(seconds: float, awaitable: Awaitable[T]) -> T:
    """``await awaitable``, or ``asyncio.TimeoutError`` after ``seconds``; on Python 3.11+
    without the task ``asyncio.wait_for`` wraps it in (a loop hop on every request)."""
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(seconds):
            return await awaitable
    return await asyncio.wait_for(awaitable, seconds)


def _file_bytes(key: str, value: Any) -> Any:
    """A load parameter as the data plane takes it: a ``file:`` override's base64 text (the
    model-repository extension's JSON form) as its bytes; any other value as it is."""
    if not key.startswith("file:"):
        return value
    import base64
    import binascii

    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise BadRequest(
            message(f"Load parameter {key!r} must be the file's bytes in base64", received=str(value)[:40])
        ) from None


async def _read_json(request, limit: int) -> dict:
    """A small JSON request body (load, index) as a dict; an empty body is ``{}``."""
    body = await _read_body(request, limit)
    if not body.strip():
        return {}
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(message("The request is not valid JSON", received=str(error)[:200])) from None
    if not isinstance(parsed, dict):
        raise BadRequest(message("The request body must be a JSON object", received=type(parsed).__name__))
    return parsed


async def _read_body(request, limit: int) -> bytes | bytearray:
    """A Starlette request's body, as :func:`_read_chunks` reads it."""
    headers = request.headers
    return await _read_chunks(headers.get("content-length"), headers.get("content-encoding"), request.stream(), limit)


async def _read_chunks(
    declared: str | None, coding: str | None, chunks: AsyncIterator[bytes], limit: int
) -> bytes | bytearray:
    """The request body from its ``chunks``, decompressed as ``coding`` (its
    ``Content-Encoding``) says, read no further than ``limit`` bytes.

    A body declared (``Content-Length``) or found (chunked) to be larger is refused with 413
    as soon as that is known: what arrived is let go of at once (not kept alive by the
    exception's traceback), and the answer closes the connection, so the rest is never read.
    The body is returned as the buffer it was read into (no copy)."""
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
    async for chunk in chunks:  # also bounds bodies sent without a Content-Length
        if len(body) + len(chunk) > limit:
            body.clear()  # free it now, whoever still holds this frame
            raise BadRequest(message("The request body is too large", expected=f"at most {limit} bytes"), status=413)
        body += chunk
    coding = (coding or "identity").strip().lower()
    return body if coding == "identity" else _decompress(body, coding, limit)


#: statuses answered before the body was read to its end: the connection is closed after them
_UNREAD_BODY = (408, 413)


#: Content-Encoding -> zlib's wbits for it (``deflate`` is zlib's format, as HTTP means it)
_CODINGS = {"gzip": 31, "deflate": 15}
#: responses shorter than this go out as they are, whatever ``Accept-Encoding`` allows (as
#: Starlette's ``GZipMiddleware``): compressing a few hundred bytes costs more than it saves, and
#: aiohttp (``tritonclient.http.aio``) asks for gzip on every request by default
MIN_COMPRESSED = 500


def _decompress(body: bytes | bytearray, coding: str, limit: int) -> bytes:
    """A compressed request body (``Content-Encoding: gzip`` or ``deflate``, as
    ``tritonclient`` sends with ``request_compression_algorithm``) decoded, never past
    ``limit`` bytes: a body that would grow beyond it is refused (413) as it is decoded."""
    import zlib

    if coding not in _CODINGS:
        raise BadRequest(
            message("Unsupported Content-Encoding", received=coding, choices=[*_CODINGS, "identity"]), status=415
        )
    decoder = zlib.decompressobj(_CODINGS[coding])
    try:
        plain = decoder.decompress(body, limit + 1)
    except zlib.error as error:
        raise BadRequest(message(f"The request body is not valid {coding}", received=str(error))) from None
    if len(plain) > limit or decoder.unconsumed_tail:
        raise BadRequest(
            message("The decompressed request body is too large", expected=f"at most {limit} bytes"), status=413
        )
    if not decoder.eof:
        raise BadRequest(message(f"The request body's {coding} stream is cut short"))
    return plain


def _accepted_encoding(accept: str) -> str | None:
    """The response coding ``Accept-Encoding`` asks for, of gzip and deflate, in the client's
    order (one given ``q=0`` is refused); None: send it as it is.

    >>> _accepted_encoding("deflate, gzip"), _accepted_encoding("gzip;q=0, br"), _accepted_encoding("")
    ('deflate', None, None)
    """
    for item in accept.split(","):
        coding, _, quality = item.strip().lower().partition(";")
        if coding.strip() in _CODINGS and quality.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000"):
            return coding.strip()
    return None


def _compress(content: bytes, coding: str) -> bytes:
    import gzip
    import zlib

    return gzip.compress(content, compresslevel=1) if coding == "gzip" else zlib.compress(content, 1)


class _OneWrite:
    """A connection's transport that sends a response's status line and headers together
    with the body's first write: uvicorn writes them apart, and on loopback each write wakes
    the client (two wake-ups, two segments per response where one does). Every other call
    goes to the transport as it is; a held write goes out when the response completes
    (:meth:`flush`) or the transport closes."""

    def __init__(self, transport: Any):
        self._transport = transport
        self.armed = False  # hold the next response's status line and headers
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif self.armed and data.startswith(b"HTTP/1.1 ") and not data.startswith(b"HTTP/1.1 100 "):
            self.armed, self._held = False, data  # "100 Continue" goes at once: the client waits on it
            return
        self._transport.write(data)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def flush(self) -> None:
        """Send what is held (a response that is complete without writing a body)."""
        if self._held is not None:
            self._transport.write(self._held)
            self._held = None

    def __getattr__(self, name: str) -> Any:  # everything else, as the transport has it
        return getattr(self._transport, name)


def _http_protocol(header_timeout: float):
    """uvicorn's httptools protocol, closing a connection whose request headers do not all
    arrive within ``header_timeout`` seconds of the connection or of the request's start,
    and sending each response's headers and body in one write (:class:`_OneWrite`)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class Protocol(HttpToolsProtocol):
        _header_timer = None

        def connection_made(self, transport):
            writer: Any = _OneWrite(transport)  # stands in for the transport (duck-typed)
            self._writer = writer
            super().connection_made(writer)
            self._arm()

        def on_message_begin(self):
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self):
            self._disarm()
            self._writer.armed = True  # this request's answer: headers wait for the body
            super().on_headers_complete()

        def on_response_complete(self):
            self._writer.flush()  # a response that wrote no body (HEAD) sends its held headers now
            super().on_response_complete()

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
        self.server = _uvicorn_server(config, self.app.state.dataplane)
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


class PortTaken(ConfigurationError):
    """A port the server was told to listen on is held by another program (or server)."""


def reserve_port(host: str, port: int, flag: str) -> socket.socket:
    """A socket bound to ``host:port`` for this server alone (``SO_REUSEADDR`` as uvicorn and
    gRPC set it, never ``SO_REUSEPORT``), so a port another process listens on is found
    before anything starts; ``flag`` is the option that changes the port.

    Raises:
        PortTaken: one line naming the port and ``flag``.
    """
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    held = socket.socket(family, kind, proto)
    held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        held.bind(address)
    except OSError as error:
        held.close()
        raise PortTaken(
            message(
                f"Port {port} on {host} is already in use ({error.strerror})",
                fix=f"stop the program that holds it, or pass {flag} with a free port",
            )
        ) from None
    held.set_inheritable(True)
    return held


def serve(
    repository: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    grpc_port: int | None = GRPC_PORT,
    access_log: bool = False,
    header_timeout: float = HEADER_TIMEOUT,
    log_level: str = "info",
    shutdown_timeout: float = SHUTDOWN_TIMEOUT,
    **options: Any,
) -> None:
    """Serve ``repository`` until interrupted (what ``xdevice serve`` runs).

    Both ports are taken before any model loads, so a port in use stops start-up at once.
    SIGTERM or SIGINT stop it cleanly: no new connection is accepted, the requests in flight
    get up to ``shutdown_timeout`` seconds to finish, the log says how many were drained,
    and the call returns (``xdevice serve`` exits 0).

    Raises:
        PortTaken: the HTTP or gRPC port is in use (nothing was loaded or logged).
        ConfigurationError: a model failed to load (with ``exit_on_error``, the default).
    """
    import uvicorn

    http_socket = reserve_port(host, port, "--port")
    grpc_socket = None
    try:
        if grpc_port:
            grpc_socket = reserve_port(host, grpc_port, "--grpc-port")
        app = create_app(
            repository, grpc_port=grpc_port or None, grpc_host=host, shutdown_timeout=shutdown_timeout, **options
        )
    except BaseException:
        http_socket.close()
        if grpc_socket is not None:
            grpc_socket.close()
        raise
    app.state.grpc_reservation = grpc_socket  # let go of just before gRPC binds it
    port = http_socket.getsockname()[1]  # the port taken, where 0 asked for a free one
    plane = app.state.dataplane
    logger.info(
        "serving %s from %s on http://%s:%d%s (KServe V2; metrics at /metrics)",
        ", ".join(plane.models.loaded) or "no models",
        repository,
        host,
        port,
        f" and grpc://{host}:{grpc_port}" if grpc_port else "",
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level if access_log else "warning",
        access_log=access_log,
        timeout_graceful_shutdown=shutdown_timeout,  # type: ignore[arg-type]  # a float works; the hint says int
        http=_http_protocol(header_timeout),
    )
    _uvicorn_server(config, plane).run(sockets=[http_socket])


def _uvicorn_server(config: Any, plane: DataPlane) -> Any:
    """uvicorn's server that says what a stop drained, and ends a stop asked by a signal as a
    clean exit: uvicorn re-raises SIGTERM once it has drained, and the process would die of
    it (exit 143, a failure to Kubernetes and systemd) after a shutdown that went well."""
    import uvicorn

    class Drained(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                getattr(self, "_captured_signals", []).clear()  # handled: drained, not killed

        async def shutdown(self, sockets=None):
            pending, cancelled = plane.in_flight, plane.cancelled
            timeout = self.config.timeout_graceful_shutdown
            logger.info("stopping: %d request(s) in flight get up to %g s to finish", pending, timeout or 0)
            await super().shutdown(sockets)
            lost = plane.cancelled - cancelled
            logger.info(
                "stopped: drained %d request(s) in flight%s", pending - lost, f"; {lost} cut off" if lost else ""
            )

    return Drained(config)


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
