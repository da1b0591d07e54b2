"""ONNX handlers: sequences, optionals and strings.

An ONNX sequence is a Python list of arrays and an optional is ``interpreter.Optional``;
positions and lengths are static (numpy), so they are known when the graph is built.
String tensors exist only as numpy arrays of Python strings (``dtype=object``), which
arrive static: the string ops run on them with numpy whatever the backend.
"""

from __future__ import annotations

import re

import numpy as np

from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.converters.importer.interpreter import Optional, onnx_dtype
from xdevice.converters.importer.registry import handler


def _position(node, sequence: list, position, *, insert: bool = False) -> int:
    """A position in ``sequence``: negative ones count from the end; inserting may also
    name the end itself."""
    index = int(np.asarray(position).reshape(-1)[0])
    length = len(sequence)
    if not -length <= index <= (length if insert else length - 1):
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r} reads past the end of a sequence",
                expected=f"a position in [{-length}, {length - (0 if insert else 1)}]",
                received=index,
            )
        )
    return index + length if index < 0 else index


def _sequence(node, value) -> list:
    if not isinstance(value, list):
        raise ConversionError(
            message(f"{node.op} node {node.name!r} expects a sequence", received=type(value).__name__)
        )
    return value


@handler("SequenceConstruct", since=11)
def sequence_construct(ctx, node, *tensors):
    return list(tensors)


@handler("SequenceEmpty", since=11)
def sequence_empty(ctx, node):
    onnx_dtype(node.attr("dtype", 1))  # an unknown element type fails here, not later
    return []


@handler("SequenceInsert", since=11, static=(2,))
def sequence_insert(ctx, node, sequence, tensor, position=None):
    sequence = list(_sequence(node, sequence))
    index = len(sequence) if position is None else _position(node, sequence, position, insert=True)
    sequence.insert(index, tensor)
    return sequence


@handler("SequenceErase", since=11, static=(1,))
def sequence_erase(ctx, node, sequence, position=None):
    sequence = list(_sequence(node, sequence))
    del sequence[-1 if position is None else _position(node, sequence, position)]
    return sequence


@handler("SequenceAt", since=11, static=(1,))
def sequence_at(ctx, node, sequence, position):
    sequence = _sequence(node, sequence)
    return sequence[_position(node, sequence, position)]


@handler("SequenceLength", since=11)
def sequence_length(ctx, node, sequence):
    return np.asarray(len(_sequence(node, sequence)), dtype=np.int64)


@handler("SplitToSequence", since=11, static=(1,))
def split_to_sequence(ctx, node, x, split=None):
    """Parts of ``x`` along ``axis``: of the listed sizes, of one size (the last part takes
    the rest), or of size 1 (then ``keepdims=0`` drops the axis)."""
    ops = ctx.ops
    axis = node.attr("axis", 0)
    length = ops.shape(x)[axis]
    if split is None:
        parts = ops.split(x, length, axis=axis) if length else []
        return parts if node.attr("keepdims", 1) else [ops.squeeze(p, axis=axis) for p in parts]
    if split.ndim == 0:
        size = int(split)
        sizes = [size] * (length // size) + ([length % size] if length % size else [])
    else:
        sizes = [int(s) for s in split]
    if sum(sizes) != length:
        raise ConversionError(
            message(
                f"SplitToSequence node {node.name!r} has split sizes that do not add up",
                expected=f"sizes summing to {length}",
                received=sizes,
            )
        )
    return list(ops.split(x, sizes, axis=axis))


@handler("ConcatFromSequence", since=11)
def concat_from_sequence(ctx, node, sequence):
    tensors = [ctx.array(t) for t in _sequence(node, sequence)]
    if node.attr("new_axis", 0):
        return ctx.ops.stack(tensors, axis=node.attr("axis"))
    return ctx.ops.concat(tensors, axis=node.attr("axis"))


@handler("SequenceMap", since=17)
def sequence_map(ctx, node, sequence, *others):
    """Run ``body`` once per element; other sequence inputs are read element by element,
    tensors are passed whole. Each body output becomes a sequence."""
    body = node.attr("body")
    sequence = _sequence(node, sequence)
    for other in others:
        if isinstance(other, list) and len(other) != len(sequence):
            raise ConversionError(
                message(
                    f"SequenceMap node {node.name!r} maps sequences of different lengths",
                    expected=str(len(sequence)),
                    received=len(other),
                )
            )
    outputs: list[list] = [[] for _ in body.outputs]
    for i, element in enumerate(sequence):
        inputs = [element] + [o[i] if isinstance(o, list) else o for o in others]
        for collected, value in zip(outputs, ctx.run(body, ctx.values, inputs)):
            collected.append(value)
    return tuple(outputs) if len(outputs) > 1 else outputs[0]


# -- optionals ----------------------------------------------------------------------------


@handler("Optional", since=15)
def optional(ctx, node, value=None):
    return Optional(value)


@handler("OptionalHasElement", since=15)
def optional_has_element(ctx, node, value=None):
    # a missing input (allowed from version 18) is an empty optional
    has = value.value is not None if isinstance(value, Optional) else value is not None
    return np.asarray(has)


@handler("OptionalGetElement", since=15)
def optional_get_element(ctx, node, value):
    if isinstance(value, Optional):  # a plain tensor or sequence is returned as it is (version 18)
        if value.value is None:
            raise ConversionError(
                message(
                    f"OptionalGetElement node {node.name!r} reads an empty optional",
                    fix="guard it with OptionalHasElement and If",
                )
            )
        return value.value
    return value


# -- strings ------------------------------------------------------------------------------


def _strings(node, x) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype.kind not in "OSU":
        raise UnsupportedOp(
            message(
                f"{node.op} node {node.name!r} needs a string tensor",
                expected="a numpy array of strings",
                received=getattr(x, "dtype", type(x).__name__),
            )
        )
    return x.astype(object)


@handler("StringConcat", since=20, static=(0, 1))
def string_concat(ctx, node, x, y):
    return np.asarray(np.frompyfunc(lambda a, b: a + b, 2, 1)(_strings(node, x), _strings(node, y)), dtype=object)


@handler("StringSplit", since=20, static=(0,))
def string_split(ctx, node, x):
    """``Y``: the parts, padded with "" to the longest split; ``Z``: how many each has. An
    empty or missing delimiter splits on runs of whitespace (Python's ``str.split()``)."""
    x = _strings(node, x)
    delimiter = node.attr("delimiter") or None
    maxsplit = node.attr("maxsplit", -1)
    parts = [s.split(delimiter, maxsplit) for s in x.reshape(-1)]
    counts = np.asarray([len(p) for p in parts], dtype=np.int64).reshape(x.shape)
    width = int(counts.max(initial=0))
    out = np.full((len(parts), width), "", dtype=object)
    for i, p in enumerate(parts):
        out[i, : len(p)] = p
    return out.reshape(*x.shape, width), counts


@handler("RegexFullMatch", since=20, static=(0,))
def regex_full_match(ctx, node, x):
    # ONNX names RE2 syntax; Python's re agrees on the common subset
    pattern = re.compile(node.attr("pattern"))
    x = _strings(node, x)
    return np.asarray([pattern.fullmatch(s) is not None for s in x.reshape(-1)], dtype=bool).reshape(x.shape)


@handler("StringNormalizer", since=10, static=(0,))
def string_normalizer(ctx, node, x):
    """Drop the elements that are stop words, then change case; a shape ``[C]`` or ``[1, C]``
    input keeps its rank, and an input left empty becomes ``[""]``."""
    x = _strings(node, x)
    if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
        raise ConversionError(
            message(
                f"StringNormalizer node {node.name!r} got an input of the wrong shape",
                expected="[C] or [1, C]",
                received=list(x.shape),
            )
        )
    action = node.attr("case_change_action", "NONE")
    change = {"NONE": lambda s: s, "LOWER": str.lower, "UPPER": str.upper}.get(action)
    if change is None:
        raise UnsupportedOp(
            message(
                f"StringNormalizer node {node.name!r} has an unknown case_change_action",
                received=action,
                choices=["NONE", "LOWER", "UPPER"],
            )
        )
    sensitive = node.attr("is_case_sensitive", 0)
    fold = (lambda s: s) if sensitive else str.lower
    stops = {fold(w) for w in node.attr("stopwords", [])}
    kept = [change(s) for s in x.reshape(-1) if fold(s) not in stops] or [""]
    out = np.asarray(kept, dtype=object)
    return out.reshape(1, -1) if x.ndim == 2 else out
