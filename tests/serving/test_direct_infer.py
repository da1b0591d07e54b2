"""``POST .../infer`` is answered before Starlette's middleware and routing (the hot path),
with the same answers as through Starlette's routes; every other request is Starlette's; a
lone request on a fast model whose batcher stepped aside runs on the event loop."""

from __future__ import annotations

import asyncio
import gzip
import math
import threading
import time

import numpy as np
import pytest

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
import orjson

from .onnx_models import BATCHED, B, W, dense_model, record_threads, write_model

X = np.arange(4, dtype=np.float32).reshape(1, 4)
BODY = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": X.ravel().tolist()}]})


@pytest.fixture
def app(tmp_path):
    pytest.importorskip("onnx")
    pytest.importorskip("starlette")
    from xdevice.serving.dataplane import DataPlane
    from xdevice.serving.server import rest_app

    write_model(tmp_path, "dense", dense_model())
    write_model(tmp_path, "batched", dense_model(), config=BATCHED)
    return rest_app(DataPlane(tmp_path))


def call(app, method: str, path: str, body: bytes = b"", headers=(), root_path: str = "") -> tuple[int, dict, bytes]:
    """One request straight to the ASGI app: (status, headers, body) of its answer."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": root_path + path,
        "raw_path": (root_path + path).encode(),
        "root_path": root_path,
        "query_string": b"",
        "headers": [(b"content-length", str(len(body)).encode()), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    sent: list[dict] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    start, content = sent[0], b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, content


def _y(content: bytes) -> np.ndarray:
    outputs = {o["name"]: o for o in orjson.loads(content)["outputs"]}
    return np.array(outputs["y"]["data"], np.float32).reshape(outputs["y"]["shape"])


def test_infer_is_answered_without_starlettes_middleware_or_routing(app):
    status, headers, content = call(app, "POST", "/v2/models/dense/infer", BODY)
    assert status == 200 and headers["content-type"] == "application/json"
    assert headers["content-length"] == str(len(content))
    np.testing.assert_allclose(_y(content), np.maximum(X @ W + B, 0), rtol=1e-6)
    assert app.middleware_stack is None  # Starlette never built its stack: it saw no request
    assert call(app, "GET", "/v2/health/live")[0] == 200
    assert app.middleware_stack is not None  # every other request is Starlette's


def test_infer_under_a_root_path_goes_through_starlettes_route_to_the_same_answer(app):
    direct = call(app, "POST", "/v2/models/dense/versions/2/infer", BODY)
    routed = call(app, "POST", "/v2/models/dense/versions/2/infer", BODY, root_path="/api")
    assert app.middleware_stack is not None  # the root-path request went through Starlette
    assert direct[0] == routed[0] == 200 and direct[2] == routed[2]
    assert orjson.loads(direct[2])["model_version"] == "2"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v2/models/dense/infer", 405),  # Starlette's: the route takes POST only
        ("POST", "/v2/models//infer", 404),  # an empty model name matches no route
        ("POST", "/v2/models/dense/versions//infer", 404),
        ("POST", "/v2/models/dense/other/1/infer", 404),
        ("POST", "/v2/models/missing/infer", 404),  # the data plane's: unknown model
    ],
)
def test_requests_near_the_infer_paths_get_starlettes_or_the_data_planes_answer(app, method, path, status):
    assert call(app, method, path, BODY)[0] == status


def test_a_failed_infer_is_a_json_error_and_a_body_too_large_closes_the_connection(app):
    status, headers, content = call(app, "POST", "/v2/models/dense/infer", b"{not json")
    assert status == 400 and "error" in orjson.loads(content)
    app.state.dataplane.max_body = 16
    status, headers, content = call(app, "POST", "/v2/models/dense/infer", BODY)
    assert status == 413 and headers["connection"] == "close" and "too large" in orjson.loads(content)["error"]


def test_compressed_requests_and_answers_on_the_direct_path(app):
    wide = orjson.dumps(
        {"inputs": [{"name": "x", "shape": [64, 4], "datatype": "FP32", "data": [1.0] * 256}]}
    )  # an answer long enough to be compressed
    status, headers, content = call(
        app,
        "POST",
        "/v2/models/dense/infer",
        gzip.compress(wide),
        [(b"content-encoding", b"gzip"), (b"accept-encoding", b"gzip")],
    )
    assert status == 200 and headers["content-encoding"] == "gzip"
    y = _y(gzip.decompress(content))
    np.testing.assert_allclose(y, np.maximum(np.ones((64, 4), np.float32) @ W + B, 0), rtol=1e-6)


def test_a_lone_request_on_a_fast_model_whose_batcher_stepped_aside_runs_on_the_event_loop(app):
    from xdevice.serving.models import INLINE_BELOW
    from xdevice.serving.protocol import decode_request

    plane = app.state.dataplane
    loaded = plane.models.get("batched")
    batcher = loaded.batcher
    ran_on = record_threads(batcher)

    async def infer():
        return await plane.infer("batched", None, _decoded(decode_request), lambda *answer: answer[2])

    async def main():
        await infer()  # starts the batcher (merging: the configuration is followed until measured)
        batcher.course.settle("single", time.perf_counter())  # as when batching did not pay
        answers = [await infer()]
        measured = batcher.recent
        # A run's time depends on the machine's load: set the measure, so what is checked is
        # the choice it drives.
        batcher.recent = INLINE_BELOW / 10  # as if its runs took 0.1 ms
        answers.append(await infer())
        batcher.recent = 10 * INLINE_BELOW  # as if its runs took 10 ms
        answers.append(await infer())
        return threading.current_thread().name, answers, measured

    loop_thread, answers, measured = asyncio.run(main())
    assert ran_on[0].startswith("xdevice-batched-")  # merged: the batch runs on an instance thread
    assert ran_on[1].startswith("xdevice-batched-")  # stepped aside, nothing measured alone yet
    assert 0 < measured < math.inf  # that run was timed
    assert ran_on[2] == loop_thread  # fast and alone: on the event loop
    assert ran_on[3].startswith("xdevice-batched-")  # slow: on an instance thread again
    for answer in answers:
        np.testing.assert_allclose(answer["y"], np.maximum(X @ W + B, 0), rtol=1e-6)


def _decoded(decode_request):
    async def decode():
        return decode_request(BODY, None)

    return decode
