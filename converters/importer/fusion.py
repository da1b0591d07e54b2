"""Fusion at load: patterns that exporters spell out op by op, run as one op-set call.

Exporters write ``x @ W + b`` as MatMul then Add, exact GELU as Div, Erf, Add and two Muls,
and scaled dot-product attention as MatMul, Mul, Add of a mask, Softmax and MatMul (PyTorch's
exporter). Run node by node, each of those allocates an intermediate and costs a dispatch;
the op set has ``linear``, ``gelu`` and ``attention`` (fused kernels in PyTorch, and the same
math everywhere), so the graph is rewritten once, when the model is loaded, and every call
runs the short form.
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


def _attention(ctx, node, q, k_t, v, mask=None):
    """``softmax(q @ k_t * scale + where(mask, 0, fill)) @ v``. With the lowest finite fill,
    a row whose mask allows no key attends uniformly, as ``ops.attention`` does; with a
    ``-inf`` fill that row is NaN, which the graph's IsNaN guard made 0, and so is it here."""
    ops = ctx.ops
    if mask is not None and not node.attr("mask_allows"):  # the graph filled where mask is True
        mask = ops.logical_not(mask)
    y = ops.attention(q, ops.swap_last(k_t), v, mask=mask, scale=node.attr("scale"))
    if mask is not None and node.attr("dead_rows_zero"):
        zero = ops.zeros((), ops.dtype(y))
        allowed = ops.max(ops.cast(mask, ops.dtype(y)), axis=-1, keepdims=True)  # 1 where a key is allowed
        y = ops.where(ops.greater(allowed, zero), y, zero)
    return y


_ATTENTION = Handler("Attention", "xdevice", 1, _attention)


def fuse(graph: Graph) -> int:
    """Rewrite ``graph``'s top level in place; returns how many patterns were fused."""
    fused = 0
    for find in _PATTERNS:
        while True:
            uses = _Uses(graph)
            found = find(graph, uses)
            if found is None:
                break
            removed, replacement, position = found  # position: the pattern's last node's
            # a value a removed node read may now feed nothing (a mask's bias that every
            # attention shared): its maker goes too, with the makers only it read
            before = [uses.producer[name] for node in removed for name in node.inputs if name in uses.producer]
            graph.nodes = [n for n in graph.nodes if n not in removed]
            graph.nodes.insert(position - len(removed) + 1, replacement)  # every other one came before it
            _drop_unread(graph, before)
            fused += 1
    return fused


def _drop_unread(graph: Graph, candidates: list[Node]) -> None:
    """Remove each candidate (and then its own makers) whose outputs nothing reads any more."""
    while candidates:
        uses = _Uses(graph)
        dead = {
            id(node): node
            for node in candidates
            if node in graph.nodes
            and not node.has_subgraph
            and not any(uses.readers.get(name) or name in uses.outputs for name in node.outputs if name)
        }
        if not dead:
            return
        graph.nodes = [n for n in graph.nodes if id(n) not in dead]
        candidates = [uses.producer[name] for node in dead.values() for name in node.inputs if name in uses.producer]


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


def _find_attention(graph: Graph, uses: _Uses) -> tuple[list[Node], Node, int] | None:
    """``MatMul(Where(IsNaN(p), 0, p), v)`` where ``p = Softmax(s + Where(mask, 0, -inf))``
    (or ``Where(mask, -inf, 0)``, or no mask) and ``s = MatMul(q * a, k_t * b)``, each scale
    a scalar constant that may be absent, with ``k_t`` the keys already transposed: PyTorch's
    export of ``scaled_dot_product_attention``. The IsNaN guard is what makes a fully masked
    row 0; without it such a row is NaN, so a masked pattern needs it."""
    opset = graph.opsets.get("", 0)
    for softmax in graph.nodes:
        if softmax.op != "Softmax" or softmax.domain_key or softmax.attr("axis", -1 if opset >= 13 else 1) != -1:
            continue
        removed, probs, guarded = [softmax], softmax.outputs[0], False
        readers = uses.readers.get(probs, [])
        reader = uses.only_reader(probs)
        if len(readers) == 2 and readers[0].op == "IsNaN" and probs not in uses.outputs:
            reader = readers[0]
            guard = uses.only_reader(reader.outputs[0])
            if (
                guard is None
                or guard.op != "Where"
                or guard.inputs[0] != reader.outputs[0]
                or guard.inputs[2] != probs
                or not _scalar(uses.constant(guard.inputs[1]), 0.0)
                or readers[1] is not guard
            ):
                continue
            removed += [reader, guard]
            guarded = True
            probs, reader = guard.outputs[0], uses.only_reader(guard.outputs[0])
        if reader is None or reader.op != "MatMul" or reader.inputs[0] != probs:
            continue
        out, v = reader, reader.inputs[1]
        scores, mask, allows, dead_rows_zero = uses.producer.get(softmax.inputs[0]), None, 1, 0
        if scores is not None and scores.op == "Add" and uses.only_reader(scores.outputs[0]) is softmax:
            for bias_name, other in (scores.inputs, reversed(scores.inputs)):
                bias = uses.producer.get(bias_name)
                if bias is None or bias.op != "Where":
                    continue
                zero, fill = uses.constant(bias.inputs[1]), uses.constant(bias.inputs[2])
                fills_false = _scalar(zero, 0.0)  # where(mask, 0, fill), else where(mask, fill, 0)
                if not fills_false:
                    zero, fill = fill, zero
                kind = _fill(fill)
                # a -inf fill makes a fully masked row NaN: only the guard makes that 0
                if _scalar(zero, 0.0) and kind is not None and (guarded or kind == "lowest"):
                    mask, allows, dead_rows_zero = bias.inputs[0], int(fills_false), int(kind == "-inf")
                    removed.append(scores)
                    scores = uses.producer.get(other)
                    break
            if mask is None:  # a bias other than a mask's
                continue
        if (
            scores is None
            or scores.op != "MatMul"
            or uses.only_reader(scores.outputs[0]) not in removed
            or scores.inputs[0] == scores.inputs[1]  # q @ q: one Mul would count twice
        ):
            continue
        removed.append(scores)
        operands, scale = [], 1.0
        for name in scores.inputs:
            mul = uses.producer.get(name)
            factor = None
            if mul is not None and mul.op == "Mul" and uses.only_reader(name) is scores:
                for value, constant in (mul.inputs, reversed(mul.inputs)):
                    c = uses.constant(constant)
                    if c is not None and c.size == 1 and c.ndim <= 1 and c.dtype.kind == "f":
                        factor, name = float(c.reshape(())), value
                        break
            if factor is not None and mul is not None:
                scale *= factor
                removed.append(mul)
            operands.append(name)
        q, k_t = operands
        inputs = [q, k_t, v] + ([mask] if mask is not None else [])
        fused = _node("Attention", inputs, out.outputs, _ATTENTION, graph.opsets)
        fused.attrs.update(scale=scale, mask_allows=allows, dead_rows_zero=dead_rows_zero)
        return [*removed, out], fused, out._position
    return None


def _fill(value: np.ndarray | None) -> str | None:
    """What a masked score is set to: ``"-inf"``, ``"lowest"`` (the dtype's lowest finite
    value, float32 or wider: any realistic score added to it rounds back to it, so a fully
    masked row's scores are all equal), or None for anything else."""
    if value is None or value.size != 1 or value.dtype.kind != "f":
        return None
    number = value.reshape(())
    if number == -np.inf:
        return "-inf"
    if value.dtype.itemsize >= 4 and number == np.finfo(value.dtype).min:
        return "lowest"
    return None


_PATTERNS = (_find_linear, _find_gelu, _find_attention)


def _other(node: Node, name: str) -> Any:
    """The input of a two-input node that is not ``name``."""
    a, b = node.inputs
    return b if a == name else a
