"""ONNX handlers: neural-network ops (convolution, pooling, normalisation, softmax, dropout,
attention, losses, recurrent layers, resizing and sampling).

Each handler is written once over the op set. Where ONNX asks for more than the op set's
primitives offer (dilated or ceil-mode pooling with ``count_include_pad``, max-pool
indices, transposed convolution, resize, grid sampling), the index and weight arrays are
computed in numpy from the static shapes and the op becomes gathers, weighted sums and
``ops.conv``; data-dependent positions (grid sampling) go through ``take_along_axis``.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import UnsupportedOp, message
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_HALF = ("float16", "bfloat16")


def _unsupported(node, what: str, received, choices=None):
    raise UnsupportedOp(message(f"{node.op} node {node.name!r}: unsupported {what}", received=received,
                                choices=choices))


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


# -- softmax family ---------------------------------------------------------------------------

def _hardmax(ops, x, axis):
    length = ops.shape(x)[axis]
    positions = np.arange(length).reshape((length,) + (1,) * (_rank(ops, x) - 1 - axis % _rank(ops, x)))
    hit = ops.equal(ops.asarray(positions, dtype="int64"), ops.cast(ops.argmax(x, axis, keepdims=True), "int64"))
    return ops.cast(hit, ops.dtype(x))


def _softmax(ops, x, axis):
    """In the input's precision, half included, as ONNX's reference computes it (the op
    set's softmax widens half precision to float32, which differs in the last bit)."""
    if ops.dtype(x) not in _HALF:
        return ops.softmax(x, axis=axis)
    e = ops.exp(ops.subtract(x, ops.max(x, axis=axis, keepdims=True)))
    return ops.divide(e, ops.sum(e, axis=axis, keepdims=True))


_SOFTMAX = {"Softmax": _softmax,
            "LogSoftmax": lambda ops, x, axis: ops.log_softmax(x, axis=axis),
            "Hardmax": _hardmax}


def _softmax_2d(ctx, node, x):
    """Versions 1 and 11 flatten the input to 2-D at ``axis`` and act on the second axis."""
    ops = ctx.ops
    shape = ops.shape(x)
    axis = node.attr("axis", 1) % max(len(shape), 1)
    flat = ops.reshape(x, (math.prod(shape[:axis]), math.prod(shape[axis:])))
    return ops.reshape(_SOFTMAX[node.op](ops, flat, 1), shape)


def _softmax_axis(ctx, node, x):
    """Version 13 acts on one axis."""
    return _SOFTMAX[node.op](ctx.ops, x, node.attr("axis", -1))


for _op in _SOFTMAX:
    handler(_op, since=1)(_softmax_2d)
    handler(_op, since=13)(_softmax_axis)


# -- normalisation ----------------------------------------------------------------------------

def _channel(ops, v, rank: int):
    """A per-channel vector ``(C,)`` shaped to broadcast over ``(N, C, *spatial)``."""
    return ops.reshape(v, (-1,) + (1,) * (rank - 2))


def _batch_norm(ctx, x, scale, bias, mean, var, eps, training, momentum, spatial=True):
    """``(y, running_mean, running_var, batch_mean, batch_var)``; the running statistics are
    ``stat * momentum + batch_stat * (1 - momentum)`` with the biased batch variance."""
    ops = ctx.ops
    rank = _rank(ops, x)
    dtype = ops.dtype(x)
    shape = (lambda v: _channel(ops, v, rank)) if spatial else (lambda v: ops.expand_dims(v, 0))
    wx = _wide(ops, x)
    if training:
        axes = (0, *range(2, rank)) if spatial else (0,)
        batch_mean = ops.mean(wx, axis=axes)
        batch_var = ops.mean(ops.square(ops.subtract(wx, ops.mean(wx, axis=axes, keepdims=True))), axis=axes)
        use_mean, use_var = batch_mean, batch_var
    else:
        use_mean, use_var = _wide(ops, mean), _wide(ops, var)
    factor = ops.divide(_wide(ops, scale), ops.sqrt(ops.add(use_var, eps)))
    y = ops.add(ops.multiply(ops.subtract(wx, shape(use_mean)), shape(factor)), shape(_wide(ops, bias)))
    y = ops.cast(y, dtype)
    if not training:
        return y, mean, var, mean, var
    keep = lambda stat, batch: ops.cast(ops.add(ops.multiply(_wide(ops, stat), momentum),  # noqa: E731
                                                ops.multiply(batch, 1.0 - momentum)), ops.dtype(stat))
    return (y, keep(mean, batch_mean), keep(var, batch_var), ops.cast(batch_mean, dtype),
            ops.cast(batch_var, dtype))


@handler("BatchNormalization", since=1)
def batch_norm_1(ctx, node, x, scale, bias, mean, var):
    """Versions 1 and 6: training mode needs ``is_test=0`` (the default) and the training
    outputs (mean, var...) to be requested: old exporters often leave ``is_test`` out of
    inference models, and ONNX Runtime runs those with the stored statistics too.
    ``spatial=0`` keeps one statistic per activation rather than per channel."""
    training = not node.attr("is_test", 0) and len([o for o in node.outputs if o]) > 1
    y, running_mean, running_var, batch_mean, batch_var = _batch_norm(
        ctx, x, scale, bias, mean, var, node.attr("epsilon", 1e-5), training, node.attr("momentum", 0.9),
        spatial=bool(node.attr("spatial", 1)))
    return y, running_mean, running_var, batch_mean, batch_var


@handler("BatchNormalization", since=7)
def batch_norm_7(ctx, node, x, scale, bias, mean, var):
    """Versions 7 and 9: training mode is asked for by requesting more than one output."""
    training = len([o for o in node.outputs if o]) > 1
    return _batch_norm(ctx, x, scale, bias, mean, var, node.attr("epsilon", 1e-5), training,
                       node.attr("momentum", 0.9), spatial=bool(node.attr("spatial", 1)))


@handler("BatchNormalization", since=14)
def batch_norm_14(ctx, node, x, scale, bias, mean, var):
    """Version 14 on: ``training_mode=1`` normalises with the batch statistics and outputs
    the updated running mean and variance."""
    y, running_mean, running_var, _, _ = _batch_norm(
        ctx, x, scale, bias, mean, var, node.attr("epsilon", 1e-5), bool(node.attr("training_mode", 0)),
        node.attr("momentum", 0.9))
    return y, running_mean, running_var


@handler("InstanceNormalization", since=1)
def instance_norm(ctx, node, x, scale, bias):
    ops = ctx.ops
    rank, dtype = _rank(ops, x), ops.dtype(x)
    wx = _wide(ops, x)
    axes = tuple(range(2, rank))
    mean = ops.mean(wx, axis=axes, keepdims=True)
    centred = ops.subtract(wx, mean)
    var = ops.mean(ops.square(centred), axis=axes, keepdims=True)
    y = ops.divide(centred, ops.sqrt(ops.add(var, node.attr("epsilon", 1e-5))))
    y = ops.add(ops.multiply(y, _channel(ops, _wide(ops, scale), rank)), _channel(ops, _wide(ops, bias), rank))
    return ops.cast(y, dtype)


def _stash(ops, node, x):
    """``x`` in the ``stash_type`` precision (float32 by default) the statistics use."""
    return ops.cast(x, onnx_dtype(node.attr("stash_type", 1)))


@handler("LayerNormalization", since=17)
def layer_norm(ctx, node, x, scale, bias=None):
    """Outputs ``Y`` and, in the stash precision, ``Mean`` and ``InvStdDev`` with the
    normalised axes kept as 1."""
    ops = ctx.ops
    rank, dtype = _rank(ops, x), ops.dtype(x)
    axes = tuple(range(node.attr("axis", -1) % rank, rank))
    wx = _stash(ops, node, x)
    mean = ops.mean(wx, axis=axes, keepdims=True)
    centred = ops.subtract(wx, mean)
    inv_std = ops.reciprocal(ops.sqrt(ops.add(ops.mean(ops.square(centred), axis=axes, keepdims=True),
                                              node.attr("epsilon", 1e-5))))
    y = ops.multiply(ops.cast(ops.multiply(centred, inv_std), dtype), scale)
    if bias is not None:
        y = ops.add(y, bias)
    return y, mean, inv_std


@handler("RMSNormalization", since=23)
def rms_norm(ctx, node, x, scale):
    ops = ctx.ops
    rank, dtype = _rank(ops, x), ops.dtype(x)
    axes = tuple(range(node.attr("axis", -1) % rank, rank))
    wx = _stash(ops, node, x)
    rms = ops.sqrt(ops.add(ops.mean(ops.square(wx), axis=axes, keepdims=True), node.attr("epsilon", 1e-5)))
    return ops.multiply(ops.cast(ops.divide(wx, rms), dtype), scale)


def _group_norm(ctx, node, x, scale, bias, per_channel: bool):
    ops = ctx.ops
    shape, dtype = ops.shape(x), ops.dtype(x)
    groups = node.attr("num_groups")
    wx = _stash(ops, node, x) if per_channel else _wide(ops, x)
    grouped = ops.reshape(wx, (shape[0], groups, -1))
    mean = ops.mean(grouped, axis=2, keepdims=True)
    centred = ops.subtract(grouped, mean)
    var = ops.mean(ops.square(centred), axis=2, keepdims=True)
    y = ops.cast(ops.reshape(ops.divide(centred, ops.sqrt(ops.add(var, node.attr("epsilon", 1e-5)))), shape), dtype)
    if not per_channel:  # version 18: one scale and bias per group
        reps = shape[1] // groups
        expand = lambda v: ops.reshape(ops.broadcast_to(ops.expand_dims(v, 1), (groups, reps)), (-1,))  # noqa: E731
        scale, bias = expand(scale), expand(bias)
    rank = len(shape)
    return ops.add(ops.multiply(y, _channel(ops, scale, rank)), _channel(ops, bias, rank))


@handler("GroupNormalization", since=18)
def group_norm_18(ctx, node, x, scale, bias):
    """Version 18: ``scale`` and ``bias`` hold one value per group."""
    return _group_norm(ctx, node, x, scale, bias, per_channel=False)


@handler("GroupNormalization", since=21)
def group_norm_21(ctx, node, x, scale, bias):
    """Version 21: one value per channel, statistics in the ``stash_type`` precision."""
    return _group_norm(ctx, node, x, scale, bias, per_channel=True)


@handler("LRN", since=1)
def lrn(ctx, node, x):
    """Each channel divided by the summed squares of ``size`` neighbouring channels
    (``floor((size-1)/2)`` before, ``ceil((size-1)/2)`` after)."""
    ops = ctx.ops
    size = node.attr("size")
    before, after = (size - 1) // 2, -(-(size - 1) // 2)
    rank, channels = _rank(ops, x), ops.shape(x)[1]
    widths = [(0, 0)] * rank
    widths[1] = (before, after)
    squares = ops.pad(ops.square(x), widths)
    total = ops.slice(squares, [0], [channels], axes=[1])
    for shift in range(1, size):
        total = ops.add(total, ops.slice(squares, [shift], [shift + channels], axes=[1]))
    alpha, beta, bias = node.attr("alpha", 1e-4), node.attr("beta", 0.75), node.attr("bias", 1.0)
    return ops.divide(x, ops.power(ops.add(ops.multiply(total, alpha / size), bias), beta))


@handler("MeanVarianceNormalization", since=9)
def mean_variance_norm(ctx, node, x):
    """``(X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)``, as ONNX's function body."""
    ops = ctx.ops
    axes = tuple(node.attr("axes", [0, 2, 3]))
    mean = ops.mean(x, axis=axes, keepdims=True)
    var = ops.subtract(ops.mean(ops.square(x), axis=axes, keepdims=True), ops.square(mean))
    return ops.divide(ops.subtract(x, mean), ops.add(ops.sqrt(var), 1e-9))


@handler("LpNormalization", since=1)
def lp_norm(ctx, node, x):
    """``x / ||x||_p`` along ``axis`` (p is 1 or 2); a zero norm gives 0."""
    ops = ctx.ops
    axis, p = node.attr("axis", -1), node.attr("p", 2)
    if p == 1:
        norm = ops.sum(ops.abs(x), axis=axis, keepdims=True)
    elif p == 2:
        norm = ops.sqrt(ops.sum(ops.square(x), axis=axis, keepdims=True))
    else:
        _unsupported(node, "p", p, ["1", "2"])
    zero = ops.equal(norm, 0)
    return ops.where(zero, 0.0, ops.divide(x, ops.where(zero, 1.0, norm)))


# -- dropout ----------------------------------------------------------------------------------

def _dropout(ctx, node, x, ratio: float, training: bool, mask_dtype: str):
    """Inference (and ratio 0) is the identity with an all-true mask; training drops with
    keys from the ``seed`` attribute, so it cannot reproduce another runtime's draws."""
    ops = ctx.ops
    if not training or ratio == 0:
        return x, ops.ones(ops.shape(x), mask_dtype)
    keep = ops.greater_equal(ops.uniform(ops.random_key(node.attr("seed", 0)), ops.shape(x)), ratio)
    scale = 0.0 if ratio >= 1 else 1.0 / (1.0 - ratio)
    return ops.where(keep, ops.multiply(x, scale), 0.0), ops.cast(keep, mask_dtype)


@handler("Dropout", since=1)
def dropout_1(ctx, node, x):
    """Versions 1 and 6: ``is_test=0`` (the default) is training; the mask has x's type."""
    return _dropout(ctx, node, x, node.attr("ratio", 0.5), not node.attr("is_test", 0), ctx.ops.dtype(x))


@handler("Dropout", since=7)
def dropout_7(ctx, node, x):
    """Versions 7 and 9: always inference; the mask has x's type."""
    return _dropout(ctx, node, x, node.attr("ratio", 0.5), False, ctx.ops.dtype(x))


@handler("Dropout", since=10)
def dropout_10(ctx, node, x):
    """Version 10: always inference; the mask is bool."""
    return _dropout(ctx, node, x, node.attr("ratio", 0.5), False, "bool")


@handler("Dropout", since=12, static=(2,))
def dropout_12(ctx, node, x, ratio=None, training_mode=None):
    """Version 12 on: ``ratio`` and ``training_mode`` are inputs; ratio is read only when
    training."""
    training = bool(training_mode is not None and np.asarray(training_mode).item())
    rate = float(np.asarray(ctx.static(ratio)).item()) if training and ratio is not None else 0.5
    return _dropout(ctx, node, x, rate, training, "bool")


# -- convolution ------------------------------------------------------------------------------

def _geometry(node, dims: int):
    strides = list(node.attr("strides", None) or [1] * dims)
    dilations = list(node.attr("dilations", None) or [1] * dims)
    return strides, dilations


def _pads(node, spatial, kernel, strides, dilations) -> list[tuple[int, int]]:
    """``(before, after)`` per spatial dim from ``auto_pad`` and ``pads``. ``SAME_*`` pads
    so that ``out = ceil(in / stride)``; an odd total puts the extra pixel after (UPPER) or
    before (LOWER)."""
    dims = len(spatial)
    auto = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto == "NOTSET":
        pads = list(node.attr("pads", None) or [0] * 2 * dims)
        return [(int(pads[i]), int(pads[i + dims])) for i in range(dims)]
    if auto == "VALID":
        return [(0, 0)] * dims
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        _unsupported(node, "auto_pad", auto, ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    out = []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small = total // 2
        out.append((small, total - small) if auto == "SAME_UPPER" else (total - small, small))
    return out


def _check_kernel(node, kernel) -> None:
    declared = node.attr("kernel_shape", None)
    if declared is not None and list(declared) != list(kernel):
        raise UnsupportedOp(message(f"{node.op} node {node.name!r}: kernel_shape disagrees with the weights",
                                    expected=str(list(kernel)), received=str(list(declared))))


def conv_settings(ops, node, x, w) -> tuple[list[int], list[tuple[int, int]], list[int]]:
    """Strides, ``(before, after)`` pads and dilations of a Conv-like node (Conv, ConvInteger,
    QLinearConv) for input ``x`` and weights ``w``."""
    kernel = ops.shape(w)[2:]
    _check_kernel(node, kernel)
    strides, dilations = _geometry(node, len(kernel))
    return strides, _pads(node, ops.shape(x)[2:], kernel, strides, dilations), dilations


@handler("Conv", since=1)
def conv(ctx, node, x, w, b=None):
    strides, pads, dilations = conv_settings(ctx.ops, node, x, w)
    return ctx.ops.conv(x, w, b, stride=strides, padding=pads, dilation=dilations, groups=node.attr("group", 1))


def _crop_pad(ops, x, widths):
    """Pad axis by axis with ``(before, after)``; negative widths crop instead."""
    shape = ops.shape(x)
    starts, stops, axes = [], [], []
    for axis, (before, after) in enumerate(widths):
        if before < 0 or after < 0:
            starts.append(max(-before, 0))
            stops.append(shape[axis] - max(-after, 0))
            axes.append(axis)
    if axes:
        x = ops.slice(x, starts, stops, axes=axes)
    positive = [(max(b, 0), max(a, 0)) for b, a in widths]
    return ops.pad(x, positive) if any(b or a for b, a in positive) else x


@handler("ConvTranspose", since=1)
def conv_transpose(ctx, node, x, w, b=None):
    """A convolution of ``x`` with ``stride - 1`` zeros inserted between elements, padded
    by ``dilation * (kernel - 1) - pads`` (plus ``output_padding`` after), with the kernel
    flipped and its in/out channels swapped per group."""
    ops = ctx.ops
    shape = ops.shape(x)
    spatial, kernel = shape[2:], ops.shape(w)[2:]
    dims, group = len(spatial), node.attr("group", 1)
    _check_kernel(node, kernel)
    strides, dilations = _geometry(node, dims)
    extra = list(node.attr("output_padding", None) or [0] * dims)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    full = [s * (n - 1) + e for s, n, e in zip(strides, spatial, span)]
    auto = node.attr("auto_pad", "NOTSET") or "NOTSET"
    target = node.attr("output_shape", None)
    if target is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX: total padding from the wanted size; SAME_UPPER puts the odd pixel after
        wanted = list(target)[-dims:] if target is not None else [n * s for n, s in zip(spatial, strides)]
        totals = [f + o - t for f, o, t in zip(full, extra, wanted)]
        pads = [(t // 2, t - t // 2) if auto == "SAME_UPPER" else (t - t // 2, t // 2) for t in totals]
    elif auto == "VALID":
        pads = [(0, 0)] * dims
    elif auto == "NOTSET":
        pads = _pads(node, spatial, kernel, strides, dilations)
    else:
        _unsupported(node, "auto_pad", auto, ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    z = x
    for i, s in enumerate(strides):  # zeros between elements: (n) -> (n, s) -> (n * s)
        if s > 1:
            axis = 2 + i
            current = ops.shape(z)
            z = ops.expand_dims(z, axis + 1)
            widths = [(0, 0)] * (len(current) + 1)
            widths[axis + 1] = (0, s - 1)
            z = ops.reshape(ops.pad(z, widths), (*current[:axis], current[axis] * s, *current[axis + 1:]))
    # the inserted length is n * s: s - 1 trailing zeros beyond the dilated input
    widths = [(0, 0), (0, 0)] + [(e - 1 - pb, e - 1 - pe + o - (s - 1))
                                 for e, (pb, pe), o, s in zip(span, pads, extra, strides)]
    z = _crop_pad(ops, z, widths)
    c_in, c_out = ops.shape(w)[0], ops.shape(w)[1] * group
    kernel_t = ops.reshape(w, (group, c_in // group, c_out // group, *kernel))
    kernel_t = ops.transpose(kernel_t, (0, 2, 1, *range(3, 3 + dims)))
    kernel_t = ops.flip(ops.reshape(kernel_t, (c_out, c_in // group, *kernel)), tuple(range(2, 2 + dims)))
    return ops.conv(z, kernel_t, b, stride=1, padding=[(0, 0)] * dims, dilation=dilations, groups=group)


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
        x = ops.reshape(x, (*shape[:axis], *pos.shape, *shape[axis + 1:]))
    x = ops.transpose(x, (0, 1, *range(2, 2 + 2 * dims, 2), *range(3, 3 + 2 * dims, 2)))
    shape = ops.shape(x)
    return ops.reshape(x, (*shape[:2 + dims], math.prod(p.shape[1] for p in positions)))


def _window_mask(positions, low, high) -> np.ndarray:
    """``(*out, K)`` booleans: every coordinate of the window position in ``[low, high)``."""
    mask = np.ones((), bool)
    for i, pos in enumerate(positions):
        inside = (pos >= low[i]) & (pos < high[i])  # (out_i, k_i)
        shape = [1] * (2 * len(positions))
        shape[i], shape[len(positions) + i] = pos.shape
        mask = mask & inside.reshape(shape)
    outs = mask.shape[:len(positions)]
    return mask.reshape(*outs, -1)


def _pool_setup(ctx, node, x):
    ops = ctx.ops
    spatial = ops.shape(x)[2:]
    kernel = list(node.attr("kernel_shape"))
    strides, dilations = _geometry(node, len(kernel))
    pads, out = _pool_plan(node, spatial, kernel, strides, dilations)
    positions = [_window_positions(n, pb, o, k, s, d)
                 for n, (pb, _), o, k, s, d in zip(spatial, pads, out, kernel, strides, dilations)]
    return spatial, kernel, strides, dilations, pads, out, positions


def _max_pool(ctx, node, x):
    ops = ctx.ops
    spatial, kernel, strides, dilations, pads, out, positions = _pool_setup(ctx, node, x)
    want_indices = len([o for o in node.outputs if o]) > 1
    dtype = ops.dtype(x)
    if not want_indices and dtype in _FLOATS:
        # the op set's max_pool with ONNX's output size spelled as explicit end padding
        widths = [(pb, (o - 1) * s + (k - 1) * d + 1 - n - pb)
                  for n, (pb, _), o, k, s, d in zip(spatial, pads, out, kernel, strides, dilations)]
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
    order = "F" if node.attr("storage_order", 0) else "C"
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
    total, _, _ = _sum_pool(ctx, node, ops.power(ops.abs(x), float(p)) if p != 2 else ops.square(x),
                            spatial, positions, pads)
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
    inferred = [*shape[:2], *[(n - 1) * s - pads[i] - pads[i + dims] + k
                              for i, (n, s, k) in enumerate(zip(shape[2:], strides, kernel))]]
    flat = ops.zeros((math.prod(inferred),), ops.dtype(x))
    flat = ops.scatter(flat, ops.reshape(ops.cast(indices, "int64"), (-1,)), ops.reshape(x, (-1,)), axis=0)
    y = ops.reshape(flat, inferred)
    if output_shape is None:
        return y
    target = [int(v) for v in np.asarray(output_shape)]
    return _crop_pad(ops, y, [(0, t - n) for t, n in zip(target, inferred)])


# -- losses -----------------------------------------------------------------------------------

def _nll(ctx, node, log_prob, target, weight):
    """``-log_prob[n, target[n, ...], ...]`` weighted per class; ``ignore_index`` targets
    weigh 0, and ``mean`` divides by the total weight (the count when unweighted)."""
    ops = ctx.ops
    reduction = node.attr("reduction", "mean")
    ignore = node.attr("ignore_index", None)
    target = ops.cast(target, "int64")
    safe = target if ignore is None else ops.where(ops.equal(target, ignore), 0, target)
    picked = ops.squeeze(ops.take_along_axis(log_prob, ops.expand_dims(safe, 1), axis=1), axis=1)
    loss = ops.negative(picked)
    weights = None
    if weight is not None:
        weights = ops.take(weight, safe, axis=0)
    if ignore is not None:
        keep = ops.logical_not(ops.equal(target, ignore))
        weights = ops.where(keep, weights if weights is not None else 1.0, 0.0) if weights is not None \
            else ops.cast(keep, ops.dtype(loss))
    if weights is not None:
        loss = ops.multiply(loss, weights)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return ops.sum(loss)
    if reduction != "mean":
        _unsupported(node, "reduction", reduction, ["none", "sum", "mean"])
    return ops.mean(loss) if weights is None else ops.divide(ops.sum(loss), ops.sum(weights))


@handler("NegativeLogLikelihoodLoss", since=12)
def nll_loss(ctx, node, x, target, weight=None):
    return _nll(ctx, node, x, target, weight)


@handler("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(ctx, node, scores, labels, weight=None):
    """The NLL of ``log_softmax(scores, axis=1)``; the second output is that log-probability."""
    log_prob = ctx.ops.log_softmax(scores, axis=1)
    return _nll(ctx, node, log_prob, labels, weight), log_prob


# -- attention --------------------------------------------------------------------------------

def _split_heads(ops, x, heads: int):
    batch, length, hidden = ops.shape(x)
    return ops.transpose(ops.reshape(x, (batch, length, heads, hidden // heads)), (0, 2, 1, 3))


def _masked_softmax(ops, x):
    """Softmax over the last axis where a row of only -inf gives zeros, not NaN."""
    top = ops.max(x, axis=-1, keepdims=True)
    top = ops.where(_isneginf(ops, top), ops.zeros((), ops.dtype(top)), top)
    e = ops.exp(ops.subtract(x, top))
    total = ops.sum(e, axis=-1, keepdims=True)
    return ops.divide(e, ops.where(ops.equal(total, 0), ops.ones((), ops.dtype(total)), total))


def _attention(ctx, node, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None,
               left: int = -1, right: int = -1):
    """ONNX Attention (23-25), following the reference step by step: Q and K each scaled by
    ``sqrt(scale)``, softcap before the additive bias, a bias that sums the mask (a bool
    mask contributes -inf where False), the bottom-right causal frontier, the sliding
    window and the ``nonpad_kv_seqlen`` padding, a fully masked row giving zeros, and
    the KV heads repeated for grouped-query attention."""
    ops = ctx.ops
    dtype = ops.dtype(q)
    three_d = _rank(ops, q) == 3
    if three_d:
        q_heads, kv_heads = node.attr("q_num_heads"), node.attr("kv_num_heads")
        if not q_heads or not kv_heads:
            raise UnsupportedOp(message(f"Attention node {node.name!r} has 3-D inputs but no head counts",
                                        expected="q_num_heads and kv_num_heads attributes"))
        q, k, v = _split_heads(ops, q, q_heads), _split_heads(ops, k, kv_heads), _split_heads(ops, v, kv_heads)
    batch, q_heads, q_len, head = ops.shape(q)
    scale = node.attr("scale", None)
    root = math.sqrt(1.0 / math.sqrt(head) if scale is None else scale)
    if past_key is not None:
        k = ops.concat([past_key, k], axis=2)
        v = ops.concat([past_value, v], axis=2)
    present_key, present_value = k, v
    kv_len = ops.shape(k)[2]
    past = ops.shape(past_key)[2] if past_key is not None else 0

    bias = None  # additive, broadcastable to (batch, heads, q_len, kv_len)

    def add(term):
        nonlocal bias
        bias = term if bias is None else ops.add(bias, term)

    if mask is not None:
        short = kv_len - ops.shape(mask)[-1]
        if ops.dtype(mask) == "bool":
            if short > 0:
                mask = ops.pad(mask, [(0, 0)] * (_rank(ops, mask) - 1) + [(0, short)], value=False)
            add(_bias_where(ops, mask, dtype))
        else:
            mask = ops.cast(mask, dtype)
            if short > 0:
                mask = ops.pad(mask, [(0, 0)] * (_rank(ops, mask) - 1) + [(0, short)], value=-np.inf)
            add(mask)
    rows = np.arange(q_len).reshape(q_len, 1)
    cols = np.arange(kv_len).reshape(1, kv_len)
    causal = bool(node.attr("is_causal", 0))
    if causal or left >= 0 or right >= 0:
        if nonpad is None:  # a static offset: the cached keys before this query block
            diff = rows + past - cols
            allowed = np.ones((q_len, kv_len), bool)
            if causal:
                allowed &= diff >= 0
            if left >= 0:
                allowed &= diff <= left
            if right >= 0:
                allowed &= -diff <= right
            add(_static_bias(ops, allowed, dtype))
        else:  # an external cache: the offset is nonpad_kv_seqlen - q_len per batch
            offset = ops.reshape(ops.subtract(ops.cast(nonpad, "int64"), q_len), (-1, 1, 1, 1))
            diff = ops.subtract(ops.add(ops.asarray(rows, dtype="int64"), offset), ops.asarray(cols, dtype="int64"))
            allowed = None
            for ok in ([ops.greater_equal(diff, 0)] if causal else []) + \
                      ([ops.less_equal(diff, left)] if left >= 0 else []) + \
                      ([ops.less_equal(ops.negative(diff), right)] if right >= 0 else []):
                allowed = ok if allowed is None else ops.logical_and(allowed, ok)
            add(_bias_where(ops, allowed, dtype))
    if nonpad is not None:
        lengths = ops.reshape(ops.cast(nonpad, "int64"), (-1, 1, 1, 1))
        add(_bias_where(ops, ops.less(ops.asarray(cols.reshape(1, 1, 1, kv_len), dtype="int64"), lengths), dtype))

    kv_heads = ops.shape(k)[1]
    if kv_heads != q_heads:  # grouped-query attention: each KV head serves q_heads // kv_heads
        reps = q_heads // kv_heads
        repeat = lambda t: ops.reshape(ops.broadcast_to(ops.expand_dims(t, 2), (batch, kv_heads, reps, *ops.shape(t)[2:])),  # noqa: E731
                                       (batch, q_heads, *ops.shape(t)[2:]))
        k, v = repeat(k), repeat(v)
    # scalars as arrays of the inputs' dtype: the numpy backend promotes bfloat16 with a
    # Python float (and its matmul) to float32
    root = ops.full((), root, dtype)
    scores = ops.cast(ops.matmul(ops.multiply(q, root), ops.swap_last(ops.multiply(k, root))), dtype)
    softcap = node.attr("softcap", 0.0)
    if softcap and softcap > 0:
        cap = ops.full((), softcap, dtype)
        scores = ops.multiply(ops.tanh(ops.divide(scores, cap)), cap)
    mode = node.attr("qk_matmul_output_mode", 0)
    qk_out = scores
    if bias is not None:
        scores = ops.add(scores, bias)
    if mode == 2:
        qk_out = scores
    precision = node.attr("softmax_precision", None)
    if precision is not None:
        scores = ops.cast(scores, onnx_dtype(precision))
    probs = _masked_softmax(ops, scores)
    if bias is not None:  # rows with no attendable key are zero (decided on the bias)
        dead = _isneginf(ops, ops.max(bias, axis=-1, keepdims=True))
        probs = ops.where(dead, ops.zeros((), ops.dtype(probs)), probs)
    if mode == 3:
        qk_out = probs
    elif mode not in (0, 1, 2):
        _unsupported(node, "qk_matmul_output_mode", mode, ["0", "1", "2", "3"])
    y = ops.cast(ops.matmul(ops.cast(probs, dtype), v), ops.dtype(v))
    if three_d:
        y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (batch, q_len, -1))
    return y, present_key, present_value, ops.cast(qk_out, dtype)


@handler("Attention", since=23)
def attention_23(ctx, node, q, k, v, attn_mask=None, past_key=None, past_value=None):
    return _attention(ctx, node, q, k, v, attn_mask, past_key, past_value)


@handler("Attention", since=24)
def attention_24(ctx, node, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
    """Version 24 adds ``nonpad_kv_seqlen`` (an external KV cache)."""
    return _attention(ctx, node, q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen)


@handler("Attention", since=25)
def attention_25(ctx, node, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None):
    """Version 25 adds the ``left_window_size`` / ``right_window_size`` sliding window."""
    return _attention(ctx, node, q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen,
                      node.attr("left_window_size", -1), node.attr("right_window_size", -1))


@handler("RotaryEmbedding", since=23)
def rotary_embedding(ctx, node, x, cos_cache, sin_cache, position_ids=None):
    """Rotate the first ``rotary_embedding_dim`` features of each head by the cached angles:
    halves (``x1, x2``) or, with ``interleaved=1``, even and odd features."""
    ops = ctx.ops
    shape = ops.shape(x)
    if len(shape) == 4:  # (batch, heads, seq, head) -> (batch, seq, heads, head)
        x = ops.transpose(x, (0, 2, 1, 3))
    else:
        heads = node.attr("num_heads", 0)
        if not heads:
            raise UnsupportedOp(message(f"RotaryEmbedding node {node.name!r} has a 3-D input but no num_heads",
                                        expected="the num_heads attribute"))
        x = ops.reshape(x, (shape[0], shape[1], heads, shape[2] // heads))
    head = ops.shape(x)[3]
    dim = node.attr("rotary_embedding_dim", 0) or head
    if position_ids is not None:
        cos_cache = ops.take(cos_cache, ops.cast(position_ids, "int64"), axis=0)
        sin_cache = ops.take(sin_cache, ops.cast(position_ids, "int64"), axis=0)
    cos, sin = ops.expand_dims(cos_cache, 2), ops.expand_dims(sin_cache, 2)
    rotate = ops.slice(x, [0], [dim], axes=[3]) if dim < head else x
    interleaved = bool(node.attr("interleaved", 0))
    if interleaved:
        x1 = ops.slice(rotate, [0], [dim], axes=[3], steps=[2])
        x2 = ops.slice(rotate, [1], [dim], axes=[3], steps=[2])
    else:
        x1, x2 = ops.split(rotate, 2, axis=-1)
    real = ops.subtract(ops.multiply(cos, x1), ops.multiply(sin, x2))
    imag = ops.add(ops.multiply(sin, x1), ops.multiply(cos, x2))
    if interleaved:
        rotated = ops.reshape(ops.stack([real, imag], axis=-1), ops.shape(rotate))
    else:
        rotated = ops.concat([real, imag], axis=-1)
    if dim < head:
        rotated = ops.concat([rotated, ops.slice(x, [dim], [head], axes=[3])], axis=-1)
    if len(shape) == 4:
        return ops.transpose(rotated, (0, 2, 1, 3))
    return ops.reshape(rotated, shape)


# -- recurrent layers -------------------------------------------------------------------------

def _affine(ops, x, alpha, beta):
    return ops.add(ops.multiply(x, alpha), beta)


#: ONNX's recurrent activation names (lower-cased) -> (function, default alpha, default beta)
_ACTIVATIONS = {
    "sigmoid": (lambda ops, x, a, b: ops.sigmoid(x), None, None),
    "tanh": (lambda ops, x, a, b: ops.tanh(x), None, None),
    "relu": (lambda ops, x, a, b: ops.relu(x), None, None),
    "affine": (_affine, 1.0, 0.0),
    "leakyrelu": (lambda ops, x, a, b: ops.where(ops.less(x, 0), ops.multiply(x, a), x), 0.01, None),
    "thresholdedrelu": (lambda ops, x, a, b: ops.where(ops.greater(x, a), x, 0.0), 1.0, None),
    "scaledtanh": (lambda ops, x, a, b: ops.multiply(ops.tanh(ops.multiply(x, b)), a), 1.0, 1.0),
    "hardsigmoid": (lambda ops, x, a, b: ops.clip(_affine(ops, x, a, b), 0.0, 1.0), 0.2, 0.5),
    "elu": (lambda ops, x, a, b: ops.where(ops.less(x, 0), ops.multiply(ops.subtract(ops.exp(x), 1.0), a), x),
            1.0, None),
    "softsign": (lambda ops, x, a, b: ops.divide(x, ops.add(ops.abs(x), 1.0)), None, None),
    "softplus": (lambda ops, x, a, b: ops.softplus(x), None, None),
}


def _activations(node, defaults: list[str], directions: int):
    """One list of callables ``f(ops, x)`` per direction; ``activation_alpha`` and
    ``activation_beta`` are consumed in order by the activations that take them."""
    names = list(node.attr("activations", None) or defaults * directions)
    alphas = list(node.attr("activation_alpha", None) or [])
    betas = list(node.attr("activation_beta", None) or [])
    funcs = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            _unsupported(node, "activation", name, sorted(_ACTIVATIONS))
        fn, alpha, beta = _ACTIVATIONS[key]
        if alpha is not None:
            alpha = alphas.pop(0) if alphas else alpha
        if beta is not None:
            beta = betas.pop(0) if betas else beta
        funcs.append(lambda ops, x, fn=fn, a=alpha, b=beta: fn(ops, x, a, b))
    per = len(defaults)
    if len(funcs) != per * directions:
        _unsupported(node, "number of activations", len(funcs), [str(per * directions)])
    return [funcs[d * per:(d + 1) * per] for d in range(directions)]


def _reverse_steps(ops, x, lengths):
    """``x`` (T, B, ...) with each batch entry's first ``lengths[b]`` steps reversed (the
    padding after them stays in place), or the whole time axis when no lengths."""
    if lengths is None:
        return ops.flip(x, (0,))  # a tuple: the torch backend rejects an int axis
    steps = ops.shape(x)[0]
    t = ops.asarray(np.arange(steps).reshape(steps, 1), dtype="int64")
    index = ops.where(ops.less(t, lengths), ops.subtract(ops.subtract(lengths, 1), t), t)  # (T, B)
    index = ops.reshape(index, (*ops.shape(index), *([1] * (_rank(ops, x) - 2))))
    return ops.take_along_axis(x, ops.broadcast_to(index, ops.shape(x)), axis=0)


def _recurrent(ctx, node, x, w, r, b, lengths, states, step, defaults, gates: int):
    """Shared driver of RNN, GRU and LSTM: layout, directions, sequence lengths, clipping.

    ``step(ops, acts, x_proj_t, states, r, rb) -> states`` computes one step where
    ``x_proj_t = x_t @ W^T + Wb`` and ``states[0]`` is the hidden state. Past a batch
    entry's length the states hold and the output is zero."""
    ops = ctx.ops
    layout = node.attr("layout", 0)
    if layout:
        x = ops.transpose(x, (1, 0, 2))
        states = [None if s is None else ops.transpose(s, (1, 0, 2)) for s in states]
    steps, batch = ops.shape(x)[:2]
    directions = ops.shape(w)[0]
    hidden = ops.shape(r)[-1]
    dtype = ops.dtype(x)
    direction = node.attr("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        _unsupported(node, "direction", direction, ["forward", "reverse", "bidirectional"])
    acts = _activations(node, defaults, directions)
    clip = node.attr("clip", None)
    if lengths is not None:
        lengths = ops.reshape(ops.cast(lengths, "int64"), (1, -1))  # (1, B)
    ys, finals = [], []
    for d in range(directions):
        reverse = direction == "reverse" or d == 1
        xs = _reverse_steps(ops, x, lengths) if reverse else x
        wb = ops.take(b, d, axis=0) if b is not None else None
        proj = ops.matmul(xs, ops.swap_last(ops.take(w, d, axis=0)))  # (T, B, gates*H)
        if wb is not None:
            proj = ops.add(proj, ops.slice(wb, [0], [gates * hidden]))
        rb = ops.slice(wb, [gates * hidden], [2 * gates * hidden]) if wb is not None else None
        rd = ops.swap_last(ops.take(r, d, axis=0))
        current = [ops.zeros((batch, hidden), dtype) if s is None else ops.take(s, d, axis=0) for s in states]
        outputs = []
        for t in range(steps):
            new = step(ops, acts[d], ops.take(proj, t, axis=0), current, rd, rb, clip, d)
            if lengths is not None:
                alive = ops.reshape(ops.less(t, lengths), (-1, 1))
                new = [ops.where(alive, n, c) for n, c in zip(new, current)]
                outputs.append(ops.where(alive, new[0], ops.zeros((), dtype)))
            else:
                outputs.append(new[0])
            current = new
        y = ops.stack(outputs, axis=0)  # (T, B, H)
        ys.append(_reverse_steps(ops, y, lengths) if reverse else y)
        finals.append(current)
    y = ops.stack(ys, axis=1)  # (T, dirs, B, H)
    last = [ops.stack([f[i] for f in finals], axis=0) for i in range(len(states))]  # (dirs, B, H)
    if layout:
        y = ops.transpose(y, (2, 0, 1, 3))
        last = [ops.transpose(s, (1, 0, 2)) for s in last]
    return (y, *last)


def _clip(ops, x, clip):
    return x if clip is None else ops.clip(x, -clip, clip)


def _rnn_step(ops, acts, xp, states, rd, rb, clip, d):
    gates = ops.add(xp, ops.matmul(states[0], rd))
    if rb is not None:
        gates = ops.add(gates, rb)
    return [acts[0](ops, _clip(ops, gates, clip))]


@handler("RNN", since=1)
def rnn(ctx, node, x, w, r, b=None, sequence_lens=None, initial_h=None):
    """``H = f(X W^T + H R^T + Wb + Rb)``, ``f`` defaulting to Tanh."""
    return _recurrent(ctx, node, x, w, r, b, sequence_lens, [initial_h], _rnn_step, ["Tanh"], 1)


def _gru_step_factory(linear_before_reset: bool):
    def step(ops, acts, xp, states, rd, rb, clip, d):
        f, g = acts
        h = states[0]
        xz, xr, xh = ops.split(xp, 3, axis=-1)
        rz, rr, rh = ops.split(rd, 3, axis=-1)
        bz, br, bh = ops.split(rb, 3, axis=-1) if rb is not None else (None, None, None)
        plus = lambda a, bias: a if bias is None else ops.add(a, bias)  # noqa: E731
        z = f(ops, _clip(ops, plus(ops.add(xz, ops.matmul(h, rz)), bz), clip))
        reset = f(ops, _clip(ops, plus(ops.add(xr, ops.matmul(h, rr)), br), clip))
        if linear_before_reset:
            candidate = ops.add(xh, ops.multiply(reset, plus(ops.matmul(h, rh), bh)))
        else:
            candidate = plus(ops.add(xh, ops.matmul(ops.multiply(reset, h), rh)), bh)
        candidate = g(ops, _clip(ops, candidate, clip))
        return [ops.add(ops.multiply(ops.subtract(1.0, z), candidate), ops.multiply(z, h))]
    return step


@handler("GRU", since=1)
def gru(ctx, node, x, w, r, b=None, sequence_lens=None, initial_h=None):
    """ONNX's GRU with gates ``z, r, h`` in W, R and B (not the op set's ``r, z, n``);
    ``linear_before_reset`` applies the reset gate after ``H R_h^T + Rb_h``."""
    step = _gru_step_factory(bool(node.attr("linear_before_reset", 0)))
    return _recurrent(ctx, node, x, w, r, b, sequence_lens, [initial_h], step, ["Sigmoid", "Tanh"], 3)


@handler("LSTM", since=1)
def lstm(ctx, node, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None):
    """ONNX's LSTM with gates ``i, o, f, c`` in W, R and B (not the op set's ``i, f, g, o``),
    peepholes ``P = [Pi, Po, Pf]`` and ``input_forget`` coupling ``f = 1 - i``."""
    ops = ctx.ops
    couple = bool(node.attr("input_forget", 0))

    def step(ops, acts, xp, states, rd, rb, clip, d):
        f, g, h_act = acts
        h, c = states
        gates = ops.add(xp, ops.matmul(h, rd))
        if rb is not None:
            gates = ops.add(gates, rb)
        gi, go, gf, gc = ops.split(gates, 4, axis=-1)
        pi, po, pf = ops.split(ops.take(p, d, axis=0), 3) if p is not None else (None, None, None)
        peep = lambda a, weight, state: a if weight is None else ops.add(a, ops.multiply(weight, state))  # noqa: E731
        i = f(ops, _clip(ops, peep(gi, pi, c), clip))
        forget = ops.subtract(1.0, i) if couple else f(ops, _clip(ops, peep(gf, pf, c), clip))
        c_new = ops.add(ops.multiply(forget, c), ops.multiply(i, g(ops, _clip(ops, gc, clip))))
        o = f(ops, _clip(ops, peep(go, po, c_new), clip))
        return [ops.multiply(o, h_act(ops, c_new)), c_new]

    del ops
    return _recurrent(ctx, node, x, w, r, b, sequence_lens, [initial_h, initial_c], step,
                      ["Sigmoid", "Tanh", "Tanh"], 4)


# -- resize -----------------------------------------------------------------------------------
# Resize is separable: each resized axis becomes a gather of ``n`` neighbours per output
# position and a weighted sum, with the neighbours and weights computed here in numpy
# (ONNX's reference, vectorised per axis) from the static scales or sizes.

def _nearest_weights(mode: str):
    def weights(ratio: float, scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        pick_ceil = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False,
                     "ceil": True, "simple": scale < 1}[mode]  # "simple": Resize-10 / Upsample
        return np.array([0.0, 1.0]) if pick_ceil else np.array([1.0, 0.0])
    return weights


def _cubic_weights(a: float, antialias: bool):
    def weights(ratio: float, scale: float) -> np.ndarray:
        if antialias:
            scale = min(scale, 1.0)
            start = int(np.floor(-2 / scale) + 1)
            x = np.abs(scale * (np.arange(start, 2 - start) - ratio))
            w = np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1,
                         np.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a, 0.0))
            return w / w.sum()
        return np.array([((a * (ratio + 1) - 5 * a) * (ratio + 1) + 8 * a) * (ratio + 1) - 4 * a,
                         ((a + 2) * ratio - (a + 3)) * ratio * ratio + 1,
                         ((a + 2) * (1 - ratio) - (a + 3)) * (1 - ratio) * (1 - ratio) + 1,
                         ((a * (2 - ratio) - 5 * a) * (2 - ratio) + 8 * a) * (2 - ratio) - 4 * a])
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
        x = np.full(out_size, (stop - start) * (size - 1) / 2) if width == 1 else \
            out * (stop - start) * (size - 1) / (width - 1)
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
        _unsupported(node, "coordinate_transformation_mode", mode,
                     ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                      "asymmetric", "tf_crop_and_resize"])
    return x, outside


def _resize_plan(node, size, scale, out_size, weights, coordinate_mode, roi, exclude_outside):
    """``(indices (out, n), weights (out, n), extrapolated (out,) or None)`` for one axis."""
    x, outside = _source_coordinates(node, coordinate_mode, np.arange(out_size, dtype=np.float64), scale,
                                     size, out_size, roi)
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
        gathered = ops.reshape(ops.take(x, index.reshape(-1), axis=axis), (*shape[:axis], *index.shape, *shape[axis + 1:]))
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
    empty = lambda v: v is None or np.asarray(v).size == 0  # noqa: E731
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
        raise UnsupportedOp(message(f"Resize node {node.name!r} has neither scales nor sizes",
                                    expected="a non-empty scales or sizes input"))
    antialias = bool(node.attr("antialias", 0))
    weights = {"nearest": lambda: _nearest_weights(nearest_mode),
               "linear": lambda: _linear_weights(antialias),
               "cubic": lambda: _cubic_weights(node.attr("cubic_coeff_a", -0.75), antialias)}[mode]()
    dtype = ops.dtype(x)
    work = dtype if dtype in ("float32", "float64") or mode == "nearest" else "float32"
    y = ops.cast(x, work) if work != dtype else x
    for i, axis in enumerate(axes):
        pair = None
        if roi is not None and coordinate_mode == "tf_crop_and_resize":
            pair = (roi[i], roi[len(axes) + i]) if len(roi) == 2 * len(axes) else (roi[axis], roi[rank + axis])
        if math.isclose(factors[i], 1.0) and sizes[i] == shape[axis] and \
                (pair is None or (math.isclose(pair[0], 0.0) and math.isclose(pair[1], 1.0))):
            continue
        if pair is None and coordinate_mode == "tf_crop_and_resize":
            pair = (0.0, 1.0)
        index, coeffs, outside = _resize_plan(node, shape[axis], factors[i], sizes[i], weights, coordinate_mode,
                                              pair, bool(node.attr("exclude_outside", 0)))
        y = _resize_axis(ops, y, axis, index, coeffs, outside, node.attr("extrapolation_value", 0.0),
                         mode == "nearest", work)
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
    return _resize(ctx, node, x, roi, scales, sizes, node.attr("mode", "nearest"),
                   node.attr("coordinate_transformation_mode", "half_pixel"),
                   node.attr("nearest_mode", "round_prefer_floor"))


def _upsample_mode(node) -> str:
    mode = node.attr("mode", "nearest")
    return {"bilinear": "linear", "trilinear": "linear"}.get(mode, mode)


@handler("Upsample", since=7)
def upsample_7(ctx, node, x):
    """Asymmetric coordinates; nearest rounds down (repeats for integer scales)."""
    return _resize(ctx, node, x, None, np.asarray(node.attr("scales")), None, _upsample_mode(node), "asymmetric",
                   "floor")


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
        return ops.where(even, ops.add(near, ops.multiply(rest, 1.0 if near == low else -1.0)),
                         ops.subtract(far, ops.multiply(rest, 1.0 if near == low else -1.0)))

    below = fold(ops.subtract(low, v), low, high)
    above = fold(ops.subtract(v, high), high, low)
    return ops.where(ops.less(v, low), below, ops.where(ops.greater(v, high), above, v))


def _cubic_kernel(ops, t):
    """Keys' cubic weights (a = -0.75) for offsets -1, 0, 1, 2 around ``floor(x)``."""
    a = -0.75
    u, w = ops.add(t, 1.0), ops.subtract(1.0, t)
    v = ops.subtract(2.0, t)
    far = lambda s: ops.subtract(ops.multiply(ops.add(ops.multiply(ops.subtract(ops.multiply(s, a), 5 * a), s), 8 * a), s), 4 * a)  # noqa: E731
    near = lambda s: ops.add(ops.multiply(ops.multiply(ops.subtract(ops.multiply(s, a + 2), a + 3), s), s), 1.0)  # noqa: E731
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
        c = ops.multiply(ops.add(g, 1.0), (size - 1) / 2) if align else \
            ops.divide(ops.subtract(ops.multiply(ops.add(g, 1.0), float(size)), 1.0), 2.0)
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
    strides = [math.prod(spatial[i + 1:]) for i in range(dims)]
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


def _product(lists):
    combos = [[]]
    for options in lists:
        combos = [c + [o] for c in combos for o in options]
    return combos


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


@handler("Col2Im", since=18, static=(1, 2))
def col2im(ctx, node, x, image_shape, block_shape):
    """Sum sliding blocks ``(N, C * prod(block), L)`` back into images ``(N, C, *image)``:
    a scatter-add to positions computed in numpy (positions in the padding go to a
    discarded extra slot)."""
    ops = ctx.ops
    image = [int(v) for v in np.asarray(image_shape)]
    block = [int(v) for v in np.asarray(block_shape)]
    dims = len(image)
    strides, dilations = _geometry(node, dims)
    pads = list(node.attr("pads", None) or [0] * 2 * dims)
    counts = [(n + pads[i] + pads[i + dims] - ((k - 1) * d + 1)) // s + 1
              for i, (n, k, s, d) in enumerate(zip(image, block, strides, dilations))]
    kernel_pos = np.stack(np.meshgrid(*[np.arange(k) for k in block], indexing="ij"), -1).reshape(-1, dims)
    block_pos = np.stack(np.meshgrid(*[np.arange(c) for c in counts], indexing="ij"), -1).reshape(-1, dims)
    where = block_pos[None, :, :] * strides - np.asarray(pads[:dims]) + kernel_pos[:, None, :] * dilations
    inside = np.all((where >= 0) & (where < image), axis=-1)
    plane = math.prod(image)
    flat = np.where(inside, np.ravel_multi_index(tuple(np.clip(where, 0, np.asarray(image) - 1).transpose(2, 0, 1)),
                                                 image), plane).reshape(-1)
    batch, width = ops.shape(x)[0], ops.shape(x)[1]
    channels = width // len(kernel_pos)
    updates = ops.reshape(x, (batch, channels, -1))
    index = ops.broadcast_to(ops.asarray(flat, dtype="int64"), (batch, channels, flat.size))
    out = ops.scatter(ops.zeros((batch, channels, plane + 1), ops.dtype(x)), index, updates, axis=2, reduction="add")
    return ops.reshape(ops.slice(out, [0], [plane], axes=[2]), (batch, channels, *image))


@handler("DeformConv", since=19)
def deform_conv(ctx, node, x, w, offset, b=None, mask=None):
    """Convolution whose kernel taps move by learned ``offset``s: each tap is sampled
    bilinearly (zero outside the input), scaled by ``mask``, then contracted with the
    weights per group; the sampling positions depend on the data, so the taps are gathered
    with ``take_along_axis``."""
    ops = ctx.ops
    shape = ops.shape(x)
    batch, channels, spatial = shape[0], shape[1], list(shape[2:])
    dims = len(spatial)
    kernel = list(ops.shape(w)[2:])
    _check_kernel(node, kernel)
    taps, out = math.prod(kernel), list(ops.shape(offset)[2:])
    points = math.prod(out)
    strides, dilations = _geometry(node, dims)
    pads = list(node.attr("pads", None) or [0] * 2 * dims)
    group, offset_groups = node.attr("group", 1), node.attr("offset_group", 1)
    dtype = ops.dtype(x)
    offset = ops.reshape(offset, (batch, offset_groups, taps, dims, points))
    kernel_pos = np.stack(np.meshgrid(*[np.arange(k) for k in kernel], indexing="ij"), -1).reshape(-1, dims)
    out_pos = np.stack(np.meshgrid(*[np.arange(o) for o in out], indexing="ij"), -1).reshape(-1, dims)
    flat_x = ops.reshape(x, (batch, offset_groups, channels // offset_groups, -1))
    axis_taps = []
    for i in range(dims):
        base = out_pos[None, :, i] * strides[i] - pads[i] + kernel_pos[:, None, i] * dilations[i]  # (K, Q)
        c = ops.add(ops.take(offset, i, axis=3), ops.asarray(base.astype(np.float64), dtype=dtype))
        low = ops.floor(c)
        t = ops.subtract(c, low)
        axis_taps.append([(low, ops.subtract(1.0, t)), (ops.add(low, 1.0), t)])
    strides_flat = [math.prod(spatial[i + 1:]) for i in range(dims)]
    sampled = None
    for combo in _product(axis_taps):
        index, weight, valid = None, None, None
        for i, (pos, wt) in enumerate(combo):
            inside = ops.logical_and(ops.greater_equal(pos, 0.0), ops.less_equal(pos, spatial[i] - 1.0))
            valid = inside if valid is None else ops.logical_and(valid, inside)
            part = ops.multiply(ops.cast(ops.clip(pos, 0.0, spatial[i] - 1.0), "int64"), strides_flat[i])
            index = part if index is None else ops.add(index, part)
            weight = wt if weight is None else ops.multiply(weight, wt)
        weight = ops.where(valid, weight, ops.zeros((), dtype))  # (N, G_off, K, Q)
        index = ops.broadcast_to(ops.reshape(index, (batch, offset_groups, 1, taps * points)),
                                 (batch, offset_groups, channels // offset_groups, taps * points))
        value = ops.multiply(ops.take_along_axis(flat_x, index, axis=3),
                             ops.reshape(weight, (batch, offset_groups, 1, taps * points)))
        sampled = value if sampled is None else ops.add(sampled, value)
    if mask is not None:
        sampled = ops.multiply(sampled, ops.reshape(mask, (batch, offset_groups, 1, taps * points)))
    sampled = ops.reshape(sampled, (batch, group, channels // group, taps, points))
    weights = ops.reshape(w, (group, ops.shape(w)[0] // group, channels // group, taps))
    y = ops.reshape(ops.einsum("ngckq,gock->ngoq", sampled, weights), (batch, -1, *out))
    if b is not None:
        y = ops.add(y, _channel(ops, b, dims + 2))
    return ops.cast(y, dtype)


@handler("CausalConvWithState", since=27)
def causal_conv_with_state(ctx, node, x, weight, bias=None, past_state=None):
    """Depthwise causal 1-D convolution over ``past_state ++ x`` (zeros when no state);
    ``present_state`` is the last ``k - 1`` positions of that concatenation."""
    ops = ctx.ops
    batch, channels, length = ops.shape(x)
    k = ops.shape(weight)[2]
    dtype = ops.dtype(x)
    if past_state is None:
        past_state = ops.zeros((batch, channels, k - 1), dtype)
    padded = ops.concat([past_state, x], axis=2)
    y = ops.cast(ops.conv(padded, weight, bias, stride=1, padding=[(0, 0)], groups=channels), dtype)
    activation = node.attr("activation", "none")
    if activation in ("silu", "swish"):
        wide = ops.cast(y, "float32")
        y = ops.cast(ops.multiply(wide, ops.sigmoid(wide)), dtype)
    elif activation != "none":
        _unsupported(node, "activation", activation, ["none", "silu", "swish"])
    total = ops.shape(padded)[2]
    return y, ops.slice(padded, [total - (k - 1)], [total], axes=[2])


@handler("LinearAttention", since=27)
def linear_attention(ctx, node, query, key, value, past_state=None, decay=None, beta=None):
    """The recurrence run token by token in float32 (``chunk_size`` is a tuning hint that
    does not change the result): ``linear``, ``gated`` (state decays by ``exp(decay)``),
    ``delta`` and ``gated_delta`` (the value corrected by what the state retrieves)."""
    ops = ctx.ops
    rule = node.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        _unsupported(node, "update_rule", rule, ["linear", "gated", "delta", "gated_delta"])
    q_heads, kv_heads = node.attr("q_num_heads"), node.attr("kv_num_heads")
    batch, steps, _ = ops.shape(query)
    d_k = ops.shape(query)[-1] // q_heads
    d_v = ops.shape(value)[-1] // kv_heads
    groups = q_heads // kv_heads
    f32 = lambda t: ops.cast(t, "float32")  # noqa: E731
    q, k, v = (f32(_split_heads(ops, t, h)) for t, h in ((query, q_heads), (key, kv_heads), (value, kv_heads)))
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated:
        width = ops.shape(decay)[-1]
        decay = f32(ops.transpose(ops.reshape(decay, (batch, steps, kv_heads, width // kv_heads)), (0, 2, 1, 3)))
    if delta:
        width = ops.shape(beta)[-1]
        beta = f32(ops.transpose(ops.reshape(beta, (batch, steps, width, 1)), (0, 2, 1, 3)))
    state_dtype = ops.dtype(query) if past_state is None else ops.dtype(past_state)
    state = ops.zeros((batch, kv_heads, d_k, d_v), "float32") if past_state is None else f32(past_state)
    scale = node.attr("scale", 0.0) or 1.0 / math.sqrt(d_k)
    outputs = []
    for t in range(steps):
        k_t, v_t = ops.take(k, t, axis=2), ops.take(v, t, axis=2)
        if gated:
            state = ops.multiply(state, ops.expand_dims(ops.exp(ops.take(decay, t, axis=2)), -1))
        if delta:
            retrieved = ops.einsum("bhdm,bhd->bhm", state, k_t)
            v_t = ops.multiply(ops.take(beta, t, axis=2), ops.subtract(v_t, retrieved))
        state = ops.add(state, ops.multiply(ops.expand_dims(k_t, -1), ops.expand_dims(v_t, -2)))
        read = state
        if groups > 1:
            read = ops.reshape(ops.broadcast_to(ops.expand_dims(state, 2), (batch, kv_heads, groups, d_k, d_v)),
                               (batch, q_heads, d_k, d_v))
        outputs.append(ops.multiply(ops.einsum("bhd,bhdm->bhm", ops.take(q, t, axis=2), read), scale))
    y = ops.reshape(ops.stack(outputs, axis=1), (batch, steps, q_heads * d_v))  # (B, T, H, d_v) flattened
    return ops.cast(y, ops.dtype(query)), ops.cast(state, state_dtype)


@handler("SwiGLU", since=28)
def swiglu(ctx, node, a, b):
    """``Swish_alpha(A) * B``."""
    ops = ctx.ops
    return ops.multiply(ops.multiply(a, ops.sigmoid(ops.multiply(a, node.attr("alpha", 1.0)))), b)
