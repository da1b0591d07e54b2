"""Memory stays bounded on large and oversized bodies: measured on a real ``xdevice serve``
process through its resident set (VmRSS, VmHWM in /proc/<pid>/status)."""

from __future__ import annotations

import http.client
import sys

import numpy as np
import pytest

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
import orjson

from .onnx_models import dense_model, write_model

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/<pid>/status")
MiB = 2**20


def memory(pid: int, field: str = "VmRSS") -> int:
    """``field`` of /proc/<pid>/status, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("starlette")
    from xdevice.serving.server import ServerProcess

    root = tmp_path_factory.mktemp("repo")
    write_model(root, "dense", dense_model(), versions=(1,))
    with ServerProcess(root, threads=1) as server:
        yield server


def post(server, body: bytes) -> tuple[int, bytes]:
    host, port = server.url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        connection.request("POST", "/v2/models/dense/infer", body, {"Content-Type": "application/json"})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def oversized_chunked_upload(server, size: int) -> int:
    """POST ``size`` bytes in 1 MiB chunks without a Content-Length; the status answered."""
    host, port = server.url.split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    chunk = b"1" * MiB
    try:
        connection.putrequest("POST", "/v2/models/dense/infer")
        connection.putheader("Transfer-Encoding", "chunked")
        connection.endheaders()
        try:
            for _ in range(size // MiB):
                connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            connection.send(b"0\r\n\r\n")
        except OSError:  # the server answered and closed before all of it was sent
            pass
        answer = connection.getresponse()
        assert answer.getheader("connection") == "close"
        return answer.status
    finally:
        connection.close()


def json_body(rows: int) -> tuple[bytes, np.ndarray]:
    values = np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32)
    request = {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, 4], "data": values.reshape(-1).tolist()}],
        "outputs": [{"name": "total", "parameters": {"binary_data": True}}],
    }
    return orjson.dumps(request), values


def test_rejected_oversized_uploads_leave_memory_where_it_was(served):
    small, _ = json_body(2)
    assert post(served, small)[0] == 200
    baseline = memory(served.process.pid)
    for _ in range(6):
        assert oversized_chunked_upload(served, 80 * MiB) == 413
    assert post(served, small)[0] == 200  # still serving
    grown = memory(served.process.pid) - baseline
    assert grown < 32 * MiB, f"RSS grew {grown / MiB:.0f} MiB after six rejected 80 MiB uploads"


def test_large_json_body_is_decoded_without_a_python_object_per_value(served):
    body, values = json_body(750_000)  # 3 M float32 values: a 12 MB tensor in a ~60 MiB body
    assert 40 * MiB < len(body) < 64 * MiB
    before = memory(served.process.pid)
    for _ in range(2):
        status, answer = post(served, body)
        assert status == 200, answer[:300]
    header_length = answer.index(b"}]}") + 3
    total = np.frombuffer(answer[header_length:], np.float32)
    np.testing.assert_allclose(total, values.sum(axis=1), rtol=1e-5, atol=1e-5)
    peak = memory(served.process.pid, "VmHWM") - before
    # the body, the tensor and a float64 slice of work; a Python float per value alone is 3 M x 32 B
    assert peak < len(body) + 3 * values.nbytes + 32 * MiB, f"peak RSS {peak / MiB:.0f} MiB over the start"
    assert memory(served.process.pid) - before < 64 * MiB
