"""The real server on a loopback port, driven by the standard, unmodified client (tritonclient)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.client
import threading
import time

import numpy as np
import pytest

pytest.importorskip("starlette")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402 - below the importorskip guard

from xdevice.serving.server import Server  # noqa: E402 - below the importorskip guard

from .onnx_models import reference  # noqa: E402 - below the importorskip guard


@pytest.fixture
def client(server):
    return httpclient.InferenceServerClient(server.url)


def _input(x, name="x", binary=True):
    from tritonclient.utils import np_to_triton_dtype

    tensor = httpclient.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def test_health_metadata_and_triton_config(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("dense") and client.is_model_ready("dense", "2")
    assert not client.is_model_ready("nope")
    metadata = client.get_model_metadata("dense")
    assert metadata["versions"] == ["2"]  # the newest version is served
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}]
    assert [o["name"] for o in metadata["outputs"]] == ["y", "total"]
    config = client.get_model_config("batched")
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [4]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 50000
    assert "dynamic_batching" not in client.get_model_config("dense")


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_gives_every_output_in_binary_and_json(client, binary):
    x = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("y", "total")]
    result = client.infer("dense", [_input(x, binary=binary)], outputs=outputs, request_id="r1")
    y, total = reference(x)
    np.testing.assert_allclose(result.as_numpy("y"), y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.as_numpy("total"), total, rtol=1e-5, atol=1e-6)
    assert result.get_response()["id"] == "r1"


def test_only_the_outputs_asked_for_come_back(client):
    x = np.ones((2, 4), np.float32)
    result = client.infer("dense", [_input(x)], outputs=[httpclient.InferRequestedOutput("total")])
    assert result.as_numpy("y") is None and result.as_numpy("total").tolist() == [4.0, 4.0]


def test_bytes_tensors_round_trip(client):
    s = np.array([b"hello", b"", "gr\u00fc\u00df".encode()], dtype=object)
    for binary in (True, False):
        result = client.infer(
            "strings", [_input(s, "s", binary)], outputs=[httpclient.InferRequestedOutput("out", binary_data=binary)]
        )
        got = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("out").tolist()]
        assert got == s.tolist()  # the client hands JSON strings back as str, binary ones as bytes


@pytest.mark.parametrize(
    "call, status, text",
    [
        (lambda c: c.infer("nope", [_input(np.ones((1, 4), np.float32))]), "404", "Unknown model"),
        (
            lambda c: c.infer("dense", [_input(np.ones((1, 4), np.float32))], model_version="7"),
            "404",
            "no such version",
        ),
        (lambda c: c.infer("dense", [_input(np.ones((1, 4), np.float32), "X")]), "400", "Valid choices: x"),
        (lambda c: c.infer("dense", [_input(np.ones((1, 5), np.float32))]), "400", "wrong shape"),
        (lambda c: c.infer("dense", [_input(np.ones((2, 4)))]), "400", "wrong datatype"),
        (lambda c: c.infer("batched", [_input(np.ones((9, 4), np.float32))]), "400", "max_batch_size"),
        (lambda c: c.infer("dense", [_input(np.ones((400, 1024), np.float32))]), "413", "too large"),
    ],
    ids=["unknown-model", "unknown-version", "wrong-name", "wrong-shape", "wrong-datatype", "over-batch", "too-large"],
)
def test_bad_requests_get_a_4xx_that_says_why_and_the_server_keeps_serving(client, call, status, text):
    with pytest.raises(InferenceServerException) as caught:
        call(client)
    assert caught.value.status() == status and text in caught.value.message()
    test_only_the_outputs_asked_for_come_back(client)


def _raw(server, body: bytes, headers=None, path="/v2/models/dense/infer"):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


HEADER = b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}]}'


@pytest.mark.parametrize(
    "body, headers, text",
    [
        (b"{not json", {}, "not valid JSON"),
        (
            b'{"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [1, 2, 3]}]}',
            {},
            "does not match the shape",
        ),
        (HEADER + b"\0" * 8, {"Inference-Header-Content-Length": str(len(HEADER))}, "binary_data_size does not add up"),
        (HEADER + b"\0" * 24, {"Inference-Header-Content-Length": str(len(HEADER))}, "binary part is longer"),
        (HEADER + b"\0" * 16, {"Inference-Header-Content-Length": "9999"}, "does not fit the body"),
        (b'{"inputs": []}', {}, "no `inputs`"),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FLOAT", "data": [1, 2, 3, 4]}]}',
            {},
            "unknown datatype",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, null, 3, 4]}]}',
            {},
            "Received: 'null'",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, true, 3, 4]}]}',
            {},
            "Received: 'true'",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2, 3], [4]]}]}',
            {},
            "nested data must follow the shape",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": '
            + b"[" * 900
            + b"1"
            + b"]" * 900
            + b"}]}",
            {},
            "nested data must follow the shape",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT8", "data": [1, 2, 300, 4]}]}',
            {},
            "beyond INT8's range",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "INT32", "data": [1, 2.5, 3, 4]}]}',
            {},
            "Expected whole numbers",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP16", "data": [1, 2, 1e6, 4]}]}',
            {},
            "beyond FP16's range",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "BOOL", "data": [1, 0, 1, 0]}]}',
            {},
            "Expected true or false",
        ),
        (
            b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}],'
            b' "parameters": {"timeout": 5}}',
            {},
            "does not let a request set its own timeout",
        ),
    ],
    ids=[
        "not-json",
        "count",
        "binary-short",
        "binary-long",
        "header-length",
        "no-inputs",
        "datatype",
        "null",
        "bool-for-float",
        "ragged",
        "deep",
        "int8-overflow",
        "fraction-for-int",
        "fp16-overflow",
        "int-for-bool",
        "timeout-override",
    ],
)
def test_malformed_bodies_get_400_with_json_errors(server, body, headers, text):
    status, reply = _raw(server, body, headers)
    import orjson

    assert status == 400 and text in orjson.loads(reply)["error"]
    assert (
        _raw(server, b'{"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}')[0]
        == 200
    )


def test_a_client_that_never_finishes_its_headers_is_disconnected(repository):
    """Slow-loris: 200 connections that send half a request line and stop are closed after the
    header timeout, and the server answers a real request meanwhile."""
    import socket

    with Server(repository, header_timeout=0.5) as running:
        idle = []
        for _ in range(200):
            s = socket.create_connection((running.host, running.port), timeout=10)
            s.sendall(b"POST /v2/models/dense/infer HTTP/1.1\r\nHost: x\r\n")
            idle.append(s)
        assert httpclient.InferenceServerClient(running.url).is_server_live()
        deadline = time.monotonic() + 30  # each recv waits for its connection to be closed
        closed = 0
        for s in idle:
            s.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                closed += s.recv(1) == b""
            except TimeoutError:
                pass
        for s in idle:
            s.close()
        assert closed == 200


def test_unknown_paths_answer_json(server):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    connection.request("GET", "/v2/nothing/here")
    response = connection.getresponse()
    assert response.status == 404 and b'"error"' in response.read()
    connection.close()


def test_32_concurrent_requests_are_batched_and_each_gets_exactly_its_own_rows(server, client):
    import tritonclient.http.aio as aioclient

    before = _metric(client, server, "nv_inference_exec_count", "batched")
    rng = np.random.default_rng(7)
    inputs = [rng.normal(size=(int(rng.integers(1, 4)), 4)).astype(np.float32) + i for i in range(32)]

    async def run_all():
        async with aioclient.InferenceServerClient(server.url) as aio:

            async def one(x):
                tensor = httpclient.InferInput("x", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                result = await aio.infer("batched", [tensor])
                return result.as_numpy("y"), result.as_numpy("total")

            return await asyncio.gather(*(one(x) for x in inputs))

    results = asyncio.run(run_all())
    for x, (y, total) in zip(inputs, results):
        expected_y, expected_total = reference(x)
        assert y.shape == expected_y.shape  # its own number of rows, no more, no fewer
        np.testing.assert_allclose(y, expected_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(total, expected_total, rtol=1e-5, atol=1e-5)
    executions = _metric(client, server, "nv_inference_exec_count", "batched") - before
    assert executions < 32, "requests were not merged"


def _metric(client, server, name, model):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    line = next(line for line in text.splitlines() if line.startswith(f'{name}{{model="{model}"'))
    return float(line.rsplit(" ", 1)[1])


def test_metrics_count_requests_inferences_and_executions(server, client):
    ok = _metric(client, server, "nv_inference_request_success", "dense")
    failed = _metric(client, server, "nv_inference_request_failure", "dense")
    client.infer("dense", [_input(np.ones((3, 4), np.float32))])
    with pytest.raises(InferenceServerException):
        client.infer("dense", [_input(np.ones((3, 5), np.float32))])
    assert _metric(client, server, "nv_inference_request_success", "dense") == ok + 1
    assert _metric(client, server, "nv_inference_request_failure", "dense") == failed + 1
    assert _metric(client, server, "nv_inference_count", "dense") >= 3


def test_repository_index_load_and_unload(client):
    index = {(e["name"], e["version"]): e["state"] for e in client.get_model_repository_index()}
    assert index[("dense", "2")] == "READY" and index[("dense", "1")] == "UNAVAILABLE"
    client.unload_model("strings")
    assert not client.is_model_ready("strings")
    with pytest.raises(InferenceServerException, match="not loaded"):
        client.infer("strings", [_input(np.array([b"a"], dtype=object), "s")])
    client.load_model("strings")
    assert client.is_model_ready("strings")
    with pytest.raises(InferenceServerException, match="Unknown model"):
        client.load_model("nope")


def test_stopping_lets_requests_in_flight_finish(repository, monkeypatch):
    from xdevice.serving.batcher import Batcher

    running = Server(repository).start()
    x = np.ones((1, 4), np.float32)
    arrived = threading.Event()
    submit = Batcher.submit

    async def slow_model(self, *args, **kwargs):
        """The request reached the model: it is in flight until the server stops accepting
        (stop() was called and shutdown began), and then takes 0.3 s more, outlasting the 0.1 s
        that uvicorn pauses before it starts waiting for connections to finish."""
        arrived.set()
        while any(listener.is_serving() for listener in running.server.servers):
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.3)  # the slow inference itself, not a wait for something to happen
        return await submit(self, *args, **kwargs)

    monkeypatch.setattr(Batcher, "submit", slow_model)

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # result() raises the client's error here
        request = pool.submit(httpclient.InferenceServerClient(running.url).infer, "batched", [_input(x)])
        assert arrived.wait(timeout=30), "the request never reached the model"
        running.stop()
        y = request.result().as_numpy("y")
    np.testing.assert_allclose(y, reference(x)[0], rtol=1e-5, atol=1e-6)


def test_a_server_process_that_cannot_start_says_so(tmp_path):
    from xdevice.serving import ServerProcess

    with pytest.raises(RuntimeError, match="did not become ready"):
        with ServerProcess(tmp_path / "no-such-repository", timeout=60):
            pass
