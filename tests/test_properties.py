"""Property-based tests (Hypothesis) for every parser a user feeds text to: device names,
memory sizes, the command line, and V2 request bodies sent to a running server. Generated
good input parses to what it says; generated bad input gets xdevice's own error (or a 4xx
from the server, which then answers the next good request), never a crash."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("hypothesis")  # the test extra; a bare GPU image may lack it

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import xdevice
from xdevice import ConfigurationError, DeviceNotFound
from xdevice._types import parse_bytes

KINDS = {
    "cpu": "cpu",
    "gpu": "gpu",
    "cuda": "gpu",
    "rocm": "gpu",
    "hip": "gpu",
    "mps": "gpu",
    "metal": "gpu",
    "tpu": "tpu",
}
SPELLINGS = [
    "{kind}:{n}",
    "{KIND}:{n}",
    "/{KIND}:{n}",
    "/device:{KIND}:{n}",
    "/physical_device:{KIND}:{n}",
    "/job:localhost/replica:0/task:0/device:{KIND}:{n}",
    "{kind}_{n}",
]


@given(kind=st.sampled_from(sorted(KINDS)), index=st.integers(0, 4096), spelling=st.sampled_from(SPELLINGS))
def test_every_native_spelling_of_a_device_parses_and_round_trips(kind, index, spelling):
    parsed = xdevice.device(spelling.format(kind=kind, KIND=kind.upper(), n=index))
    assert parsed == xdevice.Device(KINDS[kind], index)
    assert xdevice.device(str(parsed)) == parsed


@given(st.text(max_size=40))
def test_any_text_as_a_device_is_a_device_or_a_device_not_found(text):
    try:
        parsed = xdevice.device(text)
    except DeviceNotFound as error:
        assert str(error)  # says what was wrong
    else:
        assert parsed.kind in ("cpu", "gpu", "tpu") and parsed.index >= 0


UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@given(
    number=st.integers(1, 10**6),
    unit=st.sampled_from(sorted(UNITS)),
    upper=st.booleans(),
    space=st.sampled_from(["", " "]),
)
def test_a_memory_size_in_any_unit_parses_to_its_bytes(number, unit, upper, space):
    text = f"{number}{space}{unit.upper() if upper else unit}"
    assert parse_bytes(text) == number * UNITS[unit]


@given(
    st.one_of(
        st.text(max_size=30),
        st.integers(-(10**20), 10**20),
        st.floats(allow_nan=True),
        st.none(),
        st.booleans(),
        st.lists(st.integers(), max_size=3),
    )
)
def test_any_value_as_a_memory_size_is_bytes_or_a_configuration_error(value):
    try:
        found = parse_bytes(value)
    except ConfigurationError as error:
        assert "memory_limit" in str(error)
    else:
        assert isinstance(found, int) and 0 < found < 2**63


WORDS = [
    "devices",
    "doctor",
    "parity",
    "export",
    "convert",
    "conformance",
    "serve",
    "launch",
    "--json",
    "--machine",
    "--models",
    "mlp",
    "--backend",
    "torch",
    "jax",
    "--opset",
    "18",
    "99",
    "--to",
    "x.onnx",
    "--dynamic-axis",
    "1=seq",
    "seq",
    "--port",
    "-1",
    "--batch",
    "0",
    "--",
    "--verbose",
    "--nproc-per-node",
]


@settings(max_examples=200)
@given(st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=6))
def test_any_command_line_parses_or_is_a_usage_error(argv):
    """argparse's exits (2: usage, 0: --help/--version) and nothing else: no traceback."""
    import contextlib
    import io

    from xdevice.cli import build_parser

    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(argv)
        except SystemExit as stop:
            assert stop.code in (0, 2)


# -- V2 request bodies against the real server ---------------------------------------------

JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
TENSOR = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "y", "", "X"]),
        "shape": st.one_of(st.lists(st.integers(-2, 6), max_size=3), JSON_VALUES),
        "datatype": st.sampled_from(["FP32", "FP64", "INT64", "BYTES", "BOOL", "FP16", "fp32", "NOPE"]),
        "data": st.one_of(st.lists(st.floats(-10, 10), max_size=12), JSON_VALUES),
    }
)
BODIES = st.one_of(
    st.fixed_dictionaries(
        {"inputs": st.lists(TENSOR, max_size=2)},
        optional={
            "outputs": st.lists(st.dictionaries(st.sampled_from(["name", "parameters"]), JSON_VALUES), max_size=2),
            "parameters": JSON_VALUES,
            "id": JSON_VALUES,
        },
    ).map(json.dumps),
    JSON_VALUES.map(json.dumps),
    st.text(max_size=40),
)
GOOD = {"inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": [0.5] * 8}]}


def _post(url: str, body: bytes, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.fixture(scope="module")
def dense_server(tmp_path_factory):
    pytest.importorskip("starlette")
    from tests.serving.onnx_models import dense_model, write_model
    from xdevice.serving.server import Server

    root = tmp_path_factory.mktemp("repo")
    write_model(root, "dense", dense_model())
    with Server(root, max_body=1 << 16) as running:
        yield f"http://{running.url}/v2/models/dense/infer"


def _answers_a_good_request(url: str) -> None:
    status, body = _post(url, json.dumps(GOOD).encode())
    assert status == 200 and np.asarray(json.loads(body)["outputs"][0]["data"]).size == 6


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODIES)
def test_any_json_body_gets_an_answer_or_a_4xx_and_the_server_keeps_serving(dense_server, body):
    status, answer = _post(dense_server, body.encode())
    assert status == 200 or 400 <= status < 500, (status, body, answer[:300])
    if status != 200:
        assert json.loads(answer)["error"]  # a V2 error body that says why
    _answers_a_good_request(dense_server)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    header=BODIES,
    tail=st.binary(max_size=64),
    length=st.one_of(st.integers(-5, 200), st.text(alphabet="0123456789-+ abc", max_size=4)),
)
def test_any_binary_body_gets_an_answer_or_a_4xx_and_the_server_keeps_serving(dense_server, header, tail, length):
    body = header.encode() + tail
    status, answer = _post(
        dense_server, body, {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)}
    )
    assert status == 200 or 400 <= status < 500, (status, body[:200], answer[:300])
    _answers_a_good_request(dense_server)
