"""The server holds a response's headers to send them with its body in one write; a
``100 Continue`` is not a response's headers, and goes out at once (the client waits on it)."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("orjson")  # the serving extra: absent on the GPU image (make test-gpu)
import orjson

BODY = orjson.dumps({"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]})


def _connect(server) -> socket.socket:
    connection = socket.create_connection((server.host, server.port), timeout=10)
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _head(path: str, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(BODY)}\r\n{extra}\r\n"
    ).encode()


def test_a_client_expecting_100_continue_gets_it_before_sending_the_body(server):
    with _connect(server) as connection:
        connection.sendall(_head("/v2/models/dense/infer", "Expect: 100-continue\r\n"))
        assert connection.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        connection.sendall(BODY)
        answer = b""
        while b'"outputs"' not in answer:
            answer += connection.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200")


def test_a_head_request_on_a_kept_connection_gets_its_headers_and_the_next_request_its_answer(server):
    # HEAD writes no body: the held headers must still go out when the response completes
    with _connect(server) as connection:
        connection.sendall(b"HEAD /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer:
            answer += connection.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200")
        connection.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while b"live" not in answer:
            answer += connection.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200") and b'"live":true' in answer.replace(b" ", b"")
