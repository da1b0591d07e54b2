"""Small ONNX graphs for the importer's tests, built the same way in every test file."""

from __future__ import annotations

from onnx import helper


def onnx_model(nodes, inputs, outputs, initializers=(), *, opset=18, ir=10, domains=None, name="g"):
    """A ModelProto of ``nodes``: the default domain at ``opset`` plus ``domains``
    (``{"ai.onnx.ml": 5}``), IR ``ir`` (10 is what ONNX Runtime, the reference here, reads)."""
    graph = helper.make_graph(nodes, name, inputs, outputs, list(initializers))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (domains or {}).items()]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = ir
    return model
