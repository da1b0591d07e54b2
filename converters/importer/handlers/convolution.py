"""ONNX handlers: convolution (Conv, ConvTranspose, DeformConv, CausalConvWithState) and Col2Im.

Transposed and deformable convolution, and Col2Im, become gathers, scatter-adds and ``ops.conv``
over index arrays computed in numpy from the static shapes.
"""

from __future__ import annotations

import math

import numpy as np

from xdevice._errors import UnsupportedOp, message
from xdevice.converters.importer.handlers._nn import _channel, _product, _split_heads, _unsupported
from xdevice.converters.importer.registry import handler

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
        raise UnsupportedOp(
            message(
                f"{node.op} node {node.name!r}: kernel_shape disagrees with the weights",
                expected=str(list(kernel)),
                received=str(list(declared)),
            )
        )


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
            z = ops.reshape(ops.pad(z, widths), (*current[:axis], current[axis] * s, *current[axis + 1 :]))
    # the inserted length is n * s: s - 1 trailing zeros beyond the dilated input
    widths = [(0, 0), (0, 0)] + [
        (e - 1 - pb, e - 1 - pe + o - (s - 1)) for e, (pb, pe), o, s in zip(span, pads, extra, strides)
    ]
    z = _crop_pad(ops, z, widths)
    c_in, c_out = ops.shape(w)[0], ops.shape(w)[1] * group
    kernel_t = ops.reshape(w, (group, c_in // group, c_out // group, *kernel))
    kernel_t = ops.transpose(kernel_t, (0, 2, 1, *range(3, 3 + dims)))
    kernel_t = ops.flip(ops.reshape(kernel_t, (c_out, c_in // group, *kernel)), tuple(range(2, 2 + dims)))
    return ops.conv(z, kernel_t, b, stride=1, padding=[(0, 0)] * dims, dilation=dilations, groups=group)


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
    counts = [
        (n + pads[i] + pads[i + dims] - ((k - 1) * d + 1)) // s + 1
        for i, (n, k, s, d) in enumerate(zip(image, block, strides, dilations))
    ]
    kernel_pos = np.stack(np.meshgrid(*[np.arange(k) for k in block], indexing="ij"), -1).reshape(-1, dims)
    block_pos = np.stack(np.meshgrid(*[np.arange(c) for c in counts], indexing="ij"), -1).reshape(-1, dims)
    where = block_pos[None, :, :] * strides - np.asarray(pads[:dims]) + kernel_pos[:, None, :] * dilations
    inside = np.all((where >= 0) & (where < image), axis=-1)
    plane = math.prod(image)
    flat = np.where(
        inside, np.ravel_multi_index(tuple(np.clip(where, 0, np.asarray(image) - 1).transpose(2, 0, 1)), image), plane
    ).reshape(-1)
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
    strides_flat = [math.prod(spatial[i + 1 :]) for i in range(dims)]
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
        index = ops.broadcast_to(
            ops.reshape(index, (batch, offset_groups, 1, taps * points)),
            (batch, offset_groups, channels // offset_groups, taps * points),
        )
        value = ops.multiply(
            ops.take_along_axis(flat_x, index, axis=3), ops.reshape(weight, (batch, offset_groups, 1, taps * points))
        )
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
    f32 = lambda t: ops.cast(t, "float32")
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
            read = ops.reshape(
                ops.broadcast_to(ops.expand_dims(state, 2), (batch, kv_heads, groups, d_k, d_v)),
                (batch, q_heads, d_k, d_v),
            )
        outputs.append(ops.multiply(ops.einsum("bhd,bhdm->bhm", ops.take(q, t, axis=2), read), scale))
    y = ops.reshape(ops.stack(outputs, axis=1), (batch, steps, q_heads * d_v))  # (B, T, H, d_v) flattened
    return ops.cast(y, ops.dtype(query)), ops.cast(state, state_dtype)


@handler("SwiGLU", since=28)
def swiglu(ctx, node, a, b):
    """``Swish_alpha(A) * B``."""
    ops = ctx.ops
    return ops.multiply(ops.multiply(a, ops.sigmoid(ops.multiply(a, node.attr("alpha", 1.0)))), b)
