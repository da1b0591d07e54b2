"""Triton's classification extension: an output's top classes as ``"value:index[:label]"``.

A requested output with ``"classification": k`` (``InferRequestedOutput(name, class_count=k)``)
comes back as BYTES of shape ``[batch, k]`` (``[k]`` for a model without batching) instead of
the tensor: the ``k`` highest values, highest first (ties by the lower index), each as its
value, its index in the output and, where the configuration's ``label_filename`` gives one, its
label. Values are written as Triton writes them: floats with six decimals, integers whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from xdevice._errors import message
from xdevice.serving.protocol import BadRequest

__all__ = ["classify", "read_labels"]


def classify(
    name: str, values: np.ndarray, count: int, labels: Sequence[str] = (), batched: bool = False
) -> np.ndarray:
    """The top ``count`` classes of output ``name``, per row of a ``batched`` output.

    >>> classify("y", np.array([1.1, 3.3, 0.5, 2.4], np.float32), 2, ["a", "b", "c", "d"])
    array([b'3.300000:1:b', b'2.400000:3:d'], dtype=object)
    """
    if values.dtype.kind not in "biuf":
        raise BadRequest(message(f"Output {name!r} cannot be classified", expected="numbers", received=values.dtype))
    rows = values.reshape(len(values), -1) if batched and values.ndim else values.reshape(1, -1)
    keep = min(count, rows.shape[1])
    # a stable sort of the negated values: the highest first, ties by the lower index
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :keep]
    decimal = values.dtype.kind == "f"
    found = np.empty(order.shape, dtype=object)
    for r, row in enumerate(order):
        for c, index in enumerate(row):
            value = rows[r, index]
            text = f"{value:f}" if decimal else str(int(value))
            label = f":{labels[index]}" if index < len(labels) else ""
            found[r, c] = f"{text}:{index}{label}".encode()
    return found if batched and values.ndim else found.reshape(keep)


def read_labels(path: Path) -> tuple[str, ...]:
    """One label per line, the line's number its class index (Triton's ``label_filename``)."""
    return tuple(path.read_text(encoding="utf-8").splitlines())
