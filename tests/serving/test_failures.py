"""A server never hides a failure: a model that fails to load stops start-up (Triton's
--exit-on-error), or, with that off, is logged and listed with its reason while readiness
says no (--strict-readiness); warm-up and declared tensors are checked at load."""

from __future__ import annotations

import logging
import subprocess
import sys

import numpy as np
import pytest

httpclient = pytest.importorskip("tritonclient.http")
pytest.importorskip("starlette")

from xdevice import ConfigurationError  # noqa: E402 - below the importorskip guard
from xdevice.serving.server import Server, create_app  # noqa: E402 - below the importorskip guard

from .onnx_models import dense_model, write_model  # noqa: E402 - below the importorskip guard

BROKEN = {  # model -> what the index must say about it
    "corrupt": "Cannot parse the ONNX model",
    "typo": "config.pbtxt, line 2: unknown field 'max_batch_sise'",
    "empty": "has no version to serve",
}


@pytest.fixture(scope="module")
def broken_repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("broken")
    write_model(root, "good", dense_model(), versions=(1,))
    write_model(root, "corrupt", b"this is not an ONNX model", versions=(1,))
    write_model(root, "typo", dense_model(), versions=(1,), config='name: "typo"\nmax_batch_sise: 8\n')
    (root / "empty").mkdir()
    return root


def test_by_default_a_model_that_fails_to_load_stops_start_up_naming_each_reason(broken_repository):
    with pytest.raises(ConfigurationError, match="3 models failed to load") as failed:
        create_app(broken_repository)
    for name in BROKEN:
        assert f"{name}: " in str(failed.value)
    assert "--no-exit-on-error" in str(failed.value)


def test_the_command_exits_with_the_reasons(broken_repository):
    done = subprocess.run(
        [sys.executable, "-m", "xdevice", "serve", str(broken_repository), "--port", "0", "--grpc-port", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "failed to load" in done.stderr and "max_batch_sise" in done.stderr
    lines = done.stderr.strip().splitlines()
    for name in BROKEN:  # one line each: the error's, not a log line besides
        assert sum(line.startswith(f"  {name}: ") for line in lines) == 1, done.stderr
        assert not any(f"model {name!r} failed to load" in line for line in lines), done.stderr
    assert lines[-1].startswith("Fix: ") and lines[-1].endswith("to serve the others."), lines[-1]


def test_without_exit_on_error_the_index_says_why_and_readiness_says_no(broken_repository, caplog):
    with caplog.at_level(logging.ERROR, logger="xdevice.serving"):
        running = Server(broken_repository, exit_on_error=False).start()
    try:
        client = httpclient.InferenceServerClient(running.url)
        assert client.is_server_live() and not client.is_server_ready()  # strict readiness
        assert client.is_model_ready("good")
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
        for name, reason in BROKEN.items():
            assert index[name]["state"] == "UNAVAILABLE" and reason in index[name]["reason"], index[name]
        assert index["good"]["state"] == "READY"
        x = httpclient.InferInput("x", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        assert client.infer("good", [x]).as_numpy("total").tolist() == [4.0]
        with pytest.raises(Exception, match="max_batch_sise") as refused:
            client.infer("typo", [x])
        assert refused.value.status() == "503"
    finally:
        running.stop()
    logged = " ".join(record.getMessage() for record in caplog.records)
    assert all(f"model {name!r} failed to load" in logged for name in BROKEN)


def test_without_strict_readiness_the_server_is_ready_when_it_is_up(broken_repository):
    with Server(broken_repository, exit_on_error=False, strict_readiness=False) as running:
        assert httpclient.InferenceServerClient(running.url).is_server_ready()


WARMUP = """max_batch_size: 4
model_warmup [ {{ name: "sample" batch_size: 2 count: 3
                 inputs {{ key: "x" value {{ data_type: TYPE_FP32 dims: [ {dims} ] {data} }} }} }} ]
"""


@pytest.mark.parametrize(
    "dims, data, error",
    [
        ("4", "random_data: true", None),
        ("4", 'input_data_file: "x.bin"', None),
        ("5", "zero_data: true", "warm-up 'sample' of model 'm' failed"),
    ],
)
def test_warm_up_samples_run_before_the_model_is_ready(tmp_path, dims, data, error):
    write_model(tmp_path, "m", dense_model(), versions=(1,), config=WARMUP.format(dims=dims, data=data))
    (tmp_path / "m" / "warmup").mkdir()
    (tmp_path / "m" / "warmup" / "x.bin").write_bytes(np.ones((2, 4), "<f4").tobytes())
    if error is None:
        models = create_app(tmp_path).state.models
        assert models.get("m").session.ready
        return
    with pytest.raises(ConfigurationError, match=error):
        create_app(tmp_path)


@pytest.mark.parametrize(
    "declared, error",
    [
        (
            'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] '
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]',
            None,
        ),
        (
            'input [ { name: "image" data_type: TYPE_FP32 dims: [ 4 ] } ]',
            "input 'image' is not one of the model's inputs",
        ),
        ('input [ { name: "x" data_type: TYPE_INT32 dims: [ 4 ] } ]', "input 'x' has the model's type wrong"),
        ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]', "input 'x' has dims that do not fit the model"),
        ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 5 ] } ]', "output 'y' has dims that do not fit the model"),
    ],
)
def test_declared_inputs_and_outputs_are_checked_against_the_model(tmp_path, declared, error):
    write_model(tmp_path, "m", dense_model(), versions=(1,), config=f"max_batch_size: 4\n{declared}\n")
    if error is None:
        assert create_app(tmp_path).state.models.get("m")
        return
    with pytest.raises(ConfigurationError, match=error):
        create_app(tmp_path)
