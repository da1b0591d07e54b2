"""gRPC (GRPCInferenceService) beside HTTP, over the same models, driven by the standard,
unmodified tritonclient.grpc; and the statistics extension on both, consistent with /metrics."""

from __future__ import annotations

import asyncio
import http.client

import numpy as np
import pytest

grpcclient = pytest.importorskip("tritonclient.grpc")
httpclient = pytest.importorskip("tritonclient.http")
from tritonclient.utils import InferenceServerException  # noqa: E402 - below the importorskip guard

from .onnx_models import reference  # noqa: E402 - below the importorskip guard


@pytest.fixture
def client(server):
    return grpcclient.InferenceServerClient(server.grpc_url)


def tensor(name, x):
    from tritonclient.utils import np_to_triton_dtype

    t = grpcclient.InferInput(name, list(x.shape), np_to_triton_dtype(x.dtype))
    t.set_data_from_numpy(x)
    return t


def test_health_metadata_config_and_the_index_over_grpc(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("dense") and not client.is_model_ready("nope")
    metadata = client.get_model_metadata("pair")
    assert [(t.name, t.datatype, list(t.shape)) for t in metadata.inputs] == [
        ("a", "FP32", [-1, 2]),
        ("b", "FP32", [-1, 2]),
        ("n", "INT64", [-1]),
    ]
    assert client.get_model_metadata("versioned").versions == ["1", "2"]
    config = client.get_model_config("batched").config
    assert config.max_batch_size == 8 and config.dynamic_batching.max_queue_delay_microseconds == 50000
    index = {(m.name, m.version): m.state for m in client.get_model_repository_index().models}
    assert index[("dense", "2")] == "READY" and index[("dense", "1")] == "UNAVAILABLE"
    assert "statistics" in client.get_server_metadata().extensions


def test_infer_with_several_inputs_and_outputs_of_several_types(client):
    a, b = np.ones((3, 2), np.float32), np.arange(6, dtype=np.float32).reshape(3, 2)
    n = np.array([1, 2, 3], np.int64)
    result = client.infer("pair", [tensor("a", a), tensor("b", b), tensor("n", n)], request_id="r7")
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
    assert result.as_numpy("count").tolist() == [2, 4, 6] and result.get_response().id == "r7"
    only = client.infer(
        "pair", [tensor("a", a), tensor("b", b), tensor("n", n)], outputs=[grpcclient.InferRequestedOutput("count")]
    )
    assert only.as_numpy("sum") is None and only.as_numpy("count").tolist() == [2, 4, 6]


def test_every_version_the_policy_selects_is_addressable(client):
    x = np.ones((2, 4), np.float32)
    for version in ("1", "2"):
        assert (
            client.infer("versioned", [tensor("x", x)], model_version=version).get_response().model_version == version
        )
    assert client.infer("versioned", [tensor("x", x)]).get_response().model_version == "2"  # the newest


def test_bytes_round_trip_over_grpc(client):
    s = np.array([b"hello", b"", "gr\u00fc\u00df".encode()], dtype=object)
    assert client.infer("strings", [tensor("s", s)]).as_numpy("out").tolist() == s.tolist()


@pytest.mark.parametrize(
    "call, code, text",
    [
        (lambda c: c.infer("nope", [tensor("x", np.ones((1, 4), np.float32))]), "NOT_FOUND", "Unknown model"),
        (
            lambda c: c.infer("dense", [tensor("x", np.ones((1, 4), np.float32))], model_version="7"),
            "NOT_FOUND",
            "no such version",
        ),
        (lambda c: c.infer("dense", [tensor("x", np.ones((1, 5), np.float32))]), "INVALID_ARGUMENT", "wrong shape"),
        (
            lambda c: c.infer("dense", [tensor("X", np.ones((1, 4), np.float32))]),
            "INVALID_ARGUMENT",
            "Model 'dense' got wrong input names",
        ),
        (
            lambda c: c.infer("batched", [tensor("x", np.ones((9, 4), np.float32))]),
            "INVALID_ARGUMENT",
            "max_batch_size",
        ),
    ],
    ids=["unknown-model", "unknown-version", "wrong-shape", "wrong-name", "over-batch"],
)
def test_errors_are_grpc_status_codes_and_the_server_keeps_serving(client, call, code, text):
    with pytest.raises(InferenceServerException) as caught:
        call(client)
    assert caught.value.status() == f"StatusCode.{code}" and text in caught.value.message()
    assert client.infer("dense", [tensor("x", np.ones((1, 4), np.float32))]).as_numpy("total").tolist() == [4.0]


def test_32_concurrent_aio_calls_are_batched_and_each_gets_exactly_its_own_rows(server):
    import tritonclient.grpc.aio as aioclient

    rng = np.random.default_rng(3)
    inputs = [rng.normal(size=(int(rng.integers(1, 4)), 4)).astype(np.float32) + i for i in range(32)]
    before = _stats(server, "batched")["execution_count"]

    async def run_all():
        async with aioclient.InferenceServerClient(server.grpc_url) as aio:
            results = await asyncio.gather(*(aio.infer("batched", [tensor("x", x)]) for x in inputs))
            return [(r.as_numpy("y"), r.as_numpy("total")) for r in results]

    for x, (y, total) in zip(inputs, asyncio.run(run_all())):
        expected_y, expected_total = reference(x)
        assert y.shape == expected_y.shape
        np.testing.assert_allclose(y, expected_y, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(total, expected_total, rtol=1e-5, atol=1e-5)
    assert _stats(server, "batched")["execution_count"] - before < 32, "requests were not merged"


def _stats(server, model):
    [stats] = httpclient.InferenceServerClient(server.url).get_inference_statistics(model)["model_stats"]
    return stats


def _metric(server, name, model, version):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    prefix = f'{name}{{model="{model}",version="{version}"}} '
    return float(next(line for line in text.splitlines() if line.startswith(prefix))[len(prefix) :])


def test_statistics_on_http_and_grpc_agree_with_metrics(server, client):
    x = np.ones((3, 4), np.float32)
    for _ in range(2):
        client.infer("dense", [tensor("x", x)])
    with pytest.raises(InferenceServerException):
        client.infer("dense", [tensor("x", np.ones((3, 5), np.float32))])
    stats = _stats(server, "dense")
    over_grpc = client.get_inference_statistics("dense").model_stats[0]
    inference = stats["inference_stats"]
    assert (stats["name"], stats["version"]) == ("dense", "2") and inference["success"]["count"] >= 2
    assert over_grpc.inference_stats.success.count == inference["success"]["count"]
    assert over_grpc.inference_stats.fail.count == inference["fail"]["count"] >= 1
    # no max_batch_size: each request is one inference (Triton's count), whichever tests ran first
    assert over_grpc.inference_count == stats["inference_count"] == inference["success"]["count"]
    for phase in ("success", "compute_input", "compute_infer", "compute_output"):
        assert inference[phase]["count"] >= 2 and inference[phase]["ns"] > 0
    assert _metric(server, "nv_inference_request_success", "dense", "2") == inference["success"]["count"]
    assert _metric(server, "nv_inference_request_failure", "dense", "2") == inference["fail"]["count"]
    assert _metric(server, "nv_inference_count", "dense", "2") == stats["inference_count"]
    assert _metric(server, "nv_inference_exec_count", "dense", "2") == stats["execution_count"]
    everything = httpclient.InferenceServerClient(server.url).get_inference_statistics()["model_stats"]
    assert {(s["name"], s["version"]) for s in everything} >= {("dense", "2"), ("versioned", "1"), ("versioned", "2")}
