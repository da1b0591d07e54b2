"""ONNX handlers: resizing (Resize, Upsample) and sampling grids (GridSample, AffineGrid).

Resize weights and positions are computed in numpy from the static shapes; data-dependent
positions (grid sampling) go through ``take_along_axis``.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import UnsupportedOp, message
from xdevice.converters.importer.handlers._nn import _FLOATS, _product, _rank, _unsupported
from xdevice.converters.importer.registry import handler

# -- resize -----------------------------------------------------------------------------------
# Resize is separable: each resized axis becomes a gather of ``n`` neighbours per output
# position and a weighted sum, with the neighbours and weights computed here in numpy
# (ONNX's reference, vectorised per axis) from the static scales or sizes.


def _nearest_weights(mode: str):
    def weights(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        pick_ceil = {
            "round_prefer_floor": ratio > 0.5,
            "round_prefer_ceil": ratio >= 0.5,
            "floor": False,
            "ceil": True,
            "simple": scale < 1,
        }[mode]  # "simple": Resize-10 / Upsample
        return np.array([0.0, 1.0]) if pick_ceil else np.array([1.0, 0.0])

    return weights


def _cubic_weights(a: float, antialias: bool):
    def weights(ratio: float, scale: float) -> np.ndarray:
        if antialias:
            scale = min(scale, 1.0)
            start = int(np.floor(-2 / scale) + 1)
            x = np.abs(scale * (np.arange(start, 2 - start) - ratio))
            w = np.where(
                x <= 1,
                (a + 2) * x**3 - (a + 3) * x**2 + 1,
                np.where(x < 2, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a, 0.0),
            )
            return w / w.sum()
        return np.array(
            [
                ((a * (ratio + 1) - 5 * a) * (ratio + 1) + 8 * a) * (ratio + 1) - 4 * a,
                ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                ((a + 2) * (1 - ratio) - (a + 3)) * (1 - ratio) * (1 - ratio) + 1,
                ((a * (2 - ratio) - 5 * a) * (2 - ratio) + 8 * a) * (2 - ratio) - 4 * a,
            ]
        )

    return weights


def _linear_weights(antialias: bool):
    def weights(ratio: float, scale: float) -> np.ndarray:
        if antialias:
            scale = min(scale, 1.0)
            start = int(np.floor(-1 / scale) + 1)
            w = np.clip(1 - np.abs((np.arange(start, start + 2 - 2 * start) - ratio) * scale), 0, 1)
            return w / w.sum()
        return np.array([1 - ratio, ratio])

    return weights


def _source_coordinates(node, mode: str, out: np.ndarray, scale: float, size: int, out_size: int, roi):
    """Each output position's coordinate in the input, and which ones extrapolate."""
    width = scale * size
    outside = None
    if mode == "align_corners":
        x = np.zeros(out_size) if width == 1 else out * (size - 1) / (width - 1)
    elif mode == "asymmetric":
        x = out / scale
    elif mode == "tf_crop_and_resize":
        start, stop = roi
        x = (
            np.full(out_size, (stop - start) * (size - 1) / 2)
            if width == 1
            else out * (stop - start) * (size - 1) / (width - 1)
        )
        x = x + start * (size - 1)
        outside = (x < 0) | (x > size - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_size, -0.5) if width == 1 else (out + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (out + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = size / 2 * (1 - out_size / width)
        x = offset + (out + 0.5) / scale - 0.5
    else:
        _unsupported(
            node,
            "coordinate_transformation_mode",
            mode,
            [
                "half_pixel",
                "half_pixel_symmetric",
                "pytorch_half_pixel",
                "align_corners",
                "asymmetric",
                "tf_crop_and_resize",
            ],
        )
    return x, outside


def _resize_plan(node, size, scale, out_size, weights, coordinate_mode, roi, exclude_outside):
    """``(indices (out, n), weights (out, n), extrapolated (out,) or None)`` for one axis."""
    x, outside = _source_coordinates(
        node, coordinate_mode, np.arange(out_size, dtype=np.float64), scale, size, out_size, roi
    )
    base = np.floor(x)
    ratios = np.where(x == base, 1.0, x - base)
    coeffs = np.stack([weights(float(r), scale) for r in ratios]) if out_size else np.zeros((0, 2))
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    shifted = x + pad
    floor = np.floor(shifted).astype(np.int64)
    frac = shifted - floor
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    index = (floor + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((index < 0) | (index >= size), 0.0, coeffs)
        total = coeffs.sum(-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(index, 0, size - 1), coeffs, outside


def _resize_axis(ops, x, axis, index, coeffs, outside, fill, nearest: bool, dtype: str):
    rank = _rank(ops, x)
    if nearest:  # one neighbour per output: a plain gather, exact for every dtype
        x = ops.take(x, index[np.arange(len(index)), np.argmax(coeffs, axis=1)], axis=axis)
        empty = coeffs.max(axis=1) == 0  # exclude_outside dropped the only neighbour: 0
        if empty.any():
            mask = empty.reshape((-1,) + (1,) * (rank - axis - 1))
            x = ops.where(ops.asarray(mask), ops.zeros((), ops.dtype(x)), x)
    else:
        shape = ops.shape(x)
        gathered = ops.reshape(
            ops.take(x, index.reshape(-1), axis=axis), (*shape[:axis], *index.shape, *shape[axis + 1 :])
        )
        w = ops.asarray(coeffs.reshape(coeffs.shape + (1,) * (rank - axis - 1)), dtype=dtype)
        x = ops.sum(ops.multiply(gathered, w), axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((-1,) + (1,) * (rank - axis - 1))
        x = ops.where(ops.asarray(mask), ops.full((), fill, ops.dtype(x)), x)
    return x


def _resize(ctx, node, x, roi, scales, sizes, mode: str, coordinate_mode: str, nearest_mode: str):
    ops = ctx.ops
    shape = list(ops.shape(x))
    rank = len(shape)
    if mode not in ("nearest", "linear", "cubic"):
        _unsupported(node, "mode", mode, ["nearest", "linear", "cubic"])
    axes = [a % rank for a in (node.attr("axes", None) or range(rank))]
    empty = lambda v: v is None or np.asarray(v).size == 0
    roi = None if empty(roi) else np.asarray(roi)  # its own dtype: float32 roi * size rounds as ONNX does
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    if not empty(sizes):
        sizes = [int(v) for v in np.asarray(sizes)]
        factors = [sizes[i] / shape[a] for i, a in enumerate(axes)]
        if policy != "stretch":
            if policy not in ("not_larger", "not_smaller"):
                _unsupported(node, "keep_aspect_ratio_policy", policy, ["stretch", "not_larger", "not_smaller"])
            scale = min(factors) if policy == "not_larger" else max(factors)
            factors = [scale] * len(axes)
            sizes = [int(scale * shape[a] + 0.5) for a in axes]
    elif not empty(scales):
        factors = [float(v) for v in np.asarray(scales, np.float64)]
        sizes = [int(f * shape[a]) for f, a in zip(factors, axes)]
    else:
        raise UnsupportedOp(
            message(
                f"Resize node {node.name!r} has neither scales nor sizes", expected="a non-empty scales or sizes input"
            )
        )
    antialias = bool(node.attr("antialias", 0))
    weights = {
        "nearest": lambda: _nearest_weights(nearest_mode),
        "linear": lambda: _linear_weights(antialias),
        "cubic": lambda: _cubic_weights(node.attr("cubic_coeff_a", -0.75), antialias),
    }[mode]()
    dtype = ops.dtype(x)
    work = dtype if dtype in ("float32", "float64") or mode == "nearest" else "float32"
    y = ops.cast(x, work) if work != dtype else x
    for i, axis in enumerate(axes):
        pair = None
        if roi is not None and coordinate_mode == "tf_crop_and_resize":
            pair = (roi[i], roi[len(axes) + i]) if len(roi) == 2 * len(axes) else (roi[axis], roi[rank + axis])
        if (
            math.isclose(factors[i], 1.0)
            and sizes[i] == shape[axis]
            and (pair is None or (math.isclose(pair[0], 0.0) and math.isclose(pair[1], 1.0)))
        ):
            continue
        if pair is None and coordinate_mode == "tf_crop_and_resize":
            pair = (0.0, 1.0)
        index, coeffs, outside = _resize_plan(
            node,
            shape[axis],
            factors[i],
            sizes[i],
            weights,
            coordinate_mode,
            pair,
            bool(node.attr("exclude_outside", 0)),
        )
        y = _resize_axis(
            ops, y, axis, index, coeffs, outside, node.attr("extrapolation_value", 0.0), mode == "nearest", work
        )
    if work != dtype:
        if dtype not in _FLOATS:  # ONNX saturates to the integer type after rounding
            info = np.iinfo(np.dtype(dtype))
            y = ops.clip(ops.round(y), float(info.min), float(info.max))
        y = ops.cast(y, dtype)
    return y


@handler("Resize", since=10, static=(1,))
def resize_10(ctx, node, x, scales):
    """Version 10: scales only, asymmetric coordinates, nearest rounding down when
    upsampling and up when downsampling (as ONNX Runtime does)."""
    return _resize(ctx, node, x, None, scales, None, node.attr("mode", "nearest"), "asymmetric", "simple")


@handler("Resize", since=11, static=(1, 2, 3))
def resize(ctx, node, x, roi=None, scales=None, sizes=None):
    """Versions 11 on (18 adds ``antialias``, ``axes``, ``keep_aspect_ratio_policy``; 19
    adds the ``half_pixel_symmetric`` coordinates)."""
    return _resize(
        ctx,
        node,
        x,
        roi,
        scales,
        sizes,
        node.attr("mode", "nearest"),
        node.attr("coordinate_transformation_mode", "half_pixel"),
        node.attr("nearest_mode", "round_prefer_floor"),
    )


def _upsample_mode(node) -> str:
    mode = node.attr("mode", "nearest")
    return {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)


@handler("Upsample", since=7)
def upsample_7(ctx, node, x):
    """Asymmetric coordinates; nearest rounds down (repeats for integer scales)."""
    return _resize(
        ctx, node, x, None, np.asarray(node.attr("scales")), None, _upsample_mode(node), "asymmetric", "floor"
    )


@handler("Upsample", since=9, static=(1,))
def upsample_9(ctx, node, x, scales):
    """Version 9: the scales are an input."""
    return _resize(ctx, node, x, None, scales, None, _upsample_mode(node), "asymmetric", "floor")


# -- sampling grids ---------------------------------------------------------------------------


def _reflect(ops, v, low: float, high: float):
    """Reflect coordinates by the nearer border until they fall inside ``[low, high]``."""
    span = high - low

    def fold(distance, near, far):
        turns = ops.floor(ops.divide(distance, span))
        rest = ops.subtract(distance, ops.multiply(turns, span))
        even = ops.equal(ops.mod(turns, 2.0), 0.0)
        return ops.where(
            even,
            ops.add(near, ops.multiply(rest, 1.0 if near == low else -1.0)),
            ops.subtract(far, ops.multiply(rest, 1.0 if near == low else -1.0)),
        )

    below = fold(ops.subtract(low, v), low, high)
    above = fold(ops.subtract(v, high), high, low)
    return ops.where(ops.less(v, low), below, ops.where(ops.greater(v, high), above, v))


def _cubic_kernel(ops, t):
    """Keys' cubic weights (a = -0.75) for offsets -1, 0, 1, 2 around ``floor(x)``."""
    a = -0.75
    u, w = ops.add(t, 1.0), ops.subtract(1.0, t)
    v = ops.subtract(2.0, t)
    far = lambda s: ops.subtract(
        ops.multiply(ops.add(ops.multiply(ops.subtract(ops.multiply(s, a), 5 * a), s), 8 * a), s), 4 * a
    )
    near = lambda s: ops.add(ops.multiply(ops.multiply(ops.subtract(ops.multiply(s, a + 2), a + 3), s), s), 1.0)
    return [far(u), near(t), near(w), far(v)]


def _grid_sample(ctx, node, x, grid, mode: str):
    """Sample ``x`` at ``grid``'s normalised coordinates (last axis x, y[, z]): the
    positions depend on the data, so neighbours are gathered with ``take_along_axis``
    from the flattened spatial axes, and weights and border rules computed elementwise."""
    ops = ctx.ops
    shape = ops.shape(x)
    batch, channels, spatial = shape[0], shape[1], list(shape[2:])
    dims = len(spatial)
    padding = node.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        _unsupported(node, "padding_mode", padding, ["zeros", "border", "reflection"])
    if mode not in ("nearest", "linear", "cubic"):
        _unsupported(node, "mode", mode, ["nearest", "linear", "cubic"])
    align = bool(node.attr("align_corners", 0))
    dtype = ops.dtype(x)
    out = ops.shape(grid)[1:-1]
    points = ops.reshape(ops.cast(grid, dtype if dtype in _FLOATS else "float32"), (batch, -1, dims))
    coords, limits = [], []
    for i, size in enumerate(spatial):
        g = ops.take(points, dims - 1 - i, axis=2)  # (N, Q)
        c = (
            ops.multiply(ops.add(g, 1.0), (size - 1) / 2)
            if align
            else ops.divide(ops.subtract(ops.multiply(ops.add(g, 1.0), float(size)), 1.0), 2.0)
        )
        if mode == "nearest":
            c = ops.round(c)
        low, high = (0.0, size - 1.0) if align else (-0.5, size - 0.5)
        if padding == "border":
            c = ops.where(ops.logical_or(ops.less(c, low), ops.greater(c, high)), ops.clip(c, 0.0, size - 1.0), c)
        elif padding == "reflection":
            c = _reflect(ops, c, low, high)
        coords.append(c)
        limits.append((low, high))
    taps = []  # per dim: list of (integer position, weight or None)
    for c in coords:
        if mode == "nearest":
            taps.append([(c, None)])
            continue
        base = ops.floor(c)
        t = ops.subtract(c, base)
        if mode == "linear":
            taps.append([(base, ops.subtract(1.0, t)), (ops.add(base, 1.0), t)])
        else:
            taps.append([(ops.add(base, float(o)), w) for o, w in zip((-1, 0, 1, 2), _cubic_kernel(ops, t))])
    flat_x = ops.reshape(x, (batch, channels, -1))
    strides = [math.prod(spatial[i + 1 :]) for i in range(dims)]
    total = None
    for combo in _product(taps):
        index, weight, valid = None, None, None
        for i, (pos, w) in enumerate(combo):
            size = spatial[i]
            if padding == "zeros":
                inside = ops.logical_and(ops.greater_equal(pos, 0.0), ops.less_equal(pos, size - 1.0))
                valid = inside if valid is None else ops.logical_and(valid, inside)
            elif padding == "reflection":
                pos = _reflect(ops, pos, *limits[i])
            pos = ops.cast(ops.clip(pos, 0.0, size - 1.0), "int64")
            part = ops.multiply(pos, strides[i]) if strides[i] != 1 else pos
            index = part if index is None else ops.add(index, part)
            if w is not None:
                weight = w if weight is None else ops.multiply(weight, w)
        index = ops.broadcast_to(ops.expand_dims(index, 1), (batch, channels, ops.shape(index)[1]))
        value = ops.take_along_axis(flat_x, index, axis=2)
        if weight is not None:
            value = ops.multiply(value, ops.cast(ops.expand_dims(weight, 1), ops.dtype(value)))
        if valid is not None:
            value = ops.where(ops.expand_dims(valid, 1), value, ops.zeros((), ops.dtype(value)))
        total = value if total is None else ops.add(total, value)
    return ops.cast(ops.reshape(total, (batch, channels, *out)), dtype)


@handler("GridSample", since=16)
def grid_sample_16(ctx, node, x, grid):
    """Version 16: 4-D input, modes ``bilinear``, ``nearest``, ``bicubic``."""
    mode = node.attr("mode", "bilinear")
    return _grid_sample(ctx, node, x, grid, {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode))


@handler("GridSample", since=20)
def grid_sample_20(ctx, node, x, grid):
    """Version 20 on: N-D input, modes ``linear``, ``nearest``, ``cubic``."""
    return _grid_sample(ctx, node, x, grid, node.attr("mode", "linear"))


@handler("AffineGrid", since=20, static=(1,))
def affine_grid(ctx, node, theta, size):
    """``grid[n, ...] = theta[n] @ (x, y[, z], 1)`` over the normalised output positions."""
    ops = ctx.ops
    spatial = [int(v) for v in np.asarray(size)[2:]]
    align = bool(node.attr("align_corners", 0))
    axes = []
    for n in spatial:
        if align:
            step = 2.0 / (n - 1) if n > 1 else 0.0
            axes.append(-1.0 + np.arange(n) * step)
        else:
            axes.append(-1.0 + 1.0 / n + np.arange(n) * (2.0 / n))
    mesh = np.meshgrid(*axes, indexing="ij")  # per spatial dim, in (D,) H, W order
    base = np.stack([m.reshape(-1) for m in reversed(mesh)] + [np.ones(math.prod(spatial))], axis=-1)
    grid = ops.matmul(ops.asarray(base, dtype=ops.dtype(theta)), ops.swap_last(theta))  # (N, P, dims)
    return ops.reshape(grid, (ops.shape(theta)[0], *spatial, len(spatial)))
