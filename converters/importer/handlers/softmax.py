"""ONNX handlers: the softmax family (Softmax, LogSoftmax, Hardmax) and the losses over it
(NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss).
"""

from __future__ import annotations

import math

import numpy as np

from xdevice.converters.importer.handlers._nn import _HALF, _rank, _unsupported
from xdevice.converters.importer.registry import handler

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


_SOFTMAX = {"Softmax": _softmax, "LogSoftmax": lambda ops, x, axis: ops.log_softmax(x, axis=axis), "Hardmax": _hardmax}


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
        weights = (
            ops.where(keep, weights if weights is not None else 1.0, 0.0)
            if weights is not None
            else ops.cast(keep, ops.dtype(loss))
        )
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
