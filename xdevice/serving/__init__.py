"""Serving exported models with ONNX Runtime (``xdevice.serving``, ``xdevice serve``).

- ``Session`` (``session.py``): an ONNX Runtime session on an xdevice ``Device`` that reports
  the execution providers really in use, per node where ONNX Runtime can say.
- ``Repository`` (``repository.py``): Triton's model-repository layout; ``config.py`` reads a
  model's ``config.pbtxt`` against Triton's own ``ModelConfig`` message.
- ``DataPlane`` (``dataplane.py``): every behaviour of the server, written once: infer,
  health, metadata, statistics, model control and the error table, over the model table
  (``models.py``), dynamic batching (``batcher.py``), statistics and Prometheus metrics
  (``metrics.py``).
- ``Server`` / ``ServerProcess`` / ``serve`` (``server.py``): the Open Inference Protocol (KServe V2)
  over HTTP with the binary tensor extension, and over gRPC (``grpc_service.py``), both thin
  adapters over one ``DataPlane``.

Importing this package imports neither ONNX Runtime nor the web stack until used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DataPlane", "ModelConfig", "Repository", "Server", "ServerProcess", "Session", "TensorSpec", "serve"]

_HOMES = {
    "DataPlane": "dataplane",
    "Session": "session",
    "TensorSpec": "session",
    "Repository": "repository",
    "ModelConfig": "config",
    "Server": "server",
    "ServerProcess": "server",
    "serve": "server",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'xdevice.serving' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"xdevice.serving.{_HOMES[name]}"), name)
