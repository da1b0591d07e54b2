"""ONNX handlers: attention (Attention 23-25, with masks, caches and soft-capping) and
RotaryEmbedding.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import UnsupportedOp, message
from xdevice.converters.importer.handlers._nn import (
    _bias_where,
    _isneginf,
    _rank,
    _split_heads,
    _static_bias,
    _unsupported,
)
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler

# -- attention --------------------------------------------------------------------------------


def _masked_softmax(ops, x):
    """Softmax over the last axis where a row of only -inf gives zeros, not NaN."""
    top = ops.max(x, axis=-1, keepdims=True)
    top = ops.where(_isneginf(ops, top), ops.zeros((), ops.dtype(top)), top)
    e = ops.exp(ops.subtract(x, top))
    total = ops.sum(e, axis=-1, keepdims=True)
    return ops.divide(e, ops.where(ops.equal(total, 0), ops.ones((), ops.dtype(total)), total))


def _attention(
    ctx, node, q, k, v, mask=None, past_key=None, past_value=None, nonpad=None, left: int = -1, right: int = -1
):
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
            raise UnsupportedOp(
                message(
                    f"Attention node {node.name!r} has 3-D inputs but no head counts",
                    expected="q_num_heads and kv_num_heads attributes",
                )
            )
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
            for ok in (
                ([ops.greater_equal(diff, 0)] if causal else [])
                + ([ops.less_equal(diff, left)] if left >= 0 else [])
                + ([ops.less_equal(ops.negative(diff), right)] if right >= 0 else [])
            ):
                allowed = ok if allowed is None else ops.logical_and(allowed, ok)
            add(_bias_where(ops, allowed, dtype))
    if nonpad is not None:
        lengths = ops.reshape(ops.cast(nonpad, "int64"), (-1, 1, 1, 1))
        add(_bias_where(ops, ops.less(ops.asarray(cols.reshape(1, 1, 1, kv_len), dtype="int64"), lengths), dtype))

    kv_heads = ops.shape(k)[1]
    if kv_heads != q_heads:  # grouped-query attention: each KV head serves q_heads // kv_heads
        reps = q_heads // kv_heads
        repeat = lambda t: ops.reshape(
            ops.broadcast_to(ops.expand_dims(t, 2), (batch, kv_heads, reps, *ops.shape(t)[2:])),
            (batch, q_heads, *ops.shape(t)[2:]),
        )
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
    return _attention(
        ctx,
        node,
        q,
        k,
        v,
        attn_mask,
        past_key,
        past_value,
        nonpad_kv_seqlen,
        node.attr("left_window_size", -1),
        node.attr("right_window_size", -1),
    )


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
            raise UnsupportedOp(
                message(
                    f"RotaryEmbedding node {node.name!r} has a 3-D input but no num_heads",
                    expected="the num_heads attribute",
                )
            )
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
