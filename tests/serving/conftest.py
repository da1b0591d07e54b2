"""The serving tests' repository, served by the real server on a loopback port."""

from __future__ import annotations

import pytest

from .onnx_models import BATCHED, dense_model, pair_model, strings_model, write_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    pytest.importorskip("onnx")
    root = tmp_path_factory.mktemp("repo")
    write_model(root, "dense", dense_model())
    write_model(root, "batched", dense_model(), config=BATCHED)
    write_model(root, "strings", strings_model())
    write_model(root, "pair", pair_model(), config="max_batch_size: 16")
    write_model(root, "versioned", dense_model(), config="version_policy { all { } }")
    (root / "dense" / "notes").mkdir()  # not a version: ignored
    return root


@pytest.fixture(scope="module")
def server(repository):
    pytest.importorskip("starlette")
    from xdevice.serving.server import Server

    with Server(repository, max_body=1 << 20) as running:
        yield running
