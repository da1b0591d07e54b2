"""ONNX handlers: normalisation (batch, instance, layer, RMS, group, LRN, mean-variance, Lp) and dropout."""

from __future__ import annotations

import numpy as np

from xdevice.converters.importer.handlers._nn import _channel, _rank, _unsupported, _wide
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler

# -- normalisation ----------------------------------------------------------------------------


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
    keep = lambda stat, batch: ops.cast(
        ops.add(
            ops.multiply(_wide(ops, stat), momentum),
            ops.multiply(batch, 1.0 - momentum),
        ),
        ops.dtype(stat),
    )
    return (y, keep(mean, batch_mean), keep(var, batch_var), ops.cast(batch_mean, dtype), ops.cast(batch_var, dtype))


@handler("BatchNormalization", since=1)
def batch_norm_1(ctx, node, x, scale, bias, mean, var):
    """Versions 1 and 6: training mode needs ``is_test=0`` (the default) and the training
    outputs (mean, var...) to be requested: old exporters often leave ``is_test`` out of
    inference models, and ONNX Runtime runs those with the stored statistics too.
    ``spatial=0`` keeps one statistic per activation rather than per channel."""
    training = not node.attr("is_test", 0) and len([o for o in node.outputs if o]) > 1
    y, running_mean, running_var, batch_mean, batch_var = _batch_norm(
        ctx,
        x,
        scale,
        bias,
        mean,
        var,
        node.attr("epsilon", 1e-5),
        training,
        node.attr("momentum", 0.9),
        spatial=bool(node.attr("spatial", 1)),
    )
    return y, running_mean, running_var, batch_mean, batch_var


@handler("BatchNormalization", since=7)
def batch_norm_7(ctx, node, x, scale, bias, mean, var):
    """Versions 7 and 9: training mode is asked for by requesting more than one output."""
    training = len([o for o in node.outputs if o]) > 1
    return _batch_norm(
        ctx,
        x,
        scale,
        bias,
        mean,
        var,
        node.attr("epsilon", 1e-5),
        training,
        node.attr("momentum", 0.9),
        spatial=bool(node.attr("spatial", 1)),
    )


@handler("BatchNormalization", since=14)
def batch_norm_14(ctx, node, x, scale, bias, mean, var):
    """Version 14 on: ``training_mode=1`` normalises with the batch statistics and outputs
    the updated running mean and variance."""
    y, running_mean, running_var, _, _ = _batch_norm(
        ctx,
        x,
        scale,
        bias,
        mean,
        var,
        node.attr("epsilon", 1e-5),
        bool(node.attr("training_mode", 0)),
        node.attr("momentum", 0.9),
    )
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
    axis = node.attr("axis", -1) % rank
    if len([name for name in node.outputs if name]) == 1 and dtype == onnx_dtype(node.attr("stash_type", 1)):
        # only Y wanted, computed in its own precision: the op set's layer norm (a fused kernel
        # where the framework has one); scale and bias as ONNX broadcasts them
        return ops.layer_norm(x, scale, bias, axis, node.attr("epsilon", 1e-5))
    axes = tuple(range(axis, rank))
    wx = _stash(ops, node, x)
    mean = ops.mean(wx, axis=axes, keepdims=True)
    centred = ops.subtract(wx, mean)
    inv_std = ops.reciprocal(
        ops.sqrt(ops.add(ops.mean(ops.square(centred), axis=axes, keepdims=True), node.attr("epsilon", 1e-5)))
    )
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
        expand = lambda v: ops.reshape(ops.broadcast_to(ops.expand_dims(v, 1), (groups, reps)), (-1,))
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
