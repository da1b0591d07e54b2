"""Attention as PyTorch's exporter spells it (MatMul, Mul, a mask's Add, Softmax, an IsNaN
guard, MatMul) runs as one ``ops.attention`` call once imported, with the graph's answers."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX import tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper

from xdevice import compare, models
from xdevice.converters import export
from xdevice.converters.importer import from_onnx
from xdevice.converters.importer.interpreter import Context, Graph, run_graph

LOWEST = float(np.finfo(np.float32).min)  # the fill torch's exporter writes


def _attention_graph(fill=LOWEST, mask=True, guard=True, probs_out=False):
    """``softmax(q*a @ k_t*b + where(mask, 0, fill)) @ v`` with ``where(isnan(p), 0, p)``;
    ``probs_out`` also makes the probabilities a graph output (so they cannot be fused away)."""
    const = lambda name, value: numpy_helper.from_array(np.asarray(value, np.float32), name)
    nodes = [
        helper.make_node("Mul", ["q", "a"], ["qa"]),
        helper.make_node("Mul", ["k_t", "b"], ["kb"]),
        helper.make_node("MatMul", ["qa", "kb"], ["s"]),
    ]
    scores = "s"
    if mask:
        nodes.append(helper.make_node("Where", ["mask", "zero", "fill"], ["bias"]))
        nodes.append(helper.make_node("Add", ["s", "bias"], ["sm"]))
        scores = "sm"
    nodes.append(helper.make_node("Softmax", [scores], ["p"], axis=-1))
    probs = "p"
    if guard:
        nodes += [helper.make_node("IsNaN", ["p"], ["nan"]), helper.make_node("Where", ["nan", "zero", "p"], ["pg"])]
        probs = "pg"
    nodes.append(helper.make_node("MatMul", [probs, "v"], ["y"]))
    f = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    inputs = [f("q", [2, 3, 5, 4]), f("k_t", [2, 3, 4, 6]), f("v", [2, 3, 6, 4])]
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 1, 5, 6]))
    outputs = [f("y", [2, 3, 5, 4])] + ([f("p", [2, 3, 5, 6])] if probs_out else [])
    constants = [const("a", 0.7), const("b", [0.5]), const("zero", 0.0), const("fill", fill)]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _inputs(mask=True):
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=s).astype(np.float32) for s in ((2, 3, 5, 4), (2, 3, 4, 6), (2, 3, 6, 4))]
    if mask:
        allowed = rng.random((2, 1, 5, 6)) < 0.6
        allowed[0, 0, 1] = False  # a fully masked row
        allowed[1, 0, 2] = True
        arrays.append(allowed)
    return arrays


def as_written(proto, backend, inputs):
    """The graph's outputs interpreted node by node, nothing fused (a -inf fill's fully masked
    row is NaN until the guard: numpy's warning about it is the graph's own doing)."""
    opsets = {("" if i.domain == "ai.onnx" else i.domain): i.version for i in proto.opset_import}
    graph = Graph(proto.graph, opsets)
    graph.bind()
    feeds = dict(zip(graph.inputs, map(backend.ops.asarray, inputs), strict=True))
    with np.errstate(invalid="ignore"):
        return [backend.ops.to_numpy(y) for y in run_graph(graph, Context(backend), feeds)]


@pytest.mark.parametrize(
    "fill, mask, guard",
    [(LOWEST, True, True), (LOWEST, True, False), (-np.inf, True, True), (LOWEST, False, True), (LOWEST, False, False)],
    ids=["lowest", "lowest-unguarded", "inf", "unmasked", "unmasked-unguarded"],
)
def test_the_fused_attention_gives_the_graphs_answers(backend, fill, mask, guard):
    proto = _attention_graph(fill, mask, guard)
    imported = from_onnx(proto, backend=backend.name)
    assert imported.fused == 1 and [n.op for n in imported.graph.nodes] == ["Attention"]
    inputs = _inputs(mask)
    [expected] = as_written(proto, backend, inputs)
    got = backend.ops.to_numpy(imported(*inputs))
    assert not np.isnan(expected).any()
    assert compare(got, expected, "float32").ok
    if mask:  # the fully masked row: 0 with a -inf fill (the guard), uniform attention with the lowest
        uniform = inputs[2][0].mean(axis=-2)
        np.testing.assert_allclose(got[0, :, 1], 0.0 if fill == -np.inf else uniform, atol=1e-5)


@pytest.mark.parametrize(
    "graph",
    [
        _attention_graph(fill=-1e4),  # a fully masked row would attend by score, not uniformly
        _attention_graph(fill=-np.inf, guard=False),  # a fully masked row is NaN
        _attention_graph(probs_out=True),  # the probabilities are read
    ],
    ids=["small-fill", "inf-unguarded", "probabilities-read"],
)
def test_a_look_alike_stays_as_written(graph):
    imported = from_onnx(graph, backend="numpy")
    assert imported.fused == 0 and len(imported.graph.nodes) == len(graph.graph.node)
    inputs = _inputs()
    with np.errstate(invalid="ignore"):  # the unguarded -inf fill's NaN row, as written
        outputs = imported(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for got, expected in zip(outputs, as_written(graph, imported.backend, inputs), strict=True):
        np.testing.assert_array_equal(got, expected)


def test_the_zoo_transformer_exported_from_torch_runs_its_attention_fused():
    pytest.importorskip("torch")
    model = models.build("transformer", seed=0)
    proto = export(model.to("torch"), example_inputs=model.example_input(2)).model
    imported = from_onnx(proto, backend="torch")
    softmaxes = sum(node.op_type == "Softmax" for node in proto.graph.node)
    assert softmaxes == 2 and [n.op for n in imported.graph.nodes].count("Attention") == softmaxes
    assert not any(n.op in ("Softmax", "IsNaN") for n in imported.graph.nodes)
    x = model.example_input(3, seed=2)
    x[1, 2:] = 0  # padding: a masked tail
    [expected] = as_written(proto, imported.backend, [x])
    assert compare(np.asarray(imported(x)), expected, "float32").ok
