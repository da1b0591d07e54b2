"""The server as it starts, answers health, takes model control and stops, tried the way a
deployment and the standard clients use it: a port another server holds stops start-up with
one line and exit 2; health and model readiness answer the Open Inference Protocol's bodies;
a load's ``config`` and ``file:`` overrides are applied or refused by name, on both
transports; SIGTERM drains the request in flight and exits 0."""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np
import pytest

pytest.importorskip("starlette")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402 - below the importorskip guard

from xdevice.serving.server import Server, _free_port  # noqa: E402 - below the importorskip guard

from .onnx_models import dense_model, pair_model, reference, write_model  # noqa: E402 - below the guard

SERVE = [sys.executable, "-m", "xdevice", "serve"]
ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


def _get(server, path, method="GET", body=None):
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    connection.request(method, path, body=body)
    answer = connection.getresponse()
    raw = answer.read()
    connection.close()
    return answer.status, json.loads(raw) if raw else None


# -- ports -------------------------------------------------------------------------------------


@pytest.mark.parametrize("taken", ["--port", "--grpc-port"])
def test_a_port_another_server_holds_stops_start_up_with_one_line_and_exit_2(server, repository, taken):
    ports = {"--port": str(_free_port()), "--grpc-port": str(_free_port())}
    ports[taken] = str(server.port if taken == "--port" else server.app.state.grpc_port)
    second = subprocess.run(
        [*SERVE, str(repository), *[part for flag, port in ports.items() for part in (flag, port)]],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2, second.stderr
    assert len(lines) == 1, second.stderr
    assert f"Port {ports[taken]} on 127.0.0.1 is already in use" in lines[0] and taken in lines[0]
    assert "Traceback" not in second.stderr and "serving" not in second.stderr + second.stdout
    assert httpclient.InferenceServerClient(server.url).is_server_ready()  # the first one still serves


def test_the_grpc_port_is_not_shared_with_a_server_that_asks_for_port_reuse(server):
    import grpc

    # gRPC's default is SO_REUSEPORT: were ours too, this one would bind and take half the requests
    other = grpc.server(concurrent.futures.ThreadPoolExecutor(1))
    try:
        with pytest.raises(RuntimeError):
            other.add_insecure_port(server.grpc_url)
    finally:
        other.stop(None)


# -- the Open Inference Protocol's health bodies ------------------------------------------------


def test_health_and_model_readiness_answer_the_protocols_bodies(server):
    assert _get(server, "/v2/health/live") == (200, {"live": True})
    assert _get(server, "/v2/health/ready") == (200, {"ready": True})
    assert _get(server, "/v2/models/dense/ready") == (200, {"name": "dense", "ready": True})
    assert _get(server, "/v2/models/dense/versions/2/ready") == (200, {"name": "dense", "ready": True})
    assert _get(server, "/v2/models/nope/ready")[0] == 404
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("dense")
    assert not client.is_model_ready("nope")


def test_a_server_that_is_not_ready_says_ready_false_with_the_reason(tmp_path):
    with Server(tmp_path) as empty:
        status, body = _get(empty, "/v2/health/ready")
        assert status == 503 and body["ready"] is False and "holds no model" in body["error"]
        assert _get(empty, "/v2/health/live") == (200, {"live": True})


# -- model control: overrides applied, or refused by name -----------------------------------------


@pytest.fixture
def control(tmp_path):
    write_model(tmp_path, "dense", dense_model(), versions=(1,))
    with Server(tmp_path) as running:
        yield running


def test_a_config_override_on_load_replaces_the_models_configuration(control):
    client = httpclient.InferenceServerClient(control.url)
    assert client.get_model_config("dense")["max_batch_size"] == 0
    client.load_model("dense", config=json.dumps({"max_batch_size": 8, "dynamic_batching": {}}))
    config = client.get_model_config("dense")
    assert config["max_batch_size"] == 8 and "dynamic_batching" in config
    client.load_model("dense")  # a load without overrides goes back to the repository's
    assert client.get_model_config("dense")["max_batch_size"] == 0


def test_a_file_override_on_load_serves_the_bytes_it_carries(control):
    client = httpclient.InferenceServerClient(control.url)
    client.load_model("dense", config="{}", files={"file:3/model.onnx": pair_model().SerializeToString()})
    metadata = client.get_model_metadata("dense")
    assert metadata["versions"] == ["3"] and [i["name"] for i in metadata["inputs"]] == ["a", "b", "n"]


def test_overrides_over_grpc_are_applied_the_same(control):
    client = grpcclient.InferenceServerClient(control.grpc_url)
    client.load_model("dense", config=json.dumps({"max_batch_size": 4}))
    assert client.get_model_config("dense").config.max_batch_size == 4
    client.load_model("dense", config="{}", files={"file:2/model.onnx": dense_model().SerializeToString()})
    assert client.get_model_metadata("dense").versions == ["2"]
    x = np.ones((2, 4), np.float32)
    tensor = grpcclient.InferInput("x", [2, 4], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer("dense", [tensor]).as_numpy("y"), reference(x)[0], rtol=1e-5)


@pytest.mark.parametrize(
    "parameters, named",
    [
        ({"file:1/weights.bin": base64.b64encode(b"x").decode(), "config": "{}"}, "file:1/weights.bin"),
        ({"file:1/model.onnx": base64.b64encode(b"x").decode()}, "needs a 'config' parameter too"),
        ({"unload_dependents": True}, "unload_dependents"),
        ({"config": '{"max_batch_sise": 8}'}, "max_batch_sise"),
        ({"file:1/model.onnx": "not base64!", "config": "{}"}, "must be the file's bytes in base64"),
    ],
    ids=["other file", "file without config", "unknown parameter", "misspelt field", "not base64"],
)
def test_a_load_parameter_that_cannot_be_applied_is_refused_by_name(control, parameters, named):
    status, body = _get(
        control, "/v2/repository/models/dense/load", "POST", json.dumps({"parameters": parameters}).encode()
    )
    assert status == 400 and named in body["error"]
    assert httpclient.InferenceServerClient(control.url).get_model_config("dense")["max_batch_size"] == 0


def test_a_refused_load_over_grpc_names_the_parameter(control):
    client = grpcclient.InferenceServerClient(control.grpc_url)
    with pytest.raises(InferenceServerException, match="file:1/model.onnx"):
        client.load_model("dense", files={"file:1/model.onnx": b"x"})


# -- clean shutdown ----------------------------------------------------------------------------


SLOW = """max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 2000000 }
"""


def test_sigterm_answers_the_request_in_flight_and_exits_0(tmp_path):
    write_model(tmp_path, "slow", dense_model(), versions=(1,), config=SLOW)  # a lone request waits 2 s
    port = _free_port()
    log = tmp_path / "log.txt"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [*SERVE, str(tmp_path), "--port", str(port), "--grpc-port", "0", "--shutdown-timeout", "20"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=ENV,
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5) as ready:
                    if ready.status == 200:
                        break
            except OSError:
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        x = np.ones((1, 4), np.float32)
        answers = []
        request = threading.Thread(
            target=lambda: answers.append(
                httpclient.InferenceServerClient(f"127.0.0.1:{port}").infer("slow", [_tensor(x)])
            )
        )
        request.start()
        time.sleep(0.7)  # the request is waiting in the batcher's queue
        process.send_signal(signal.SIGTERM)
        request.join(60)
        assert process.wait(60) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    np.testing.assert_allclose(answers[0].as_numpy("y"), reference(x)[0], rtol=1e-5, atol=1e-6)
    assert "drained 1 request(s) in flight" in log.read_text()


def _tensor(x):
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return tensor


# -- advice that points to things that exist ---------------------------------------------------


def test_the_load_url_a_not_loaded_model_suggests_is_the_one_that_loads_it(control):
    import re

    client = httpclient.InferenceServerClient(control.url)
    client.unload_model("dense")
    with pytest.raises(InferenceServerException) as refused:
        client.infer("dense", [_tensor(np.ones((1, 4), np.float32))])
    method, path = re.search(r"Fix: (POST) (\S+/load)", str(refused.value)).groups()
    assert _get(control, path, method)[0] == 200
    assert client.is_model_ready("dense")
