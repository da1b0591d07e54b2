"""Helpers the neural-network handler modules share (dtypes, ranks, biases, channel shapes)."""

from __future__ import annotations

from typing import Any

import numpy as np

from xdevice._errors import UnsupportedOp, message

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_HALF = ("float16", "bfloat16")


def _unsupported(node, what: str, received, choices=None):
    raise UnsupportedOp(
        message(f"{node.op} node {node.name!r}: unsupported {what}", received=received, choices=choices)
    )


def _wide(ops, x):
    """``x`` in float32 when it is half precision: ONNX computes statistics in float32
    (``stash_type=1``) and the numpy reference in at least float32."""
    return ops.cast(x, "float32") if ops.dtype(x) in _HALF else x


def _rank(ops, x) -> int:
    return len(ops.shape(x))


def _static_bias(ops, allowed: np.ndarray, dtype: str):
    """An additive attention/causal bias from a static boolean array: 0 where allowed, -inf
    elsewhere (``Where(allowed, 0, -inf)``, as ONNX's function bodies write it)."""
    return ops.asarray(np.where(allowed, 0.0, -np.inf).astype(np.float32), dtype=dtype)


def _bias_where(ops, allowed, dtype: str):
    return ops.where(allowed, ops.zeros((), dtype), ops.full((), -np.inf, dtype))


def _isneginf(ops, x):
    return ops.logical_and(ops.isinf(x), ops.less(x, 0))


def _channel(ops, v, rank: int):
    """A per-channel vector ``(C,)`` shaped to broadcast over ``(N, C, *spatial)``."""
    return ops.reshape(v, (-1,) + (1,) * (rank - 2))


def _product(lists):
    combos: list[list[Any]] = [[]]
    for options in lists:
        combos = [c + [o] for c in combos for o in options]
    return combos


def _split_heads(ops, x, heads: int):
    batch, length, hidden = ops.shape(x)
    return ops.transpose(ops.reshape(x, (batch, length, heads, hidden // heads)), (0, 2, 1, 3))
