"""Fusion at load: patterns that exporters spell out op by op, run as one op-set call.

Exporters write ``x @ W + b`` as MatMul then Add, and exact GELU as Div, Erf, Add and two
Muls. Run node by node, each of those allocates an intermediate and costs a dispatch; the op
set has ``linear`` and ``gelu`` (fused kernels in PyTorch, and the same math everywhere), so
the graph is rewritten once, when the model is loaded, and every call runs the short form.
A pattern is fused only when its intermediate values feed nothing else (no other node, no
subgraph, no graph output) and its constants are what the pattern needs; anything else is
left as written. Compilers (``jax.jit``, ``tf.function``) fuse such chains themselves, so
this matters for eager execution; the results agree with the long form to float rounding.
"""

from __future__ import annotations

import collections
import math
from typing import Any

import numpy as np

from xdevice.converters.importer.interpreter import Graph, Node
from xdevice.converters.importer.registry import Handler

__all__ = ["fuse"]


def _linear(ctx, node, x, w, b):
    return ctx.ops.linear(x, w, b)


def _gelu(ctx, node, x):
    return ctx.ops.gelu(x)


_LINEAR = Handler("Linear", "xdevice", 1, _linear)
_GELU = Handler("Gelu", "xdevice", 1, _gelu)


def fuse(graph: Graph) -> int:
    """Rewrite ``graph``'s top level in place; returns how many patterns were fused."""
    fused = 0
    for find in (_find_linear, _find_gelu):
        while True:
            found = find(graph, _Uses(graph))
            if found is None:
                break
            removed, replacement, position = found  # position: the pattern's last node's
            graph.nodes = [n for n in graph.nodes if n not in removed]
            graph.nodes.insert(position - len(removed) + 1, replacement)  # every other one came before it
            fused += 1
    return fused


class _Uses:
    """Who reads each value name: the nodes of this graph (subgraphs count for their node),
    and the graph's outputs."""

    def __init__(self, graph: Graph):
        self.readers: dict[str, list[Node]] = collections.defaultdict(list)
        for position, node in enumerate(graph.nodes):
            node._position = position
            for name in {*node.inputs, *_outer_reads(node)}:
                if name:
                    self.readers[name].append(node)
        self.outputs = set(graph.outputs)
        self.producer = {name: node for node in graph.nodes for name in node.outputs if name}
        self.graph = graph

    def only_reader(self, name: str) -> Node | None:
        """The one node reading ``name``, when nothing else (no output) does."""
        readers = self.readers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in self.outputs else None

    def constant(self, name: str) -> np.ndarray | None:
        """``name``'s value when it is an initializer or a Constant node's tensor."""
        if name in self.graph.initializers:
            return self.graph.initializers[name]
        node = self.producer.get(name)
        if node is not None and node.op == "Constant" and isinstance(node.attrs.get("value"), np.ndarray):
            return node.attrs["value"]
        return None


def _outer_reads(node: Node) -> set[str]:
    """Names a node's subgraphs read from the enclosing scope (any input they do not make)."""
    names: set[str] = set()
    for value in node.attrs.values():
        for sub in value if isinstance(value, list) else [value]:
            if isinstance(sub, Graph):
                made = set(sub.initializers) | set(sub.inputs)
                for inner, _ in sub.walk():
                    names.update(n for n in inner.inputs if n and n not in made)
                    made.update(inner.outputs)
    return names


def _node(op: str, inputs: list[str], outputs: list[str], handler: Handler, opsets: dict[str, int]) -> Node:
    from onnx import helper

    node = Node(helper.make_node(op, inputs, outputs, name=f"xdevice_{op}_{outputs[0]}", domain="xdevice"), opsets)
    node.handler = handler
    return node


def _find_linear(graph: Graph, uses: _Uses) -> tuple[list[Node], Node, int] | None:
    for matmul in graph.nodes:
        if matmul.op != "MatMul" or matmul.domain_key:
            continue
        x, w_name = matmul.inputs
        w = uses.constant(w_name)
        add = uses.only_reader(matmul.outputs[0])
        if w is None or w.ndim != 2 or w.dtype.kind != "f" or add is None or add.op != "Add":
            continue
        b_name = add.inputs[1] if add.inputs[0] == matmul.outputs[0] else add.inputs[0]
        b = uses.constant(b_name)
        if (
            b is None
            or b.shape != (w.shape[1],)
            or b.dtype != w.dtype
            or w_name not in graph.initializers
            or b_name not in graph.initializers
        ):
            continue  # weights as initializers: they are the model's params
        return [matmul, add], _node("Linear", [x, w_name, b_name], add.outputs, _LINEAR, graph.opsets), add._position
    return None


def _scalar(value: np.ndarray | None, target: float) -> bool:
    return value is not None and value.size == 1 and math.isclose(float(value.reshape(())), target, rel_tol=1e-6)


def _find_gelu(graph: Graph, uses: _Uses) -> tuple[list[Node], Node, int] | None:
    """``x * 0.5 * (1 + erf(x / sqrt(2)))`` in any order of the two products."""
    for div in graph.nodes:
        if div.op != "Div" or div.domain_key or not _scalar(uses.constant(div.inputs[1]), math.sqrt(2)):
            continue
        x = div.inputs[0]
        erf = uses.only_reader(div.outputs[0])
        if erf is None or erf.op != "Erf":
            continue
        add = uses.only_reader(erf.outputs[0])
        if add is None or add.op != "Add" or not _scalar(uses.constant(_other(add, erf.outputs[0])), 1.0):
            continue
        first = uses.only_reader(add.outputs[0])
        if first is None or first.op != "Mul":
            continue
        second = uses.only_reader(first.outputs[0])
        if second is None or second.op != "Mul":
            continue
        factors = {_other(first, add.outputs[0]), _other(second, first.outputs[0])}
        half = [name for name in factors if _scalar(uses.constant(name), 0.5)]
        if len(factors) != 2 or len(half) != 1 or (factors - set(half)) != {x}:
            continue
        return (
            [div, erf, add, first, second],
            _node("Gelu", [x], second.outputs, _GELU, graph.opsets),
            second._position,
        )
    return None


def _other(node: Node, name: str) -> Any:
    """The input of a two-input node that is not ``name``."""
    a, b = node.inputs
    return b if a == name else a
