"""ONNX handlers: tensor and shape ops (reshaping, slicing, gathers and scatters, padding,
constants and generators, sorting, cumulative sums, matrix products, block rearrangements).

Shape-like inputs (a reshape's shape, a slice's bounds, pads, repeats, ``k``...) are listed
in ``static=`` so they arrive as numpy arrays and the ops work under ``jax.jit`` and
``tf.function``. Ops whose output shape depends on the data (NonZero, Unique) read it
eagerly through ``ctx.static`` and return static numpy results; Compress only needs its
condition to be static. Where an op only gained an attribute whose default keeps the old
meaning, one handler reads the attribute and covers every version.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.backends.opset import numpy_dtype
from xdevice.converters.importer.interpreter import is_symbolic, onnx_dtype, symbolic_array
from xdevice.converters.importer.registry import handler


def _ints(value) -> list[Any]:
    """The integers of a static value; symbolic sizes (a traced shape's) pass as they are."""
    return [v if is_symbolic(v) else int(v) for v in np.asarray(value).reshape(-1)]


def _known(dims) -> bool:
    return all(isinstance(d, (int, np.integer)) for d in dims)


def _one(d) -> bool:
    """``d == 1`` without asking a symbolic size (which a tracer would have to guess)."""
    return not is_symbolic(d) and d == 1


def _axes(axes, rank: int) -> list[int]:
    return [int(a) % rank if rank else int(a) for a in axes]


def _invalid(node, what: str, **parts) -> ConversionError:
    return ConversionError(message(f"{node.op} node {node.name!r}: {what}", **parts))


def _keep_dtype(ctx, y, dtype: str):
    """``y`` in ``dtype``: numpy widens int32 sums and Python-float scalings, ONNX does not."""
    return y if ctx.ops.dtype(y) == dtype else ctx.ops.cast(y, dtype)


# -- shapes ------------------------------------------------------------------------------------


@handler("Shape", since=1)
def shape(ctx, node, x):
    """Shape-15's ``start``/``end`` slice the shape as Python does (defaults: all of it)."""
    dims = tuple(ctx.ops.shape(x))[node.attr("start", 0) : node.attr("end", None)]
    if _known(dims):  # static, so whatever consumes it still builds under tracing
        return np.asarray(dims, dtype=np.int64).reshape(len(dims))
    if all(is_symbolic(d) or isinstance(d, (int, np.integer)) for d in dims):
        # a traced shape with symbolic sizes (torch.export's SymInts, jax.export's dims): still
        # static, as Python objects, so shape arithmetic stays symbolic instead of freezing
        return symbolic_array(dims)
    ops = ctx.ops
    return ops.stack([ops.asarray(d, "int64") for d in dims])


@handler("Size", since=1)
def size(ctx, node, x):
    return np.asarray(math.prod(ctx.ops.shape(x)), dtype=np.int64)


def _reshape(ctx, x, target, allowzero: int = 0):
    # 0 copies the input's dimension unless ``allowzero`` (Reshape-14) makes it a real 0
    dims = ctx.ops.shape(x)
    target = [dims[i] if not is_symbolic(v) and v == 0 and not allowzero else v for i, v in enumerate(_ints(target))]
    return ctx.ops.reshape(x, target)


@handler("Reshape", since=1)
def reshape_1(ctx, node, x):
    return _reshape(ctx, x, node.attr("shape"))


@handler("Reshape", since=5, static=(1,))
def reshape_5(ctx, node, x, target):
    return _reshape(ctx, x, target, node.attr("allowzero", 0))


@handler("Flatten", since=1)
def flatten(ctx, node, x):
    dims = ctx.ops.shape(x)
    axis = node.attr("axis", 1)
    axis = axis + len(dims) if axis < 0 else axis
    return ctx.ops.reshape(x, (math.prod(dims[:axis]), math.prod(dims[axis:])))


def _squeeze(ctx, x, axes):
    dims = ctx.ops.shape(x)
    axes = [i for i, d in enumerate(dims) if d == 1] if axes is None else _axes(_ints(axes), len(dims))
    return ctx.ops.squeeze(x, axis=tuple(axes)) if axes else x


@handler("Squeeze", since=1)
def squeeze_1(ctx, node, x):
    return _squeeze(ctx, x, node.attr("axes"))


@handler("Squeeze", since=13, static=(1,))
def squeeze_13(ctx, node, x, axes=None):
    return _squeeze(ctx, x, axes)


def _unsqueeze(ctx, x, axes):
    rank = len(ctx.ops.shape(x)) + len(_ints(axes))
    for axis in sorted(_axes(_ints(axes), rank)):  # ascending: each lands at its final place
        x = ctx.ops.expand_dims(x, axis)
    return x


@handler("Unsqueeze", since=1)
def unsqueeze_1(ctx, node, x):
    return _unsqueeze(ctx, x, node.attr("axes"))


@handler("Unsqueeze", since=13, static=(1,))
def unsqueeze_13(ctx, node, x, axes):
    return _unsqueeze(ctx, x, axes)


@handler("Transpose", since=1)
def transpose(ctx, node, x):
    return ctx.ops.transpose(x, node.attr("perm"))  # no perm: reverse the axes


@handler("Concat", since=1)
def concat(ctx, node, *xs):
    return ctx.ops.concat(list(xs), axis=node.attr("axis", 1))  # Concat-1 defaulted to axis 1


@handler("Split", since=1, static=(1,))
def split(ctx, node, x, sizes=None):
    """Sizes come from the ``split`` input (Split-1, from 13) or attribute (2-11); without
    them, ``num_outputs`` (18) or the number of outputs parts of ``ceil(dim / n)``, the
    last one smaller."""
    axis = node.attr("axis", 0)
    sizes = _ints(sizes) if sizes is not None else node.attr("split")
    if sizes is None:
        count = node.attr("num_outputs", len(node.outputs))
        dim = ctx.ops.shape(x)[axis]
        chunk = -(-dim // count)
        sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
    return tuple(ctx.ops.split(x, list(sizes), axis=axis))


@handler("Expand", since=8, static=(1,))
def expand(ctx, node, x, target):
    # two-way broadcasting: a 1 in ``target`` keeps the input's dimension
    dims, target = list(ctx.ops.shape(x)), _ints(target)
    rank = max(len(dims), len(target))
    dims, target = [1] * (rank - len(dims)) + dims, [1] * (rank - len(target)) + target
    return ctx.ops.broadcast_to(x, [d if _one(t) else t for d, t in zip(dims, target)])


@handler("Tile", since=1, static=(1, 2))
def tile_1(ctx, node, x, tiles, axis):
    reps = [1] * len(ctx.ops.shape(x))
    reps[int(axis)] = int(tiles)
    return ctx.ops.tile(x, reps)


@handler("Tile", since=6, static=(1,))
def tile_6(ctx, node, x, repeats):
    return ctx.ops.tile(x, _ints(repeats))


# -- slicing and indexing ----------------------------------------------------------------------


def _slice(ctx, node, x, starts, ends, axes=None, steps=None):
    """ONNX bounds, clamped as the spec says, as Python slice bounds every backend reads."""
    dims = ctx.ops.shape(x)
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else _axes(_ints(axes), len(dims))
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if 0 in steps:
        raise _invalid(node, "a slice step is 0", expected="non-zero steps", received=steps)
    lows, highs = [], []
    for axis, start, end, step in zip(axes, starts, ends, steps):
        dim = dims[axis]
        if isinstance(dim, (int, np.integer)) and not (is_symbolic(start) or is_symbolic(end)):
            # slice.indices clamps exactly as ONNX does; a backward end of -1 ("before index
            # 0") becomes -dim-1, which means the same to Python and fits int64
            start, end, _ = slice(start, end, step).indices(int(dim))
            end = -int(dim) - 1 if end < 0 else end
        lows.append(start)
        highs.append(end)
    return ctx.ops.slice(x, lows, highs, axes, steps)


@handler("Slice", since=1)
def slice_1(ctx, node, x):
    return _slice(ctx, node, x, node.attr("starts"), node.attr("ends"), node.attr("axes"))


@handler("Slice", since=10, static=(1, 2, 3, 4))
def slice_10(ctx, node, x, starts, ends, axes=None, steps=None):
    return _slice(ctx, node, x, starts, ends, axes, steps)


@handler("Gather", since=1)
def gather(ctx, node, x, indices):
    """Negative indices count from the end. Indices known when the graph is built (a constant,
    an initializer) are put in range here, once, in numpy: a single one becomes a plain index
    (a view where the framework has them), not a gather that checks its sign in every call."""
    axis = node.attr("axis", 0)
    known = ctx.given[1] if len(ctx.given) > 1 else None
    size = ctx.ops.shape(x)[axis]
    if isinstance(known, np.ndarray) and known.dtype.kind in "iu" and isinstance(size, (int, np.integer)):
        known = np.where(known < 0, known + size, known).astype(np.int64)
        return ctx.ops.take(x, int(known) if known.ndim == 0 else ctx.array(known), axis=axis)
    return ctx.ops.take(x, indices, axis=axis)


@handler("GatherElements", since=11)
def gather_elements(ctx, node, x, indices):
    return ctx.ops.take_along_axis(x, indices, axis=node.attr("axis", 0))


def _flat_index(ctx, indices, dims):
    """Row-major flat positions, over ``dims``, of the index tuples on ``indices``' last axis
    (negative entries count from the end)."""
    ops = ctx.ops
    index = ops.cast(indices, "int64")
    index = ops.where(ops.less(index, 0), ops.add(index, _int_tensor(ctx, dims)), index)
    strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
    return ops.sum(ops.multiply(index, _int_tensor(ctx, strides)), axis=-1)


def _int_tensor(ctx, values) -> Any:
    """Sizes (symbolic ones too) as the backend's int64 vector."""
    if any(is_symbolic(v) for v in values):
        return ctx.array(symbolic_array(values))
    return ctx.ops.asarray(np.asarray(values, np.int64))


@handler("GatherND", since=11)
def gather_nd(ctx, node, x, indices):
    """GatherND (``batch_dims`` from 12) as one ``take`` from the data with its batch and
    indexed axes merged into one."""
    ops = ctx.ops
    dims, index_dims = ops.shape(x), ops.shape(indices)
    batch, depth = node.attr("batch_dims", 0), index_dims[-1]
    flat = _flat_index(ctx, indices, dims[batch : batch + depth])
    if batch:
        count = math.prod(dims[:batch])
        offsets = np.arange(count, dtype=np.int64) * math.prod(dims[batch : batch + depth])
        flat = ops.add(flat, ops.asarray(offsets.reshape(*dims[:batch], *[1] * (len(index_dims) - 1 - batch))))
    table = ops.reshape(x, (math.prod(dims[: batch + depth]), *dims[batch + depth :]))
    return ops.take(table, flat, axis=0)


def _check_reduction(node, reduction: str, allowed) -> str:
    if reduction not in allowed:
        raise UnsupportedOp(
            message(f"{node.op} node {node.name!r}: unsupported reduction", received=reduction, choices=list(allowed))
        )
    return reduction


_REDUCTIONS = ("none", "add", "mul", "max", "min")


@handler("Scatter", since=9)
def scatter(ctx, node, x, indices, updates):
    """The deprecated Scatter is ScatterElements without reductions."""
    return ctx.ops.scatter(x, indices, updates, axis=node.attr("axis", 0))


@handler("ScatterElements", since=11)
def scatter_elements(ctx, node, x, indices, updates):
    reduction = _check_reduction(node, node.attr("reduction", "none"), _REDUCTIONS)  # add/mul 16, max/min 18
    return ctx.ops.scatter(x, indices, updates, axis=node.attr("axis", 0), reduction=reduction)


@handler("ScatterND", since=11)
def scatter_nd(ctx, node, x, indices, updates):
    """ScatterND as ScatterElements on the data seen as (indexed positions, the rest)."""
    ops = ctx.ops
    reduction = _check_reduction(node, node.attr("reduction", "none"), _REDUCTIONS)
    dims, depth = ops.shape(x), ops.shape(indices)[-1]
    rest = math.prod(dims[depth:])
    flat = ops.reshape(_flat_index(ctx, indices, dims[:depth]), (-1, 1))
    count = ops.shape(flat)[0]
    table = ops.reshape(x, (math.prod(dims[:depth]), rest))
    out = ops.scatter(
        table, ops.broadcast_to(flat, (count, rest)), ops.reshape(updates, (count, rest)), axis=0, reduction=reduction
    )
    return ops.reshape(out, dims)


@handler("Compress", since=9, static=(1,))
def compress(ctx, node, x, condition):
    """Only the condition must be known: it decides the output's shape (a condition shorter
    than the axis keeps only the positions it covers, as numpy.compress)."""
    picked = ctx.ops.asarray(np.flatnonzero(np.asarray(condition, dtype=bool)).astype(np.int64))
    axis = node.attr("axis")
    if axis is None:
        return ctx.ops.take(ctx.ops.reshape(x, (-1,)), picked, axis=0)
    return ctx.ops.take(x, picked, axis=axis)


@handler("NonZero", since=9, static=(0,))
def nonzero(ctx, node, x):
    x = np.asarray(x)
    if x.ndim == 0:  # numpy refuses 0-d input; ONNX gives a (0, count) array
        return np.zeros((0, int(bool(x))), dtype=np.int64)
    return np.asarray(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)


@handler("Unique", since=11, static=(0,))
def unique(ctx, node, x):
    """numpy.unique; with ``sorted=0`` the unique values come in order of first occurrence."""
    x, axis = np.asarray(x), node.attr("axis")
    values, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True, axis=axis)
    inverse = inverse.reshape(-1)
    if not node.attr("sorted", 1):
        order = np.argsort(first, kind="stable")
        values = np.take(values, order, axis=0 if axis is None else axis)
        first, counts = first[order], counts[order]
        inverse = np.argsort(order)[inverse]
    return tuple([values] + [np.asarray(a, dtype=np.int64) for a in (first, inverse, counts)])


@handler("ReverseSequence", since=10)
def reverse_sequence(ctx, node, x, lengths):
    """Reverse the first ``lengths[b]`` steps of every batch entry: one gather along time
    whose source positions are computed from the (possibly traced) lengths."""
    ops = ctx.ops
    dims = ops.shape(x)
    time_axis, batch_axis = node.attr("time_axis", 0), node.attr("batch_axis", 1)
    along = lambda axis, size: [size if i == axis else 1 for i in range(len(dims))]
    steps = ops.asarray(np.arange(dims[time_axis], dtype=np.int64).reshape(along(time_axis, dims[time_axis])))
    lengths = ops.reshape(ops.cast(lengths, "int64"), along(batch_axis, dims[batch_axis]))
    source = ops.where(ops.less(steps, lengths), ops.subtract(ops.subtract(lengths, 1), steps), steps)
    return ops.take_along_axis(x, ops.broadcast_to(source, dims), axis=time_axis)


# -- padding -----------------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad(ctx, node, x, pads, mode: str, value, axes=None):
    """ONNX pads ``[begin..., end...]`` over ``axes``; negative pads crop."""
    ops = ctx.ops
    if mode not in _PAD_MODES:
        raise UnsupportedOp(
            message(f"Pad node {node.name!r}: unsupported mode", received=mode, choices=list(_PAD_MODES))
        )
    dims = ops.shape(x)
    rank, pads = len(dims), _ints(pads)
    axes = list(range(rank)) if axes is None else _axes(_ints(axes), rank)
    if len(pads) != 2 * len(axes):
        raise _invalid(
            node, "wrong number of pads", expected=f"{2 * len(axes)} (begin and end per axis)", received=len(pads)
        )
    widths = [(0, 0) for _ in range(rank)]
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + len(axes)])
    if any(b < 0 or e < 0 for b, e in widths):
        x = ops.slice(
            x,
            [max(-b, 0) for b, _ in widths],
            [dims[a] - max(-e, 0) for a, (_, e) in enumerate(widths)],
            list(range(rank)),
        )
        dims = ops.shape(x)
    widths = [(max(b, 0), max(e, 0)) for b, e in widths]
    if not any(b or e for b, e in widths):
        return x
    if mode == "constant" and value is not None and not isinstance(value, (int, float)):
        # a value tensor may be traced (float initializers are parameters): pad with 0,
        # then put the value where the (static) padding mask is set
        mask = np.pad(np.zeros([int(d) for d in dims], dtype=bool), widths, constant_values=True)
        return ops.where(ops.asarray(mask), ops.reshape(value, ()), ops.pad(x, widths))
    if mode != "wrap":
        return ops.pad(x, widths, mode=mode, value=0 if value is None else value)
    for axis, (before, after) in enumerate(widths):  # a torus: gather source positions mod size
        if before or after:
            source = np.arange(-before, dims[axis] + after, dtype=np.int64) % dims[axis]
            x = ops.take(x, ops.asarray(source), axis=axis)
    return x


@handler("Pad", since=1)
def pad_1(ctx, node, x):
    pads = node.attr("pads", node.attr("paddings"))  # "paddings" in Pad-1, "pads" from 2
    return _pad(ctx, node, x, pads, node.attr("mode", "constant"), node.attr("value", 0.0))


@handler("Pad", since=11, static=(1, 3))
def pad_11(ctx, node, x, pads, value=None, axes=None):
    """Pads and the constant as inputs (11), ``axes`` (18), mode ``wrap`` (19)."""
    return _pad(ctx, node, x, pads, node.attr("mode", "constant"), value, axes)


@handler("CenterCropPad", since=18, static=(1,))
def center_crop_pad(ctx, node, x, target):
    """Crop or zero-pad each listed axis around its centre; an odd difference puts the
    extra element at the end."""
    dims = ctx.ops.shape(x)
    axes = node.attr("axes")
    axes = list(range(len(dims))) if axes is None else _axes(axes, len(dims))
    begins, ends = [0] * len(dims), [0] * len(dims)
    for axis, size in zip(axes, _ints(target)):
        grow = size - dims[axis]  # negative: crop
        sign, first = (1 if grow > 0 else -1), abs(grow) // 2
        begins[axis], ends[axis] = sign * first, sign * (abs(grow) - first)
    return _pad(ctx, node, x, begins + ends, "constant", 0)


# -- constants and generators ------------------------------------------------------------------


@handler("Constant", since=1)
def constant(ctx, node):
    """Every ``value*`` attribute: a tensor, a sparse tensor (11) or a number, numbers or
    strings (12)."""
    attrs = node.attrs
    if "value" in attrs:
        return np.asarray(attrs["value"])
    if "sparse_value" in attrs:
        return _dense(attrs["sparse_value"])
    kinds = {
        "value_float": np.float32,
        "value_floats": np.float32,
        "value_int": np.int64,
        "value_ints": np.int64,
        "value_string": object,
        "value_strings": object,
    }
    for name, dtype in kinds.items():
        if name in attrs:
            return np.asarray(attrs[name], dtype=dtype)
    raise _invalid(
        node, "no value attribute", expected="one of value, sparse_value, " + ", ".join(kinds), received=sorted(attrs)
    )


def _dense(sparse) -> np.ndarray:
    from onnx import numpy_helper

    values, indices = numpy_helper.to_array(sparse.values), numpy_helper.to_array(sparse.indices)
    out = np.zeros(tuple(sparse.dims), dtype=values.dtype)
    if indices.ndim == 1:  # linear positions
        out.reshape(-1)[indices] = values
    else:  # one (d0, d1, ...) row per value
        out[tuple(indices.T)] = values
    return out


@handler("ConstantOfShape", since=9, static=(0,))
def constant_of_shape(ctx, node, target):
    value = np.asarray(node.attr("value", np.zeros(1, dtype=np.float32))).reshape(-1)
    shape = tuple(_ints(target))
    if any(is_symbolic(d) for d in shape):
        return ctx.ops.full(shape, value[0].item(), dtype=value.dtype.name)
    return np.full(shape, value[0], dtype=value.dtype)


def _range(start, limit, delta, stash: int | None):
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    dtype = start.dtype
    if stash is not None and dtype.name in ("float16", "bfloat16"):  # Range-27: count in float32/64
        wide = numpy_dtype(onnx_dtype(stash))
        return np.arange(start.astype(wide), float(limit), float(delta), dtype=wide).astype(dtype)
    return np.arange(start.item(), limit.item(), delta.item()).astype(dtype)


@handler("Range", since=11, static=(0, 1, 2))
def range_11(ctx, node, start, limit, delta):
    bounds = [np.asarray(v).reshape(()).item() for v in (start, limit, delta)]
    if any(is_symbolic(b) for b in bounds):  # up to a traced length: the framework's own arange
        return ctx.ops.arange(
            *bounds, dtype=np.asarray(start).dtype.name if np.asarray(start).dtype != object else "int64"
        )
    return _range(start, limit, delta, None)


@handler("Range", since=27, static=(0, 1, 2))
def range_27(ctx, node, start, limit, delta):
    return _range(start, limit, delta, node.attr("stash_type", 1))


@handler("OneHot", since=9, static=(1,))
def one_hot(ctx, node, indices, depth, values):
    """``values = [off, on]``; indices in ``[-depth, depth)`` (negatives count from the end,
    from OneHot-11), any other index gives a row of ``off``."""
    ops = ctx.ops
    depth = int(np.asarray(depth).reshape(-1)[0])
    rank = len(ops.shape(indices)) + 1
    axis = node.attr("axis", -1) % rank
    index = ops.cast(indices, "int64")
    index = ops.expand_dims(ops.where(ops.less(index, 0), ops.add(index, depth), index), axis)
    classes = np.arange(depth, dtype=np.int64).reshape([depth if i == axis else 1 for i in range(rank)])
    return ops.where(ops.equal(index, ops.asarray(classes)), ops.take(values, 1), ops.take(values, 0))


@handler("EyeLike", since=9)
def eye_like(ctx, node, x):
    rows, cols = ctx.ops.shape(x)
    dtype = onnx_dtype(node.attr("dtype")) if node.attr("dtype") is not None else ctx.ops.dtype(x)
    return np.eye(rows, cols, k=node.attr("k", 0)).astype(numpy_dtype(dtype))


@handler("Trilu", since=14, static=(1,))
def trilu(ctx, node, x, k=None):
    """Keep the upper (``upper=1``) or lower triangle from diagonal ``k`` of the last two axes."""
    ops = ctx.ops
    rows, cols = ops.shape(x)[-2:]
    k = 0 if k is None else int(np.asarray(k).reshape(-1)[0])
    offset = np.arange(cols)[None, :] - np.arange(rows)[:, None]
    keep = offset >= k if node.attr("upper", 1) else offset <= k
    return ops.where(ops.asarray(keep), x, ops.zeros((), ops.dtype(x)))


# -- sorting and arg-reductions ----------------------------------------------------------------


def _arg(ctx, node, x, method: str):
    """ArgMax/ArgMin; ``select_last_index`` (12) searches the reversed axis."""
    ops = ctx.ops
    axis = node.attr("axis", 0) % len(ops.shape(x))
    keepdims = bool(node.attr("keepdims", 1))
    if not node.attr("select_last_index", 0):
        return ops.cast(getattr(ops, method)(x, axis=axis, keepdims=keepdims), "int64")
    found = ops.cast(getattr(ops, method)(ops.flip(x, (axis,)), axis=axis, keepdims=keepdims), "int64")
    return ops.subtract(ops.shape(x)[axis] - 1, found)


@handler("ArgMax", since=1)
def arg_max(ctx, node, x):
    return _arg(ctx, node, x, "argmax")


@handler("ArgMin", since=1)
def arg_min(ctx, node, x):
    return _arg(ctx, node, x, "argmin")


def _top_k(ctx, node, x, k: int, largest: int):
    """A stable sort keeps equal values in index order, ONNX's tie-break; results come
    sorted, which ``sorted=0`` (order unspecified) also allows."""
    ops = ctx.ops
    axis = node.attr("axis", -1) % len(ops.shape(x))
    values, order = ops.sort(x, axis=axis, descending=bool(largest))
    return ops.slice(values, [0], [k], [axis]), ops.cast(ops.slice(order, [0], [k], [axis]), "int64")


@handler("TopK", since=1)
def top_k_1(ctx, node, x):
    return _top_k(ctx, node, x, node.attr("k"), 1)


@handler("TopK", since=10, static=(1,))
def top_k_10(ctx, node, x, k):
    return _top_k(ctx, node, x, int(np.asarray(k).reshape(-1)[0]), node.attr("largest", 1))  # largest: 11


def _cumulative(ctx, node, x, axis, method: str, identity: int):
    """CumSum/CumProd; ``exclusive`` shifts the input by one (the identity first), so no
    value is subtracted or divided out; ``reverse`` runs from the end."""
    ops = ctx.ops
    dims, dtype = ops.shape(x), ops.dtype(x)
    axis = int(np.asarray(axis).reshape(-1)[0]) % len(dims)
    reverse = node.attr("reverse", 0)
    if dims[axis] == 0:
        return x
    if reverse:
        x = ops.flip(x, (axis,))
    if node.attr("exclusive", 0):
        widths = [(1, 0) if i == axis else (0, 0) for i in range(len(dims))]
        x = ops.pad(ops.slice(x, [0], [dims[axis] - 1], [axis]), widths, mode="constant", value=identity)
    y = getattr(ops, method)(x, axis)
    return _keep_dtype(ctx, ops.flip(y, (axis,)) if reverse else y, dtype)


@handler("CumSum", since=11, static=(1,))
def cum_sum(ctx, node, x, axis):
    return _cumulative(ctx, node, x, axis, "cumsum", 0)


@handler("CumProd", since=26, static=(1,))
def cum_prod(ctx, node, x, axis):
    return _cumulative(ctx, node, x, axis, "cumprod", 1)


# -- matrix products ---------------------------------------------------------------------------


@handler("MatMul", since=1)
def matmul(ctx, node, a, b):
    return ctx.ops.matmul(a, b)


@handler("Gemm", since=1)
def gemm(ctx, node, a, b, c=None):
    """``alpha * A' @ B' + beta * C``, C broadcast (Gemm-1/6's ``broadcast`` flag only
    allowed what broadcasting does anyway; C optional from 11)."""
    ops = ctx.ops
    dtype = ops.dtype(a)
    a = ops.transpose(a) if node.attr("transA", 0) else a
    b = ops.transpose(b) if node.attr("transB", 0) else b
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    y = ops.matmul(a, b)
    if alpha != 1.0:  # skipped at 1 so integer products stay exact
        y = ops.multiply(y, alpha)
    if c is not None and beta != 0.0:
        y = ops.add(y, c if beta == 1.0 else ops.multiply(c, beta))
    return _keep_dtype(ctx, y, dtype)


@handler("Einsum", since=12)
def einsum(ctx, node, *operands):
    """The implicit form (no ``->``) outputs the letters used once, in ASCII order, after
    any ellipsis dimensions; spaces are allowed. Half precision accumulates in float32."""
    equation = node.attr("equation").replace(" ", "")
    if "->" not in equation:
        letters = equation.replace("...", "").replace(",", "")
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        equation += "->" + ("..." if "..." in equation else "") + "".join(once)
    ops = ctx.ops
    half = ops.dtype(operands[0])
    if half not in ("float16", "bfloat16"):
        return ops.einsum(equation, *operands)
    # as ONNX's reference: accumulate half precision in float32 and round once (numpy
    # cannot contract bfloat16 at all)
    return ops.cast(ops.einsum(equation, *[ops.cast(o, "float32") for o in operands]), half)


@handler("Det", since=11)
def det(ctx, node, x):
    return ctx.ops.det(x)


# -- depth and space blocks --------------------------------------------------------------------


def _block_mode(node) -> str:
    mode = node.attr("mode", "DCR")
    if mode not in ("DCR", "CRD"):
        raise UnsupportedOp(
            message(f"{node.op} node {node.name!r}: unsupported mode", received=mode, choices=["DCR", "CRD"])
        )
    return mode


@handler("DepthToSpace", since=1)
def depth_to_space(ctx, node, x):
    """DCR (depth, column, row: the default) or CRD (``mode`` from 11), as the spec's
    reshape-transpose-reshape."""
    ops, size = ctx.ops, node.attr("blocksize")
    n, c, h, w = ops.shape(x)
    if _block_mode(node) == "DCR":
        y = ops.transpose(ops.reshape(x, (n, size, size, c // size**2, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = ops.transpose(ops.reshape(x, (n, c // size**2, size, size, h, w)), (0, 1, 4, 2, 5, 3))
    return ops.reshape(y, (n, c // size**2, h * size, w * size))


@handler("SpaceToDepth", since=1)
def space_to_depth(ctx, node, x):
    """The inverse of DepthToSpace; ``mode`` (CRD) from 28."""
    ops, size = ctx.ops, node.attr("blocksize")
    n, c, h, w = ops.shape(x)
    y = ops.reshape(x, (n, c, h // size, size, w // size, size))
    y = ops.transpose(y, (0, 3, 5, 1, 2, 4) if _block_mode(node) == "DCR" else (0, 1, 3, 5, 2, 4))
    return ops.reshape(y, (n, c * size * size, h // size, w // size))
