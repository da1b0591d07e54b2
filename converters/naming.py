"""The exported model's inputs, outputs and symbolic axes renamed to the source's names.

Whatever the exporter chose (``x``/``Identity:0``/``in_0``; ``s77``, ``unk__25``), the inputs
are named after the example inputs, the outputs after the source's, and the batch axis
``batch``; values are renamed everywhere, subgraphs included.
"""

from __future__ import annotations

import json
from typing import Any

from xdevice._errors import ConversionError, message
from xdevice.backends._export import OUTPUT_NAMES
from xdevice.converters.axes import BATCH

__all__ = ["graph_inputs", "name_inputs_and_outputs"]


def graph_inputs(proto: Any) -> list[Any]:
    initializers = {t.name for t in proto.graph.initializer}
    return [v for v in proto.graph.input if v.name not in initializers]


def name_inputs_and_outputs(
    proto: Any, dynamic_batch: bool, input_names: tuple[str, ...], axes: list[dict[int, str]]
) -> None:
    """The example inputs' names (``input``/``input_<i>``, or a dict's keys), the source's
    output names (``output``/``output_<i>``, or a dict's keys, as the backend recorded them),
    and one ``batch`` symbol on axis 0, whatever the exporter chose (``x``/``Identity:0``/
    ``in_0``; ``s77``, ``unk__25``, ``B``). An input the exporter named after an example
    input keeps that name; the others are matched in order."""
    graph = proto.graph
    inputs, outputs = graph_inputs(proto), list(graph.output)
    if len(inputs) != len(input_names):
        extra = [v.name for v in inputs if v.name.split(":")[0] not in input_names][len(input_names) - len(inputs) :]
        raise ConversionError(
            message(
                f"The exporter turned values of the model into graph inputs: the ONNX model takes {len(inputs)} "
                f"inputs where the model takes {len(input_names)}",
                expected=", ".join(input_names),
                received=[v.name for v in inputs],
                fix=f"make {extra or 'them'} constants or weights of the model (a tensor the model closes over "
                "rather than a variable), or export from another framework",
            )
        )
    by_name = {v.name.split(":")[0]: v.name for v in inputs}
    wanted = {by_name[n]: n for n in input_names if n in by_name}
    unnamed = iter(n for n in input_names if n not in wanted.values())
    for v in inputs:
        if v.name not in wanted:
            wanted[v.name] = next(unnamed)
    recorded = {p.key: p.value for p in proto.metadata_props}.get(OUTPUT_NAMES)
    names = json.loads(recorded) if recorded else [_label("output", i, len(outputs)) for i in range(len(outputs))]
    _drop_metadata(proto, OUTPUT_NAMES)
    for v, name in zip(
        outputs,
        names if len(names) == len(outputs) else [_label("output", i, len(outputs)) for i in range(len(outputs))],
    ):
        if v.name not in wanted:  # a graph input passed straight through keeps its input name
            wanted[v.name] = name
    taken = _all_names(graph) - set(wanted)
    for old in [n for n in taken if n in wanted.values()]:  # an inner value already has the name
        wanted[old] = _fresh(old, taken | set(wanted.values()))
    _rename(graph, wanted)
    _name_axes(proto, axes)
    if not dynamic_batch:
        return
    symbols = {
        v.type.tensor_type.shape.dim[0].dim_param for v in graph_inputs(proto) if v.type.tensor_type.shape.dim
    } - {""}
    for v in [*graph_inputs(proto), *graph.output]:  # a size the exporter pinned stays, for check_batch
        dims = v.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_param = BATCH
    for v in graph.value_info:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in symbols:
                d.dim_param = BATCH


def _name_axes(proto: Any, axes: list[dict[int, str]]) -> None:
    """The requested names on the inputs' symbolic axes, and on every output and inner value
    that carries the exporter's symbol for one (``s77``, ``unk__25``)."""
    graph, renamed = proto.graph, {}
    for v, found in zip(graph_inputs(proto), axes):
        dims = v.type.tensor_type.shape.dim
        for axis, symbol in found.items():
            if symbol != BATCH and axis < len(dims) and not dims[axis].HasField("dim_value"):
                if dims[axis].dim_param:
                    renamed[dims[axis].dim_param] = symbol
                dims[axis].dim_param = symbol
    for v in [*graph.output, *graph.value_info]:
        for d in v.type.tensor_type.shape.dim:
            if d.dim_param in renamed:
                d.dim_param = renamed[d.dim_param]


def _drop_metadata(proto: Any, key: str) -> None:
    kept = [p for p in proto.metadata_props if p.key != key]
    del proto.metadata_props[:]
    proto.metadata_props.extend(kept)


def _label(stem: str, index: int, count: int) -> str:
    return stem if count == 1 else f"{stem}_{index}"


def _fresh(name: str, taken: set[str]) -> str:
    n = 1
    while f"{name}_{n}" in taken:
        n += 1
    return f"{name}_{n}"


def _all_names(graph: Any) -> set[str]:
    names = {v.name for v in (*graph.input, *graph.output, *graph.value_info)}
    names |= {t.name for t in graph.initializer}
    for node in graph.node:
        names |= set(node.input) | set(node.output)
        for sub in _subgraphs(node):
            names |= _all_names(sub)
    return names - {""}


def _subgraphs(node: Any) -> list[Any]:
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _rename(graph: Any, mapping: dict[str, str]) -> None:
    """Rename values everywhere, subgraphs included (ONNX names are unique across scopes)."""
    for node in graph.node:
        node.input[:] = [mapping.get(n, n) for n in node.input]
        node.output[:] = [mapping.get(n, n) for n in node.output]
        for sub in _subgraphs(node):
            _rename(sub, mapping)
    for value in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        value.name = mapping.get(value.name, value.name)
