"""Symbolic dimensions of an export: ``dynamic_axes`` read per input, and inputs at other sizes.

The second verification runs the exported model at another batch size and, for every other
named axis, another length: a size the exporter pinned to the example's cannot pass both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xdevice._errors import ConversionError, message
from xdevice.backends._model_io import Inputs

__all__ = ["BATCH", "symbolic_axes", "axis_sizes", "resized", "second_batch", "resampled"]

#: the name of the dynamic batch dimension in every exported model
BATCH = "batch"


def symbolic_axes(inputs: Inputs, dynamic_batch: bool, dynamic_axes: Mapping[Any, Any] | None) -> list[dict[int, str]]:
    """Per input, its symbolic axes: ``{axis: name}`` (``{0: "batch"}`` with a dynamic batch)."""
    axes: list[dict[int, str]] = [{0: BATCH} if dynamic_batch and x.ndim else {} for x in inputs]
    if not dynamic_axes:
        return axes
    usage = (
        'dynamic_axes={1: "seq"} (every input with an axis 1) or {"<input>": {1: "seq"}} '
        f"with the inputs {list(inputs.names)}"
    )
    if not isinstance(dynamic_axes, Mapping):
        raise ConversionError(message("dynamic_axes must be a dict", received=repr(dynamic_axes), fix=usage))
    per_input = all(isinstance(k, str) for k in dynamic_axes)
    for index, (name, x) in enumerate(zip(inputs.names, inputs)):
        wanted = dynamic_axes.get(name, {}) if per_input else dynamic_axes
        if not isinstance(wanted, Mapping):
            raise ConversionError(
                message(f"dynamic_axes[{name!r}] must be a dict of axis to name", received=repr(wanted), fix=usage)
            )
        for axis, symbol in wanted.items():
            if not isinstance(axis, int) or not isinstance(symbol, str) or not symbol.isidentifier():
                raise ConversionError(
                    message("Each dynamic axis is an int mapped to a name", received=f"{axis!r}: {symbol!r}", fix=usage)
                )
            if per_input and not -x.ndim <= axis < x.ndim:
                raise ConversionError(
                    message(
                        f"Input {name!r} has no axis {axis}",
                        expected=f"an axis of its {x.ndim} (shape {x.shape})",
                        received=axis,
                        fix=usage,
                    )
                )
            if -x.ndim <= axis < x.ndim:
                axes[index][axis % x.ndim] = symbol
    unknown = [k for k in dynamic_axes if per_input and k not in inputs.names]
    if unknown:
        raise ConversionError(
            message(
                "dynamic_axes names inputs the model does not take",
                received=unknown,
                choices=list(inputs.names),
                fix=usage,
            )
        )
    sizes: dict[str, set] = {}
    for x, found in zip(inputs, axes):
        for axis, symbol in found.items():
            sizes.setdefault(symbol, set()).add(x.shape[axis])
    clashing = {symbol: sorted(found) for symbol, found in sizes.items() if len(found) > 1}
    if clashing:
        raise ConversionError(
            message(
                "One dynamic axis name stands for one size, but the example inputs differ there",
                received=clashing,
                fix="give those axes different names",
            )
        )
    return axes


def axis_sizes(inputs: Inputs, axes: list[dict[int, str]]) -> str:
    """The sizes of the dynamic axes but the batch, in words: ``"seq 31"``."""
    found = {
        symbol: x.shape[axis] for x, named in zip(inputs, axes) for axis, symbol in named.items() if symbol != BATCH
    }
    return ", ".join(f"{symbol} {size}" for symbol, size in found.items())


def resized(inputs: Inputs, axes: list[dict[int, str]]) -> Inputs:
    """``inputs`` with every named axis but the batch at another size, one shorter (a model may
    bound a sequence by its position table) or, from 2, longer; entries are taken cyclically,
    so token ids stay valid. For the second verification."""
    import numpy as np

    sizes = {
        symbol: x.shape[axis] - 1 if x.shape[axis] > 2 else x.shape[axis] + 1
        for x, found in zip(inputs, axes)
        for axis, symbol in found.items()
        if symbol != BATCH
    }
    if not sizes:
        return inputs
    resized = []
    for x, found in zip(inputs, axes):
        for axis, symbol in found.items():
            if symbol != BATCH:
                x = np.take(x, np.arange(sizes[symbol]) % max(x.shape[axis], 1), axis=axis)
        resized.append(x)
    return inputs.replaced(resized)


def second_batch(batch: int) -> int:
    return batch + 3  # another size, odd, so a batch pinned to the example's cannot pass


def resampled(inputs: Inputs) -> Inputs:
    """The example's rows, reversed and repeated, as a batch of another size."""
    import numpy as np

    if not inputs[0].ndim:
        return inputs
    batch = inputs[0].shape[0]
    rows = np.arange(second_batch(batch))[::-1] % max(batch, 1)
    return inputs.replaced(np.take(x, rows, axis=0) for x in inputs)
