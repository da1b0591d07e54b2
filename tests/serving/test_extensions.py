"""Triton's extensions a client reaches for, each driven by the unmodified tritonclient over
HTTP and gRPC against the real server on loopback: classification, compression, the log and
trace settings, system shared memory (CUDA shared memory: test_cuda_shared_memory.py)."""

from __future__ import annotations

import gzip
import http.client
import json
import logging
import zlib

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402 - below the importorskip guard

from .onnx_models import dense_model, reference, write_model  # noqa: E402 - below the importorskip guard

LABELS = ["cat", "dog", "bird"]
CLASSED = """max_batch_size: 8
output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] label_filename: "labels.txt" } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    """The conftest's ``server`` serves this: a batching model whose ``y`` has labels."""
    pytest.importorskip("onnx")
    root = tmp_path_factory.mktemp("extensions")
    write_model(root, "classed", dense_model(), versions=(1,), config=CLASSED)
    (root / "classed" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    write_model(root, "dense", dense_model(), versions=(1,))
    return root


@pytest.fixture
def clients(server):
    both = {
        "http": (httpclient, httpclient.InferenceServerClient(server.url)),
        "grpc": (grpcclient, grpcclient.InferenceServerClient(server.grpc_url)),
    }
    yield both
    for _, client in both.values():
        client.close()


def _x(rows=2):
    return np.random.default_rng(1).normal(size=(rows, 4)).astype(np.float32)


def _input(module, x):
    tensor = module.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


def _expected_top(y, k):
    """Triton's strings for the top k of each row of y: value with six decimals, index, label."""
    rows = []
    for row in y:
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
        rows.append([f"{row[i]:f}:{i}:{LABELS[i]}".encode() for i in order])
    return np.array(rows, dtype=object)


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_class_count_returns_the_top_classes_with_their_labels(clients, transport):
    module, client = clients[transport]
    x = _x()
    y, _ = reference(x)
    result = client.infer("classed", [_input(module, x)], outputs=[module.InferRequestedOutput("y", class_count=2)])
    top = result.as_numpy("y")
    assert top.shape == (2, 2)
    np.testing.assert_array_equal(top, _expected_top(y, 2))
    assert "classification" in (
        client.get_server_metadata()["extensions"] if transport == "http" else client.get_server_metadata().extensions
    )


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
def test_compressed_requests_and_responses_round_trip(clients, coding):
    module, client = clients["http"]
    x = _x()
    result = client.infer(
        "dense", [_input(module, x)], request_compression_algorithm=coding, response_compression_algorithm=coding
    )
    np.testing.assert_allclose(result.as_numpy("y"), reference(x)[0], rtol=1e-6)
    grpc_module, grpc_client = clients["grpc"]
    answer = grpc_client.infer("dense", [_input(grpc_module, x)], compression_algorithm=coding)
    np.testing.assert_allclose(answer.as_numpy("y"), reference(x)[0], rtol=1e-6)


def test_responses_are_compressed_from_500_bytes_on_as_accept_encoding_asks(server):
    """A client that accepts gzip (aiohttp asks on every request) gets a small answer as it is,
    where compressing costs more than it saves, and a large one compressed."""
    connection = http.client.HTTPConnection(server.url, timeout=10)
    for rows, compressed in ((1, False), (64, True)):
        x = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
        tensor = {"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": x.ravel().tolist()}
        body = json.dumps({"inputs": [tensor]})
        connection.request("POST", "/v2/models/dense/infer", body, {"Accept-Encoding": "gzip"})
        answer = connection.getresponse()
        content = answer.read()
        assert answer.status == 200 and (answer.getheader("content-encoding") == "gzip") is compressed, rows
        plain = gzip.decompress(content) if compressed else content
        assert len(plain) >= 500 if compressed else len(plain) < 500
        assert b'"outputs"' in plain
    connection.close()


def test_a_compressed_body_that_decompresses_past_the_limit_is_413(server):
    bomb = gzip.compress(b"\0" * (2 << 20))  # 2 MiB of zeros in ~2 KiB; the server's limit is 1 MiB
    connection = http.client.HTTPConnection(server.url, timeout=10)
    connection.request("POST", "/v2/models/dense/infer", bomb, {"Content-Encoding": "gzip"})
    answer = connection.getresponse()
    assert answer.status == 413 and b"decompressed" in answer.read()
    connection.request("POST", "/v2/models/dense/infer", zlib.compress(b"{}")[:-3], {"Content-Encoding": "deflate"})
    answer = connection.getresponse()
    assert answer.status == 400 and b"cut short" in answer.read()
    connection.close()


def test_log_settings_are_reported_and_applied_to_the_server_log(clients, caplog):
    _, client = clients["http"]
    _, grpc = clients["grpc"]
    assert client.get_log_settings()["log_info"] is True
    logger = logging.getLogger("xdevice.serving")
    try:
        assert client.update_log_settings({"log_info": False, "log_format": "ISO8601"})["log_info"] is False
        with caplog.at_level(logging.INFO, "xdevice.serving"):
            logger.info("dropped")
            logger.warning("kept")
        assert [r.getMessage() for r in caplog.records] == ["kept"]
        settings = grpc.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
        assert settings["log_verbose_level"]["uint32_param"] == 1 and settings["log_info"]["bool_param"] is False
        with pytest.raises(InferenceServerException, match="log_file cannot be changed"):
            client.update_log_settings({"log_file": "/tmp/elsewhere.log"})
    finally:
        client.update_log_settings({"log_info": True, "log_verbose_level": 0, "log_format": "default"})
    assert client.get_log_settings()["log_verbose_level"] == 0


def test_trace_settings_are_accepted_stored_and_reported_per_model(clients):
    _, client = clients["http"]
    _, grpc = clients["grpc"]
    assert client.get_trace_settings()["trace_level"] == ["OFF"]
    client.update_trace_settings("dense", {"trace_rate": "7", "trace_level": ["TIMESTAMPS"]})
    assert client.get_trace_settings("dense")["trace_rate"] == "7"
    assert client.get_trace_settings()["trace_rate"] == "1000"  # the server's own is untouched
    over_grpc = grpc.get_trace_settings("dense", as_json=True)["settings"]
    assert over_grpc["trace_level"]["value"] == ["TIMESTAMPS"]
    client.update_trace_settings("dense", {"trace_rate": None})  # back to the server's
    assert client.get_trace_settings("dense")["trace_rate"] == "1000"
    with pytest.raises(InferenceServerException, match="trace_level"):
        client.update_trace_settings(settings={"trace_level": ["LOUD"]})


@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_inputs_and_outputs_through_system_shared_memory(clients, transport):
    import tritonclient.utils.shared_memory as shm

    module, client = clients[transport]
    x = _x(3)
    y, total = reference(x)
    key = f"/xdevice_test_{transport}"
    inputs = shm.create_shared_memory_region("in", key + "_in", x.nbytes)
    outputs = shm.create_shared_memory_region("out", key + "_out", y.nbytes + 64)
    try:
        shm.set_shared_memory_region(inputs, [x])
        client.register_system_shared_memory("in", key + "_in", x.nbytes)
        client.register_system_shared_memory("out", key + "_out", y.nbytes + 64)
        status = client.get_system_shared_memory_status()
        names = [r["name"] for r in status] if transport == "http" else sorted(status.regions)
        assert names == ["in", "out"]
        tensor = module.InferInput("x", list(x.shape), "FP32")
        tensor.set_shared_memory("in", x.nbytes)
        wanted = module.InferRequestedOutput("y")
        wanted.set_shared_memory("out", y.nbytes, offset=64)
        result = client.infer("dense", [tensor], outputs=[wanted, module.InferRequestedOutput("total")])
        np.testing.assert_allclose(shm.get_contents_as_numpy(outputs, np.float32, y.shape, offset=64), y, rtol=1e-6)
        np.testing.assert_allclose(result.as_numpy("total"), total, rtol=1e-6)  # the other output, inline
        small = module.InferRequestedOutput("y")
        small.set_shared_memory("out", y.nbytes - 4)
        with pytest.raises(InferenceServerException, match="does not fit"):
            client.infer("dense", [tensor], outputs=[small])
        client.unregister_system_shared_memory("in")
        with pytest.raises(InferenceServerException, match="Unknown shared-memory region"):
            client.infer("dense", [tensor])
    finally:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inputs)
        shm.destroy_shared_memory_region(outputs)
    status = client.get_system_shared_memory_status()
    assert (list(status) if transport == "http" else list(status.regions)) == []


def test_a_label_file_that_is_missing_or_outside_the_model_folder_is_named(tmp_path):
    from xdevice._errors import ConfigurationError
    from xdevice.serving.config import parse_config

    (tmp_path / "m").mkdir()
    config = '{"output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [3], "label_filename": "%s"}]}'
    with pytest.raises(ConfigurationError, match="cannot read its label_filename"):
        parse_config(config % "labels.txt", tmp_path / "m", "config")
    (tmp_path / "secret.txt").write_text("a\nb\n")
    with pytest.raises(ConfigurationError, match="must name a file in the model's folder"):
        parse_config(config % "../secret.txt", tmp_path / "m", "config")
