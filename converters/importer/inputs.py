"""What an imported graph declares of its inputs, and the check of what a call passes.

An ONNX graph declares each input's element type and shape; a dimension is a number (fixed),
a name (symbolic: every dimension of that name, across inputs, takes one size) or unknown.
Checking a call against it up front turns what would be a framework's broadcast error deep
in the graph into one that names the input, the dimension, and what the graph expects.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any

from xdevice._errors import InputError, message

__all__ = ["Declared", "check_inputs", "declared_inputs"]


@dataclasses.dataclass(frozen=True)
class Declared:
    """One graph input: its dtype name (None: not a tensor, or not declared) and its dims
    (None: rank unknown; each dim an int, a symbolic name, or None when unknown)."""

    name: str
    dtype: str | None
    dims: tuple[int | str | None, ...] | None

    def shape(self) -> str:
        if self.dims is None:
            return "any shape"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"


def declared_inputs(graph: Any, initializers: Collection[str]) -> list[Declared]:
    """The declarations of ``graph``'s inputs (a GraphProto), initializers left out."""
    from onnx import helper

    found = []
    for value in graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            found.append(Declared(value.name, None, None))  # sequences, optionals: not checked
            continue
        tensor = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else None
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim)
        found.append(Declared(value.name, dtype, dims))
    return found


def check_inputs(
    declared: Sequence[Declared],
    values: Sequence[Any],
    shape_of: Callable[[Any], tuple],
    dtype_of: Callable[[Any], str] | None,
    held: Callable[[str], str] = lambda d: d,
) -> None:
    """Raise :class:`InputError` for the first input whose dtype (when ``dtype_of`` is given),
    rank or dims disagree with ``declared``; symbolic dims must agree across inputs. Values
    without a shape (sequences, None) and dims that are symbolic under tracing pass. ``held``
    names the dtype the backend holds a declared dtype in (JAX without x64: int64 as int32),
    which is accepted too."""
    bound: dict[str, tuple[int, str]] = {}
    for spec, value in zip(declared, values):
        if spec.dtype is None or not hasattr(value, "shape"):
            continue
        if dtype_of is not None and hasattr(value, "dtype"):
            got = dtype_of(value)
            if got != spec.dtype and got != held(spec.dtype):
                raise InputError(
                    message(
                        f"Input {spec.name!r} has dtype {got}, but the model declares {spec.dtype}",
                        expected=f"{spec.dtype} {spec.shape()}",
                        received=f"{got} {list(shape_of(value))}",
                        fix=f"convert it first, e.g. x.astype('{spec.dtype}') for numpy",
                    )
                )
        if spec.dims is None:
            continue
        shape = tuple(shape_of(value))
        if len(shape) != len(spec.dims):
            raise InputError(
                message(
                    f"Input {spec.name!r} has {len(shape)} dimension(s), but the model declares {len(spec.dims)}",
                    expected=spec.shape(),
                    received=list(shape),
                    fix="reshape the input (a single example may need a batch axis: x[None])",
                )
            )
        for axis, (size, want) in enumerate(zip(shape, spec.dims)):
            if type(size) is not int or want is None:
                continue
            if isinstance(want, int) and size != want:
                raise InputError(
                    message(
                        f"Input {spec.name!r} has size {size} in dimension {axis}, which the model fixes at {want}",
                        expected=spec.shape(),
                        received=list(shape),
                    )
                )
            if isinstance(want, str):
                first = bound.setdefault(want, (size, spec.name))
                if first[0] != size:
                    raise InputError(
                        message(
                            f"Input {spec.name!r} has size {size} in dimension {axis} ({want!r}), but input "
                            f"{first[1]!r} gave {want!r} the size {first[0]}",
                            expected=f"one size for every dimension named {want!r}",
                            received=list(shape),
                        )
                    )
