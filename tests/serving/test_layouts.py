"""Repositories diagnosed: each layout a newcomer gets wrong is named with what was found and
the exact fix; one ``.onnx`` file is served as a one-model repository; an empty repository
serves nothing and is not ready, and says so."""

from __future__ import annotations

import http.client
import json
import logging

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
pytest.importorskip("starlette")

from xdevice import ConfigurationError  # noqa: E402 - below the importorskip guard
from xdevice.serving.server import Server, ServerProcess, create_app  # noqa: E402 - below the importorskip guard

from .onnx_models import dense_model, reference, write_model  # noqa: E402 - below the importorskip guard


def place(root, relative: str) -> None:
    """A real model file at ``root/relative``."""
    (root / relative).parent.mkdir(parents=True, exist_ok=True)
    (root / relative).write_bytes(dense_model().SerializeToString())


# layout name -> (files under the repository, the folder served, what the error must say)
LAYOUTS = {
    "model.onnx at the root": (
        ["model.onnx"],
        "",
        "found {r}/model.onnx outside a model folder. Expected {r}/<model>/<version>/model.onnx. "
        "Fix: move it to {r}/<name>/1/model.onnx, or serve the file itself: xdevice serve {r}/model.onnx.",
    ),
    "a named file at the root": (
        ["digits.onnx"],
        "",
        "Fix: move it to {r}/digits/1/model.onnx, or serve the file itself: xdevice serve {r}/digits.onnx.",
    ),
    "model.onnx without a version folder": (
        ["mlp/model.onnx"],
        "",
        "mlp: Model 'mlp' has no version to serve: found {r}/mlp/model.onnx outside a version folder. "
        "Expected {r}/mlp/<version>/model.onnx (Triton's layout; the version a whole number). "
        "Fix: move it to {r}/mlp/1/model.onnx, or serve the file itself: xdevice serve {r}/mlp/model.onnx.",
    ),
    "1/digits.onnx instead of 1/model.onnx": (
        ["digits/1/digits.onnx"],
        "",
        "digits: Model 'digits' has no version to serve: found {r}/digits/1/digits.onnx, but a version's file "
        "must be named model.onnx. Fix: rename it to {r}/digits/1/model.onnx.",
    ),
    "a version folder that is not a number": (
        ["mlp/v1/model.onnx"],
        "",
        "found {r}/mlp/v1/model.onnx, but version folders are whole numbers. "
        "Expected {r}/mlp/<version>/model.onnx (Triton's layout; the version a whole number). "
        "Fix: rename {r}/mlp/v1 to {r}/mlp/1.",
    ),
    "an empty version folder": (
        ["mlp/1/"],
        "",
        "found {r}/mlp/1 with no model.onnx in it. Fix: put the model at {r}/mlp/1/model.onnx.",
    ),
    "a model folder with nothing in it": (
        ["mlp/"],
        "",
        "{r}/mlp holds no version folder. Expected {r}/mlp/<version>/model.onnx (Triton's layout; the version "
        "a whole number). Fix: export the model to {r}/mlp/1/model.onnx, or serve one .onnx file by itself "
        "(xdevice serve <file>.onnx: a one-model repository).",
    ),
    "serve pointed at a model folder": (
        ["mlp/1/model.onnx"],
        "mlp",
        "{r}/mlp is one model's folder, not a repository of models: found {r}/mlp/1/model.onnx. "
        "Expected a folder holding model folders, {r}/mlp/<model>/<version>/model.onnx. "
        "Fix: serve the folder above it: xdevice serve {r} (it serves 'mlp' as one of its models).",
    ),
    "serve pointed at a version folder": (
        ["mlp/1/model.onnx"],
        "mlp/1",
        "found {r}/mlp/1/model.onnx: {r}/mlp/1 is version 1 of model 'mlp', not a repository of models. "
        "Fix: serve the repository that holds it: xdevice serve {r}, or the file itself: "
        "xdevice serve {r}/mlp/1/model.onnx.",
    ),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_wrong_layout_is_named_with_what_was_found_and_the_fix(tmp_path, layout):
    files, served, said = LAYOUTS[layout]
    for relative in files:
        if relative.endswith("/"):
            (tmp_path / relative).mkdir(parents=True)
        else:
            place(tmp_path, relative)
    with pytest.raises(ConfigurationError) as failed:
        create_app(tmp_path / served)
    assert said.format(r=tmp_path) in str(failed.value)
    assert "versions on disk" not in str(failed.value)


def test_a_version_policy_that_selects_nothing_names_the_versions_on_disk(tmp_path):
    write_model(tmp_path, "m", dense_model(), versions=(1, 2), config="version_policy { specific { versions: [3] } }")
    with pytest.raises(ConfigurationError) as failed:
        create_app(tmp_path)
    assert (
        f"version_policy in {tmp_path}/m/config.pbtxt selects none of the versions on disk. Expected version 3. "
        f"Received: [1, 2]. Fix: add {tmp_path}/m/3/model.onnx, or change version_policy." in str(failed.value)
    )


def test_a_load_failure_is_one_line_per_model_and_the_last_line_is_the_whole_fix(tmp_path):
    place(tmp_path, "good/1/model.onnx")
    place(tmp_path, "flat/model.onnx")
    place(tmp_path, "digits/1/digits.onnx")
    (tmp_path / "corrupt" / "1").mkdir(parents=True)
    (tmp_path / "corrupt" / "1" / "model.onnx").write_bytes(b"not\nan\nONNX model")
    with pytest.raises(ConfigurationError) as failed:
        create_app(tmp_path)
    lines = str(failed.value).splitlines()
    assert lines[0] == "3 models failed to load:"
    assert [line.split(":")[0] for line in lines[1:-1]] == ["  corrupt", "  digits", "  flat"]
    assert lines[-1] == (
        "Fix: correct each as its line says, or pass --no-exit-on-error (exit_on_error=False) to serve the others."
    )


def test_one_onnx_file_is_served_as_a_one_model_repository_named_after_it(tmp_path):
    place(tmp_path, "digits.onnx")
    with ServerProcess(tmp_path / "digits.onnx", threads=1) as server:  # `xdevice serve digits.onnx`
        client = httpclient.InferenceServerClient(server.url)
        x = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
        tensor = httpclient.InferInput("x", [2, 4], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("digits", [tensor])
        assert client.get_model_metadata("digits")["versions"] == ["1"]
    np.testing.assert_allclose(result.as_numpy("y"), reference(x)[0], rtol=1e-5, atol=1e-6)


def _ready(server) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=30)
    connection.request("GET", "/v2/health/ready")
    answer = connection.getresponse()
    status, body = answer.status, json.loads(answer.read())
    connection.close()
    return status, body


def test_an_empty_repository_is_not_ready_and_says_why_until_a_model_is_loaded(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="xdevice.serving"), Server(tmp_path) as server:
        status, body = _ready(server)
        assert status == 503 and body["ready"] is False
        assert f"the repository {tmp_path} holds no model" in body["error"]
        assert f"Fix: put a model at {tmp_path}/<model>/1/model.onnx" in body["error"]
        assert not grpcclient.InferenceServerClient(server.grpc_url).is_server_ready()
        assert f"Not ready: the repository {tmp_path} holds no model" in caplog.text  # said at start-up

        place(tmp_path, "mlp/1/model.onnx")
        httpclient.InferenceServerClient(server.url).load_model("mlp")
        assert _ready(server) == (200, {"ready": True})


def test_without_strict_readiness_an_empty_repository_is_not_ready_either(tmp_path):
    with Server(tmp_path, strict_readiness=False) as server:
        assert not httpclient.InferenceServerClient(server.url).is_server_ready()
