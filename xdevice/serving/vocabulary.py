"""Token ids checked against the model's vocabulary before ONNX Runtime sees them.

ONNX Runtime answers an id beyond an embedding's rows with its raw ``GatherND ... invalid
index found, index = 999`` (and a graph exported from JAX clamps the id: garbage out). The
server knows the vocabulary before a request arrives, and answers 400 with the input, the
ids outside it and its size.

Where the vocabulary comes from:
- the graph, needing no configuration: an integer input whose values reach the indices of a
  ``Gather`` or ``GatherND`` over a constant table (an initializer or a ``Constant``) has the
  vocabulary of the table's gathered axis (its rows). The values are followed through the ops
  that pass ids on (moves, casts, reshapes, and the exporters' negative-index and clamping
  idioms: ``Where``, ``Add``, ``Mul``, ``Max``, ``Min``, ``Clip``), never through ``Shape``,
  comparisons or other arithmetic, so a position table indexed by ``Range(Shape(ids))`` or a
  mask computed from the ids does not count. Of several tables one input reaches, the
  smallest bounds it. The zoo's ``lstm`` and ``transformer`` exported from torch, JAX and
  TensorFlow are all read this way.
- the configuration: ``parameters { key: "vocab_size" value { string_value: "100" } }``
  overrides it for the input indexing the largest table (the words; BERT's ``token_type_ids``
  keep their 2), or sets it for every integer input where the graph names none (a table
  computed at run time). It may be smaller than the table (padding rows no tokenizer
  produces), never larger: ONNX Runtime would fail on the ids in between.

Ids must be ``0 <= id < vocabulary``: an embedding lookup has no negative ids, although
ONNX's ``Gather`` would read one from the end of the table.

>>> vocabularies("repo/lstm/1/model.onnx", ModelConfig("lstm"))  # doctest: +SKIP
{'input': Vocabulary(size=1000, source="the rows of 'embed' in the graph")}
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message
from xdevice.serving.config import ModelConfig
from xdevice.serving.protocol import BadRequest

__all__ = ["Vocabulary", "vocabularies", "check_tokens"]

#: op -> the inputs whose values it passes on to its output (None: all of them)
_PASS_ON: dict[str, tuple[int, ...] | None] = {
    **dict.fromkeys(
        ("Identity", "Cast", "CastLike", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose", "Expand"), (0,)
    ),
    **dict.fromkeys(("Slice", "Tile", "Clip"), (0,)),
    "Where": (1, 2),
    **dict.fromkeys(("Add", "Mul", "Max", "Min", "Concat"), None),
}
_TABLE_FROM = ("Identity", "Cast", "DequantizeLinear")  # a table read through these is still the table
_INTEGER = {2, 3, 4, 5, 6, 7, 12, 13}  # onnx.TensorProto UINT8, INT8, UINT16, INT16, INT32, INT64, UINT32, UINT64


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """The token ids an input accepts, ``0 <= id < size``, and where that was read."""

    size: int
    source: str


def vocabularies(model: Path | str, config: ModelConfig) -> dict[str, Vocabulary]:
    """The vocabulary of each token-id input of the ONNX file ``model`` (none: no check).

    Reads the graph only (external data is not loaded).
    """
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    found = from_graph(graph)
    if config.vocab_size is None:
        return found
    configured = Vocabulary(config.vocab_size, f"vocab_size in {config.source}")
    if found:
        words = max(found, key=lambda name: found[name].size)
        if config.vocab_size > found[words].size:
            raise ConfigurationError(
                message(
                    f"{config.source}: vocab_size is larger than the table input {words!r} indexes",
                    expected=f"at most {found[words].size} ({found[words].source})",
                    received=config.vocab_size,
                    fix=f"set vocab_size to {found[words].size} or less, or remove it",
                )
            )
        return {**found, words: configured}
    constant = {t.name for t in graph.initializer}
    return {
        i.name: configured for i in graph.input if i.name not in constant and i.type.tensor_type.elem_type in _INTEGER
    }


def from_graph(graph: Any) -> dict[str, Vocabulary]:
    """Each integer graph input whose values index a constant table, with that table's rows."""
    tables = {t.name: tuple(t.dims) for t in graph.initializer}
    producers: dict[str, Any] = {}
    consumers: dict[str, list[tuple[Any, int]]] = {}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tables[node.output[0]] = tuple(node.attribute[0].t.dims)
        for name in node.output:
            producers[name] = node
        for position, name in enumerate(node.input):
            consumers.setdefault(name, []).append((node, position))

    def table(name: str) -> tuple[str, tuple[int, ...]] | None:
        while name not in tables:
            node = producers.get(name)
            if node is None or node.op_type not in _TABLE_FROM:
                return None
            name = node.input[0]
        return name, tables[name]

    found = {}
    for graph_input in graph.input:
        if graph_input.name in tables or graph_input.type.tensor_type.elem_type not in _INTEGER:
            continue
        best: Vocabulary | None = None
        seen, front = set(), [graph_input.name]
        while front:
            for node, position in consumers.get(front.pop(), ()):
                if node.op_type in ("Gather", "GatherND") and position == 1:
                    rows = _rows(node, table(node.input[0]))
                    if rows is not None and (best is None or rows.size < best.size):
                        best = rows
                    continue
                passed = _PASS_ON.get(node.op_type, ())
                if (passed is None or position in passed) and id(node) not in seen:
                    seen.add(id(node))
                    front += [name for name in node.output if name]
        if best is not None:
            found[graph_input.name] = best
    return found


def _rows(node: Any, table: tuple[str, tuple[int, ...]] | None) -> Vocabulary | None:
    """The size of the axis ``node`` gathers along, on a constant table."""
    if table is None:
        return None
    name, dims = table
    attributes = {a.name: a.i for a in node.attribute}
    axis = attributes.get("axis", 0) if node.op_type == "Gather" else attributes.get("batch_dims", 0)
    if not dims or not -len(dims) <= axis < len(dims) or dims[axis] < 1:
        return None
    return Vocabulary(int(dims[axis]), f"the rows of {name!r} in the graph")


def check_tokens(model: str, vocabulary: dict[str, Vocabulary], inputs: dict[str, Any]) -> None:
    """Raise ``BadRequest`` (400) when an input holds ids outside its vocabulary.

    >>> check_tokens("m", {"ids": Vocabulary(100, "vocab_size")}, {"ids": np.array([3, 999])})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    xdevice.serving.protocol.BadRequest: Input 'ids' of model 'm' holds 1 token id outside its vocabulary...
    """
    for name, known in vocabulary.items():
        value = inputs.get(name)
        if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu" or value.size == 0:
            continue
        if value.min() >= 0 and value.max() < known.size:
            continue
        outside = (value < 0) | (value >= known.size)
        count, values = int(outside.sum()), np.unique(value[outside]).tolist()
        raise BadRequest(
            message(
                f"Input {name!r} of model {model!r} holds {count} token id{'s' * (count > 1)} outside its "
                f"vocabulary of {known.size}" + (f" (the first 10 of {len(values)} shown)" if len(values) > 10 else ""),
                expected=f"0 <= id < {known.size} ({known.source})",
                received=values[:10],
                fix="map each id outside the vocabulary to the tokenizer's unknown-token id, "
                "or use the tokenizer this model was trained with",
            )
        )
