"""JSON tensors both ways: decoded into numpy with no Python work per value, encoded by orjson
straight from the array, exact for every numeric datatype."""

from __future__ import annotations

import sys

import numpy as np
import pytest

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
import orjson

from xdevice.serving.protocol import BadRequest, InferRequest, decode_request, encode_response

httpclient = pytest.importorskip("tritonclient.http")


def _json_body(x: np.ndarray, datatype: str) -> bytes:
    """The infer body ``tritonclient.http`` sends for ``x`` as JSON (``binary_data=False``)."""
    from tritonclient.http._utils import _get_inference_request

    tensor = httpclient.InferInput("x", list(x.shape), datatype)
    tensor.set_data_from_numpy(x, binary_data=False)
    body, _ = _get_inference_request([tensor], "", None, 0, 0, 0, 0, None, None)
    return body.encode() if isinstance(body, str) else body


def _python_calls(action) -> int:
    """How many Python-level function calls (generator steps included) ``action`` makes."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        calls += event == "call"

    sys.setprofile(count)
    try:
        action()
    finally:
        sys.setprofile(None)
    return calls


@pytest.mark.parametrize(
    "datatype, values",
    [
        ("FP32", np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)),
        ("FP16", np.array([[0.5, -65504.0, 1e-3]], np.float16)),
        ("FP64", np.array([[1e300, -2.5e-300, 0.1]])),
        ("INT8", np.array([[-128, 0, 127]], np.int8)),
        ("INT64", np.array([[-(2**63), 2**63 - 1, 7]], np.int64)),
        ("UINT64", np.array([[0, 2**64 - 1, 3]], np.uint64)),
        ("BOOL", np.array([[True, False, True]])),
    ],
)
def test_json_data_decode_to_exactly_the_array_the_client_sent(datatype, values):
    decoded = decode_request(_json_body(values, datatype), None).inputs["x"]
    assert decoded.dtype == values.dtype and decoded.shape == values.shape
    np.testing.assert_array_equal(decoded, values)


def test_decoding_a_json_tensor_runs_no_python_code_per_value():
    bodies = [_json_body(np.ones((1, n), np.float32), "FP32") for n in (16, 16_384)]
    calls = [_python_calls(lambda body=body: decode_request(body, None)) for body in bodies]
    assert calls[1] == calls[0], f"{calls[1] - calls[0]} more Python calls for 16,368 more values"


def test_the_value_checks_still_hold_on_the_fast_path():
    def body(data, datatype="FP32"):
        entry = {"name": "x", "shape": [1, len(data)], "datatype": datatype, "data": data}
        return orjson.dumps({"inputs": [entry]})

    for data, datatype, says in [
        ([1.0, None, 2.0], "FP32", "Received: 'null'"),
        ([1.0, True, 2.0], "FP32", "Received: 'true'"),
        ([1, 2.5], "INT32", "whole numbers"),
        ([1, 300], "INT8", "beyond INT8's range"),
        ([1.0, 1e6], "FP16", "beyond FP16's range"),
        ([1.0, "2"], "FP32", "Received: '\"2\"'"),
    ]:
        with pytest.raises(BadRequest) as refused:
            decode_request(body(data, datatype), None)
        assert says in str(refused.value), (data, str(refused.value))


def _encoded(value: np.ndarray) -> bytes:
    request = InferRequest(None, {}, {}, [("y", False)], False)
    body, headers = encode_response("m", "1", request, {"y": value})
    assert headers["content-type"] == "application/json"
    return body


def test_json_outputs_are_float32_in_their_shortest_spelling_and_read_back_exactly():
    y = np.random.default_rng(1).standard_normal((4, 250)).astype(np.float32)
    y[0, :3] = [0.1, np.float32(1e-8), np.finfo(np.float32).max]
    body = _encoded(y)
    assert b"0.1," in body and b"0.10000000149011612" not in body
    (output,) = orjson.loads(body)["outputs"]
    assert output["shape"] == [4, 250] and output["datatype"] == "FP32"
    np.testing.assert_array_equal(np.array(output["data"], np.float32).reshape(4, 250), y)


@pytest.mark.parametrize(
    "value",
    [
        np.arange(6, dtype=">i4").reshape(2, 3),  # big-endian
        np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2],  # not contiguous
        np.array([[0.5, -2.0]], np.float16),
        np.array([[True, False]]),
        np.array(3.5, np.float32),  # a scalar
    ],
    ids=["big-endian", "strided", "fp16", "bool", "scalar"],
)
def test_any_numeric_output_array_is_written_as_its_values_row_major(value):
    (output,) = orjson.loads(_encoded(value))["outputs"]
    assert output["shape"] == list(value.shape)
    assert output["data"] == value.reshape(-1).tolist()


def test_a_json_round_trip_through_the_server_gives_the_model_answer(server):
    from .onnx_models import reference

    client = httpclient.InferenceServerClient(server.url)
    x = np.random.default_rng(2).normal(size=(64, 4)).astype(np.float32)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=False)
    result = client.infer("dense", [tensor], outputs=[httpclient.InferRequestedOutput("y", binary_data=False)])
    assert "data" in result.get_response()["outputs"][0]  # JSON, not binary
    np.testing.assert_allclose(result.as_numpy("y"), reference(x)[0], rtol=1e-6, atol=1e-6)
