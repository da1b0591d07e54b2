"""The ``ai.onnx.preview.training`` domain's optimizer steps (Adagrad, Adam, Momentum)."""

from __future__ import annotations
