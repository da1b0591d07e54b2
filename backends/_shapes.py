"""Shape arithmetic every backend shares: padding spellings, pooling windows, slices.

Written once so that no backend can drift from the reference: each backend turns these
plain Python and numpy answers into its own kernels' arguments.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from xdevice._errors import UnsupportedOp, message

__all__ = ["as_tuple", "slice_index", "windows", "conv_padding", "pool_padding", "pool_counts"]


def as_tuple(value, dims: int) -> tuple[int, ...]:
    """``value`` as one int per spatial dim."""
    return tuple(value) if isinstance(value, (list, tuple)) else (int(value),) * dims


def slice_index(rank, starts, stops, axes=None, steps=None) -> tuple:
    index = [slice(None)] * rank
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for axis, start, stop, step in zip(axes, starts, stops, steps):
        index[axis] = slice(start, stop, step)
    return tuple(index)


def windows(x: np.ndarray, window, stride, dilation) -> np.ndarray:
    """``(N, C, *out, *window)`` view of every (strided, dilated) window of ``x``."""
    dims = len(window)
    span = tuple((k - 1) * d + 1 for k, d in zip(window, dilation))
    view = sliding_window_view(x, span, axis=tuple(range(2, 2 + dims)))
    index = (
        (slice(None), slice(None))
        + tuple(slice(None, None, s) for s in stride)
        + tuple(slice(None, None, d) for d in dilation)
    )
    return view[index]


def conv_padding(padding, spatial, kernel, stride, dilation) -> list[tuple[int, int]]:
    """Explicit ``(before, after)`` pads per spatial dim from any ``padding`` spelling."""
    dims = len(spatial)
    stride, dilation = as_tuple(stride, dims), as_tuple(dilation, dims)
    if isinstance(padding, str):
        if padding.lower() == "valid":
            return [(0, 0)] * dims
        if padding.lower() != "same":
            raise UnsupportedOp(
                message(
                    "Unknown padding", received=padding, choices=["valid", "same", "an int", "(before, after) pairs"]
                )
            )
        pads = []
        for size, k, s, d in zip(spatial, kernel, stride, dilation):
            out = -(-size // s)
            total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
            pads.append((total // 2, total - total // 2))
        return pads
    if isinstance(padding, int):
        return [(padding, padding)] * dims
    padding = list(padding)
    if all(isinstance(p, int) for p in padding):
        return [(p, p) for p in padding]
    return [(int(before), int(after)) for before, after in padding]


def pool_padding(padding, spatial, window, stride, dilation, ceil_mode) -> list[tuple[int, int]]:
    """Pads for pooling; ``ceil_mode`` adds to the end so a last partial window exists,
    but only when that window starts inside the input or the left padding (PyTorch's rule)."""
    pads = conv_padding(padding, spatial, window, stride, dilation)
    if not ceil_mode:
        return pads
    out = []
    for size, (before, after), k, s, d in zip(spatial, pads, window, stride, dilation):
        span = (k - 1) * d + 1
        length = size + before + after - span
        count = -(-length // s) + 1
        if (count - 1) * s >= size + before:
            count -= 1
        out.append((before, max(after, (count - 1) * s + span - size - before)))
    return out


def pool_counts(spatial, pads, window, stride, count_include_pad, padding) -> np.ndarray:
    """How many elements each average-pool window divides by, shaped ``(*out)``."""
    dims = len(spatial)
    ones = np.ones((1, 1, *spatial))
    if count_include_pad:
        # the declared padding counts; padding added only by ceil_mode does not
        declared = conv_padding(padding, spatial, window, stride, (1,) * dims)
        ones = np.pad(ones, [(0, 0), (0, 0), *declared], constant_values=1)
        extra = [(b - db, a - da) for (b, a), (db, da) in zip(pads, declared)]
        ones = np.pad(ones, [(0, 0), (0, 0), *extra])
    else:
        ones = np.pad(ones, [(0, 0), (0, 0), *pads])
    return windows(ones, window, stride, (1,) * dims).sum(axis=tuple(range(-dims, 0)))[0, 0]
