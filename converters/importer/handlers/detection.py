"""Detection and scatter ops: NonMaxSuppression, RoiAlign, TensorScatter, and the rest of the
suite's ops that select or move values by computed indices.

NonMaxSuppression's output length depends on the data, so, like NonZero, it reads its inputs
eagerly (``static``) and answers with a numpy array; under ``jax.jit`` or ``tf.function``
with traced boxes it raises ``ConversionError`` naming the node. RoiAlign and TensorScatter
are gathers and selects over the op set, so they also run traced; only RoiAlign with
``sampling_ratio=0`` needs its ROIs known, to size its sampling grid.
"""

from __future__ import annotations

import numpy as np

from xdevice.converters.importer.handlers._nn import _unsupported
from xdevice.converters.importer.registry import handler

# -- NonMaxSuppression ------------------------------------------------------------------------


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """``(..., 4)`` boxes as ``[y_min, x_min, y_max, x_max]``; corner boxes may come with
    either corner first, center boxes are ``[x_center, y_center, width, height]``."""
    if center_point_box:
        x, y, w, h = (boxes[..., i] for i in range(4))
        return np.stack([y - h / 2, x - w / 2, y + h / 2, x + w / 2], axis=-1)
    y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
    return np.stack([np.minimum(y1, y2), np.minimum(x1, x2), np.maximum(y1, y2), np.maximum(x1, x2)], axis=-1)


def _overlaps(box: np.ndarray, others: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Whether ``box`` overlaps each of ``others`` by an IoU above the threshold; boxes that
    do not intersect, or have no area, never suppress (as ONNX Runtime decides)."""
    height = np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0])
    width = np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1])
    inter = height * width
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area + areas - inter
    counted = (height > 0) & (width > 0) & (area > 0) & (areas > 0) & (union > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return counted & (inter / np.where(counted, union, 1) > iou_threshold)


def _scalar(value, default):
    return default if value is None or np.asarray(value).size == 0 else np.asarray(value).reshape(-1)[0]


@handler("NonMaxSuppression", since=10, static=(0, 1, 2, 3, 4))
def non_max_suppression(ctx, node, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
    """Greedy per (batch, class): take boxes by falling score (ties: lower index first), skip
    one whose IoU with a kept box exceeds ``iou_threshold``, stop after ``max_output``; only
    scores above ``score_threshold`` (when given) compete. Rows are
    ``[batch, class, box]`` in that order."""
    limit = max(int(_scalar(max_output, 0)), 0)
    iou = float(_scalar(iou_threshold, 0.0))
    corners = _corners(np.asarray(boxes), node.attr("center_point_box", 0))
    scores = np.asarray(scores)
    selected = []
    for batch in range(scores.shape[0]) if limit else ():
        for cls in range(scores.shape[1]):
            score = scores[batch, cls]
            order = np.argsort(-score, kind="stable")
            if score_threshold is not None and np.asarray(score_threshold).size:
                order = order[score[order] > _scalar(score_threshold, 0.0)]
            kept: list[int] = []
            for box in order:
                if len(kept) == limit:
                    break
                if not _overlaps(corners[batch, box], corners[batch, kept], iou).any():
                    kept.append(int(box))
            selected += [(batch, cls, box) for box in kept]
    return np.asarray(selected, dtype=np.int64).reshape(-1, 3)


# -- RoiAlign ---------------------------------------------------------------------------------


def _grid_size(rois: np.ndarray, bins: int, scale: float, half_pixel: bool, axis: int) -> int:
    """The largest adaptive sampling grid (``ceil(roi_size / bins)``) over the ROIs along
    ``axis`` (0: width, 1: height), for ``sampling_ratio=0``."""
    size = (rois[:, axis + 2] - rois[:, axis]) * np.float32(scale)
    if not half_pixel:
        size = np.maximum(size, 1.0)
    return int(np.max(np.ceil(size / bins), initial=1))


def _samples(ops, start, size, bins: int, grid, most: int, extent: int):
    """Bilinear sampling along one axis for every ROI, over a ``(R, bins, most)`` table of
    sample positions: the low and high source indices, their weights, and whether each
    sample lies on the ROI's own grid (``sample < grid``; ``most`` is the largest grid).
    Samples off the grid, or outside ``[-1, extent]``, weigh nothing (the reference's)."""
    dtype = ops.dtype(start)
    column = lambda values, axis: ops.asarray(np.reshape(values, [1, 1, 1][:axis] + [-1] + [1] * (2 - axis)), dtype)
    step = ops.divide(size, float(bins))
    start, step, grid = (ops.reshape(v, (-1, 1, 1)) for v in (start, step, grid))
    offset = ops.divide(ops.multiply(column(np.arange(most) + 0.5, 2), step), grid)
    pos = ops.add(ops.add(start, ops.multiply(column(np.arange(bins), 1), step)), offset)
    on_grid = ops.less(column(np.arange(most), 2), grid)
    inside = ops.logical_and(ops.greater_equal(pos, -1.0), ops.less_equal(pos, float(extent)))
    pos = ops.maximum(pos, 0.0)
    low = ops.minimum(ops.floor(pos), float(extent - 1))
    frac = ops.subtract(ops.minimum(pos, float(extent - 1)), low)  # past the last row: the row itself
    high = ops.minimum(ops.add(low, 1.0), float(extent - 1))
    counted, zero = ops.logical_and(on_grid, inside), ops.zeros((), dtype)
    weights = (ops.where(counted, ops.subtract(1.0, frac), zero), ops.where(counted, frac, zero))
    return (ops.cast(low, "int64"), ops.cast(high, "int64")), weights, on_grid


def _gather_2d(ops, features, rows, cols):
    """``features[r, :, rows[r, i], cols[r, j]]`` for ``features (R, C, H, W)`` and index
    tables ``rows (R, Y)``, ``cols (R, X)``: two ``take_along_axis`` calls."""
    n, c, _, w = ops.shape(features)
    y, x = ops.shape(rows)[1], ops.shape(cols)[1]
    picked = ops.take_along_axis(features, ops.broadcast_to(ops.reshape(rows, (n, 1, y, 1)), (n, c, y, w)), axis=2)
    return ops.take_along_axis(picked, ops.broadcast_to(ops.reshape(cols, (n, 1, 1, x)), (n, c, y, x)), axis=3)


def _roi_align(ctx, node, x, rois, batch_indices, half_pixel: bool):
    """Each ROI's bins sampled bilinearly on a regular grid (``sampling_ratio`` points per
    side, or ``ceil(roi_size / bins)`` when 0) and averaged, or maxed, per bin. Every ROI is
    sampled on the largest grid at once, with the points off its own grid masked out."""
    ops = ctx.ops
    mode = node.attr("mode", "avg")
    if mode not in ("avg", "max"):
        _unsupported(node, "mode", mode, ["avg", "max"])
    out_h, out_w = node.attr("output_height", 1), node.attr("output_width", 1)
    ratio, scale = node.attr("sampling_ratio", 0), node.attr("spatial_scale", 1.0)
    _, channels, height, width = ops.shape(x)
    dtype = ops.dtype(x)
    rois = ops.cast(rois, dtype)
    shift = 0.5 if half_pixel else 0.0
    start_w, start_h, end_w, end_h = (
        ops.subtract(ops.multiply(ops.reshape(ops.slice(rois, [i], [i + 1], axes=[1]), (-1,)), scale), shift)
        for i in range(4)
    )
    size_w, size_h = ops.subtract(end_w, start_w), ops.subtract(end_h, start_h)
    if not half_pixel:  # malformed ROIs become 1x1
        size_w, size_h = ops.maximum(size_w, 1.0), ops.maximum(size_h, 1.0)
    if ratio > 0:
        grid_h = grid_w = ops.full((), float(ratio), dtype)
        most_h = most_w = ratio
    else:  # the grid's size follows each ROI's; the largest must be known to build it
        known = np.asarray(ctx.static(rois), dtype=np.float32)
        most_h = _grid_size(known, out_h, scale, half_pixel, axis=1)
        most_w = _grid_size(known, out_w, scale, half_pixel, axis=0)
        grid_h, grid_w = ops.ceil(ops.divide(size_h, float(out_h))), ops.ceil(ops.divide(size_w, float(out_w)))
    (y_low, y_high), (y_lw, y_hw), y_on = _samples(ops, start_h, size_h, out_h, grid_h, most_h, height)
    (x_low, x_high), (x_lw, x_hw), x_on = _samples(ops, start_w, size_w, out_w, grid_w, most_w, width)
    count = ops.shape(rois)[0]
    features = ops.take(x, ops.cast(ops.reshape(batch_indices, (-1,)), "int64"), axis=0)
    flat = lambda v: ops.reshape(v, (count, -1))  # (R, bins, most) -> (R, bins * most)
    as_rows = lambda v: ops.reshape(v, (count, 1, out_h, most_h, 1, 1))
    as_cols = lambda v: ops.reshape(v, (count, 1, 1, 1, out_w, most_w))
    shape = (count, channels, out_h, most_h, out_w, most_w)
    corners = [
        ops.multiply(
            ops.multiply(ops.reshape(_gather_2d(ops, features, flat(r), flat(c)), shape), as_rows(wy)), as_cols(wx)
        )
        for r, wy in ((y_low, y_lw), (y_high, y_hw))
        for c, wx in ((x_low, x_lw), (x_high, x_hw))
    ]
    if mode == "avg":
        total = ops.sum(ops.add(ops.add(corners[0], corners[1]), ops.add(corners[2], corners[3])), axis=(3, 5))
        samples = ops.maximum(ops.multiply(grid_h, grid_w), 1.0)
        return ops.divide(total, ops.reshape(samples, (-1, 1, 1, 1)))
    # max mode takes each sample's largest weighted corner value, not its interpolation (the
    # reference's choice); points off the ROI's own grid take no part, an empty bin gives 0
    biggest = ops.maximum(ops.maximum(corners[0], corners[1]), ops.maximum(corners[2], corners[3]))
    on_grid = ops.logical_and(
        as_rows(ops.broadcast_to(y_on, (count, out_h, most_h))), as_cols(ops.broadcast_to(x_on, (count, out_w, most_w)))
    )
    best = ops.max(ops.where(on_grid, biggest, -np.inf), axis=(3, 5))
    return ops.where(ops.isinf(best), ops.zeros((), dtype), best)


@handler("RoiAlign", since=10)
def roi_align_10(ctx, node, x, rois, batch_indices):
    """Version 10: no ``coordinate_transformation_mode``; ROIs are not shifted by half a pixel."""
    return _roi_align(ctx, node, x, rois, batch_indices, half_pixel=False)


@handler("RoiAlign", since=16)
def roi_align(ctx, node, x, rois, batch_indices):
    mode = node.attr("coordinate_transformation_mode", "half_pixel")
    if mode not in ("half_pixel", "output_half_pixel"):
        _unsupported(node, "coordinate_transformation_mode", mode, ["half_pixel", "output_half_pixel"])
    return _roi_align(ctx, node, x, rois, batch_indices, half_pixel=mode == "half_pixel")


# -- TensorScatter ----------------------------------------------------------------------------


@handler("TensorScatter", since=24)
def tensor_scatter(ctx, node, past, update, write_indices=None):
    """Write ``update`` into the cache ``past`` along ``axis`` from each batch entry's
    ``write_indices`` on (wrapping around in ``circular`` mode). Written as a gather: cache
    position ``j`` of batch ``b`` takes ``update[j - write_indices[b]]`` where that index
    falls inside the update, else keeps its past value, so the indices may be traced."""
    ops = ctx.ops
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        _unsupported(node, "mode", mode, ["linear", "circular"])
    dims = ops.shape(past)
    rank = len(dims)
    axis = node.attr("axis", -2) % rank
    length, steps = dims[axis], ops.shape(update)[axis]
    along = [length if i == axis else 1 for i in range(rank)]
    position = ops.asarray(np.arange(length, dtype=np.int64).reshape(along))
    if write_indices is None:
        source = position
    else:
        start = ops.reshape(ops.cast(write_indices, "int64"), (-1,) + (1,) * (rank - 1))
        source = ops.subtract(position, start)
        if mode == "circular":
            source = ops.mod(source, length)
    written = ops.logical_and(ops.greater_equal(source, 0), ops.less(source, steps))
    index = ops.broadcast_to(ops.minimum(ops.maximum(source, 0), steps - 1), dims)
    return ops.where(ops.broadcast_to(written, dims), ops.take_along_axis(update, index, axis=axis), past)
