"""ONNX handlers: pooling (max, average, Lp, global, MaxUnpool).

Where the op set's pooling does not cover what ONNX asks (dilated or ceil-mode pooling with
``count_include_pad``, max-pool indices), the windows' positions are computed in numpy from
the static shapes and the pool becomes gathers and reductions.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from xdevice.converters.importer.handlers._nn import _FLOATS, _rank
from xdevice.converters.importer.handlers.convolution import _crop_pad, _geometry, _pads
from xdevice.converters.importer.registry import handler

# -- pooling ----------------------------------------------------------------------------------


def _pool_plan(node, spatial, kernel, strides, dilations):
    """``(declared pads, output sizes)`` with ONNX's rules: ``ceil_mode`` rounds the output
    up unless the last window would start beyond the input and the leading padding."""
    pads = _pads(node, spatial, kernel, strides, dilations)
    ceil = bool(node.attr("ceil_mode", 0))
    out = []
    for size, (before, after), k, s, d in zip(spatial, pads, kernel, strides, dilations):
        length = size + before + after - ((k - 1) * d + 1)
        count = (-(-length // s) if ceil else length // s) + 1
        if ceil and (count - 1) * s >= size + before:
            count -= 1
        out.append(count)
    return pads, out


def _window_positions(size, before, count, k, s, d) -> np.ndarray:
    """Input positions ``(count, k)`` each window reads (may fall outside ``[0, size)``)."""
    return np.arange(count)[:, None] * s - before + np.arange(k)[None, :] * d


def _gather_windows(ops, x, positions):
    """``(N, C, *out, prod(kernel))``: every window of ``x``, positions clamped inside."""
    dims = len(positions)
    for i, pos in enumerate(positions):
        axis = 2 + 2 * i
        size = ops.shape(x)[axis]
        x = ops.take(x, np.clip(pos, 0, size - 1).reshape(-1), axis=axis)
        shape = ops.shape(x)
        x = ops.reshape(x, (*shape[:axis], *pos.shape, *shape[axis + 1 :]))
    x = ops.transpose(x, (0, 1, *range(2, 2 + 2 * dims, 2), *range(3, 3 + 2 * dims, 2)))
    shape = ops.shape(x)
    return ops.reshape(x, (*shape[: 2 + dims], math.prod(p.shape[1] for p in positions)))


def _window_mask(positions, low, high) -> np.ndarray:
    """``(*out, K)`` booleans: every coordinate of the window position in ``[low, high)``."""
    mask = np.ones((), bool)
    for i, pos in enumerate(positions):
        inside = (pos >= low[i]) & (pos < high[i])  # (out_i, k_i)
        shape = [1] * (2 * len(positions))
        shape[i], shape[len(positions) + i] = pos.shape
        mask = mask & inside.reshape(shape)
    outs = mask.shape[: len(positions)]
    return mask.reshape(*outs, -1)


def _pool_setup(ctx, node, x):
    ops = ctx.ops
    spatial = ops.shape(x)[2:]
    kernel = list(node.attr("kernel_shape"))
    strides, dilations = _geometry(node, len(kernel))
    pads, out = _pool_plan(node, spatial, kernel, strides, dilations)
    positions = [
        _window_positions(n, pb, o, k, s, d)
        for n, (pb, _), o, k, s, d in zip(spatial, pads, out, kernel, strides, dilations)
    ]
    return spatial, kernel, strides, dilations, pads, out, positions


def _max_pool(ctx, node, x):
    ops = ctx.ops
    spatial, kernel, strides, dilations, pads, out, positions = _pool_setup(ctx, node, x)
    want_indices = len([o for o in node.outputs if o]) > 1
    dtype = ops.dtype(x)
    if not want_indices and dtype in _FLOATS:
        # the op set's max_pool with ONNX's output size spelled as explicit end padding
        widths = [
            (pb, (o - 1) * s + (k - 1) * d + 1 - n - pb)
            for n, (pb, _), o, k, s, d in zip(spatial, pads, out, kernel, strides, dilations)
        ]
        if all(a >= 0 for _, a in widths):
            return ops.max_pool(x, kernel, strides, padding=widths, dilation=dilations)
    windows = _gather_windows(ops, x, positions)
    valid = _window_mask(positions, [0] * len(spatial), spatial)
    if dtype in _FLOATS:
        low = -np.inf
    elif dtype == "bool":
        low = False
    else:
        low = np.iinfo(np.dtype(dtype)).min
    windows = ops.where(ops.asarray(valid), windows, ops.full((), low, dtype))
    y = ops.max(windows, axis=-1)
    if not want_indices:
        return y
    # flat index of each window element in the whole input, row- or column-major spatially
    grids = np.meshgrid(*[np.arange(n) for n in spatial], indexing="ij")
    order: Literal["C", "F"] = "F" if node.attr("storage_order", 0) else "C"
    flat = np.ravel_multi_index(tuple(grids), spatial, order=order)
    clamped = [np.clip(p, 0, n - 1) for p, n in zip(positions, spatial)]
    where_flat = _gather_static(flat, clamped)  # (*out, K)
    best = ops.argmax(windows, axis=-1, keepdims=True)  # (N, C, *out, 1)
    shape = ops.shape(x)
    table = ops.broadcast_to(ops.asarray(where_flat, dtype="int64"), (*shape[:2], *where_flat.shape))
    index = ops.squeeze(ops.take_along_axis(table, ops.cast(best, "int64"), axis=-1), axis=-1)
    plane = math.prod(spatial)
    base = np.arange(shape[0] * shape[1], dtype=np.int64).reshape(shape[0], shape[1], *([1] * len(spatial)))
    return y, ops.add(index, ops.asarray(base * plane, dtype="int64"))


def _gather_static(table: np.ndarray, positions) -> np.ndarray:
    """numpy twin of ``_gather_windows`` for a table over the spatial dims only."""
    dims = len(positions)
    index = np.ix_(*[p.reshape(-1) for p in positions])
    picked = table[index].reshape([v for p in positions for v in p.shape])
    picked = picked.transpose((*range(0, 2 * dims, 2), *range(1, 2 * dims, 2)))
    return picked.reshape(*[p.shape[0] for p in positions], -1)


@handler("MaxPool", since=1)
def max_pool(ctx, node, x):
    """All versions; ``Indices`` (version 8 on) are flat over the whole input, with the
    spatial part column-major when ``storage_order=1``."""
    return _max_pool(ctx, node, x)


def _sum_pool(ctx, node, x, spatial, positions, pads):
    """Window sums with padding counting as zero, and the ``(declared, valid)`` counts."""
    ops = ctx.ops
    windows = _gather_windows(ops, x, positions)
    valid = _window_mask(positions, [0] * len(spatial), spatial)
    total = ops.sum(ops.where(ops.asarray(valid), windows, ops.zeros((), ops.dtype(x))), axis=-1)
    declared = _window_mask(positions, [-pb for pb, _ in pads], [n + pe for n, (_, pe) in zip(spatial, pads)])
    return total, declared.sum(-1), valid.sum(-1)


@handler("AveragePool", since=1)
def average_pool(ctx, node, x):
    """All versions: the mean over each window; ``count_include_pad=1`` divides by the
    window's size inside the declared padding (padding added by ``ceil_mode`` never counts)."""
    ops = ctx.ops
    spatial, kernel, strides, dilations, pads, out, positions = _pool_setup(ctx, node, x)
    include = bool(node.attr("count_include_pad", 0))
    dtype = ops.dtype(x)
    widths = [(pb, (o - 1) * s + k - n - pb) for n, (pb, _), o, k, s in zip(spatial, pads, out, kernel, strides)]
    ceil_extra = any(a > pe for (_, a), (_, pe) in zip(widths, pads))
    if all(d == 1 for d in dilations) and all(a >= 0 for _, a in widths) and not (include and ceil_extra):
        return ops.avg_pool(x, kernel, strides, padding=widths, count_include_pad=include)
    total, declared, valid = _sum_pool(ctx, node, x, spatial, positions, pads)
    counts = (declared if include else valid).astype(np.float64)
    return ops.cast(ops.divide(total, ops.asarray(counts, dtype=dtype)), dtype)


@handler("LpPool", since=1)
def lp_pool(ctx, node, x):
    """``(sum over the window of |x|^p)^(1/p)``, padding counting as zero."""
    ops = ctx.ops
    spatial, kernel, strides, dilations, pads, out, positions = _pool_setup(ctx, node, x)
    p = node.attr("p", 2)
    total, _, _ = _sum_pool(
        ctx, node, ops.power(ops.abs(x), float(p)) if p != 2 else ops.square(x), spatial, positions, pads
    )
    return ops.power(total, 1.0 / p)


@handler("GlobalAveragePool", since=1)
def global_average_pool(ctx, node, x):
    return ctx.ops.mean(x, axis=tuple(range(2, _rank(ctx.ops, x))), keepdims=True)


@handler("GlobalMaxPool", since=1)
def global_max_pool(ctx, node, x):
    return ctx.ops.max(x, axis=tuple(range(2, _rank(ctx.ops, x))), keepdims=True)


@handler("GlobalLpPool", since=1)
def global_lp_pool(ctx, node, x):
    ops = ctx.ops
    p = node.attr("p", 2)
    total = ops.sum(ops.power(ops.abs(x), float(p)), axis=tuple(range(2, _rank(ops, x))), keepdims=True)
    return ops.power(total, 1.0 / p)


@handler("MaxUnpool", since=9, static=(2,))
def max_unpool(ctx, node, x, indices, output_shape=None):
    """Scatter ``x`` to the flat ``indices`` (over the whole tensor, as MaxPool writes them)
    in zeros of the inferred shape ``(in - 1) * stride + kernel - pads``; an
    ``output_shape`` then pads (or crops) that result at the end of each axis, as ONNX's
    reference does."""
    ops = ctx.ops
    shape = ops.shape(x)
    kernel = list(node.attr("kernel_shape"))
    dims = len(kernel)
    strides = list(node.attr("strides", None) or [1] * dims)
    pads = list(node.attr("pads", None) or [0] * 2 * dims)
    inferred = [
        *shape[:2],
        *[(n - 1) * s - pads[i] - pads[i + dims] + k for i, (n, s, k) in enumerate(zip(shape[2:], strides, kernel))],
    ]
    flat = ops.zeros((math.prod(inferred),), ops.dtype(x))
    flat = ops.scatter(flat, ops.reshape(ops.cast(indices, "int64"), (-1,)), ops.reshape(x, (-1,)), axis=0)
    y = ops.reshape(flat, inferred)
    if output_shape is None:
        return y
    target = [int(v) for v in np.asarray(output_shape)]
    return _crop_pad(ops, y, [(0, t - n) for t, n in zip(target, inferred)])
