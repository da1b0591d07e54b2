"""The ``ai.onnx.ml`` domain's ops that ONNX's node suite tests (LabelEncoder, TreeEnsemble,
Binarizer, ArrayFeatureExtractor), and TfIdfVectorizer.

Their tables (label maps, tree nodes, n-gram pools) are attributes, so they are laid out
once with numpy and the data is only compared and gathered against them with the op set:
a tree is walked by gathers repeated to its greatest depth, and an n-gram is counted by
comparing every window of the input with the pool, so both trace under ``jax.jit`` and
``tf.function``. String tensors exist only as numpy arrays (see ``handlers/sequence.py``):
a string LabelEncoder or TfIdfVectorizer runs on a string input on every backend (it folds
with numpy), but only the numpy backend can hold a string output computed from its arrays.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.converters.importer.registry import handler

_ML = "ai.onnx.ml"


def _is_strings(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype.kind in "OSU"


@handler("ArrayFeatureExtractor", since=1, domain=_ML)
def array_feature_extractor(ctx, node, x, indices):
    """``x[..., indices]`` with the indices flattened; a 1-D ``x`` gives one row ``[1, n]``
    (as ONNX Runtime and ONNX's reference do)."""
    ops = ctx.ops
    picked = ops.take(x, ops.reshape(indices, (-1,)), axis=-1)
    return ops.reshape(picked, (1, -1)) if len(ops.shape(x)) == 1 else picked


@handler("Binarizer", since=1, domain=_ML)
def binarizer(ctx, node, x):
    ops = ctx.ops
    return ops.cast(ops.greater(x, node.attr("threshold", 0.0)), ops.dtype(x))


# -- LabelEncoder ---------------------------------------------------------------------------

#: the default of each kind of values when the node names none (the schema's defaults)
_LABEL_DEFAULTS = {"int64s": -1, "floats": -0.0, "strings": "_Unused"}


def _label_table(node) -> tuple[np.ndarray, np.ndarray, Any]:
    """The keys, the values (a repeated key keeps its last value) and the default, as numpy."""
    keys = _one_of(node, "keys")
    values = _one_of(node, "values")
    kind = next(k for k in ("tensor", "int64s", "floats", "strings") if node.attr(f"values_{k}") is not None)
    if kind == "tensor":
        dtype = values.dtype
        fallback = node.attr("default_tensor")
        if fallback is None:
            kind_of_values = "strings" if dtype.kind in "OSU" else "floats" if dtype.kind == "f" else "int64s"
            fallback = _LABEL_DEFAULTS[kind_of_values]
        default = np.asarray(fallback).reshape(-1)[0]
    else:
        dtype = np.dtype({"int64s": "int64", "floats": "float32", "strings": "object"}[kind])
        default = node.attr(f"default_{kind[:-1]}", _LABEL_DEFAULTS[kind])
    if len(keys) != len(values):
        raise ConversionError(
            message(
                f"LabelEncoder node {node.name!r} has keys and values of different lengths",
                expected="one value per key",
                received=f"{len(keys)} keys, {len(values)} values",
            )
        )
    last = {}  # the last of a repeated key wins; NaN keys are one key
    for i, key in enumerate(keys.tolist()):
        last["nan" if isinstance(key, float) and math.isnan(key) else key] = i
    order = sorted(last.values())
    return keys[order], np.asarray(values, dtype=dtype)[order], np.asarray(default, dtype=dtype)


def _one_of(node, prefix: str) -> np.ndarray:
    found = [
        (name, np.asarray(node.attr(f"{prefix}_{name}"), dtype=object if name == "strings" else None))
        for name in ("tensor", "int64s", "floats", "strings")
        if node.attr(f"{prefix}_{name}") is not None
    ]
    if len(found) != 1:
        raise ConversionError(
            message(
                f"LabelEncoder node {node.name!r} must set exactly one {prefix}_* attribute",
                received=[name for name, _ in found] or "none",
                choices=[f"{prefix}_tensor", f"{prefix}_int64s", f"{prefix}_floats", f"{prefix}_strings"],
            )
        )
    return found[0][1].reshape(-1)


@handler("LabelEncoder", since=2, domain=_ML)
def label_encoder(ctx, node, x):
    """Each element of ``x`` mapped through the keys to the values, or to the default.

    Strings work wherever they are numpy arrays (any input string tensor); numbers are
    compared with all keys at once on the backend (``K`` comparisons per element)."""
    keys, values, default = _label_table(node)
    if _is_strings(x) or (isinstance(x, np.ndarray) and object in (values.dtype, keys.dtype)):
        table = {("nan" if isinstance(k, float) and math.isnan(k) else k): v for k, v in zip(keys.tolist(), values)}
        flat = [
            table.get("nan" if isinstance(k, float) and math.isnan(k) else k, default) for k in x.reshape(-1).tolist()
        ]
        return np.asarray(flat, dtype=values.dtype).reshape(x.shape)
    if values.dtype == object or keys.dtype == object:
        raise UnsupportedOp(
            message(
                f"The {ctx.backend.name} backend has no string tensors",
                received=f"LabelEncoder node {node.name!r} maps a {ctx.ops.dtype(x)} input to or from strings",
                fix="run string ops with the numpy backend",
            )
        )
    ops = ctx.ops
    out = ops.full(ops.shape(x), default.item(), str(values.dtype))
    if not len(keys):
        return out
    matches = ops.cast(ops.equal(ops.expand_dims(x, -1), ops.asarray(keys, ops.dtype(x))), "int32")
    position = ops.argmax(matches, axis=-1)
    mapped = ops.take(ops.asarray(values), position, axis=0)
    out = ops.where(ops.greater(ops.max(matches, axis=-1), 0), mapped, out)
    nan_keys = [i for i, k in enumerate(keys.tolist()) if isinstance(k, float) and math.isnan(k)]
    if nan_keys:  # a NaN key matches any NaN input
        out = ops.where(ops.isnan(x), values[nan_keys[-1]].item(), out)
    return out


# -- TreeEnsemble ---------------------------------------------------------------------------

#: ``nodes_modes``: how a node compares its feature with its split (MEMBER: with a set)
_LEQ, _LT, _GTE, _GT, _EQ, _NEQ, _MEMBER = range(7)
_COMPARE = {
    _LEQ: "less_equal",
    _LT: "less",
    _GTE: "greater_equal",
    _GT: "greater",
    _EQ: "equal",
    _NEQ: "not_equal",
}
_AVERAGE, _SUM, _MIN, _MAX = range(4)
_NONE, _SOFTMAX, _LOGISTIC, _SOFTMAX_ZERO, _PROBIT = range(5)


class _Forest:
    """A TreeEnsemble's attributes as flat tables over one index space: interior nodes
    ``0..N-1``, then leaves ``N..N+L-1``. A leaf's two children are itself, so walking every
    tree ``depth`` steps from its root ends on its leaf whatever the path's length."""

    def __init__(self, node):
        modes = np.asarray(node.attr("nodes_modes")).astype(np.int64).reshape(-1)
        n = len(modes)
        leaves = len(np.asarray(node.attr("leaf_targetids")))
        true_ids, false_ids = (np.asarray(node.attr(f"nodes_{b}nodeids"), np.int64) for b in ("true", "false"))
        true_leaf, false_leaf = (np.asarray(node.attr(f"nodes_{b}leafs"), bool) for b in ("true", "false"))
        self.n = n
        self.true = np.concatenate([true_ids + n * true_leaf, n + np.arange(leaves)])
        self.false = np.concatenate([false_ids + n * false_leaf, n + np.arange(leaves)])
        pad = np.zeros(leaves, np.int64)
        self.modes = np.concatenate([modes, pad])
        self.features = np.concatenate([np.asarray(node.attr("nodes_featureids"), np.int64), pad])
        splits = np.asarray(node.attr("nodes_splits")).reshape(-1)
        self.splits = np.concatenate([splits, np.zeros(leaves, splits.dtype)])
        tracks = node.attr("nodes_missing_value_tracks_true")
        tracks = np.zeros(n, bool) if tracks is None else np.asarray(tracks, bool)
        self.missing_true = np.concatenate([tracks, np.zeros(leaves, bool)])
        self.members = self._members(node, modes)
        # a tree that is one leaf has a root whose two branches name that leaf: walked as any
        # other node (ONNX's reference reads the root's own index as the leaf's instead; the
        # two agree where a single-leaf tree's root and leaf have the same index)
        self.roots = np.asarray(node.attr("tree_roots"), np.int64)
        self.depth = self._depth(node)
        self.leaf_weights = np.asarray(node.attr("leaf_weights")).reshape(-1)
        self.leaf_targets = np.asarray(node.attr("leaf_targetids"), np.int64)

    def _members(self, node, modes: np.ndarray) -> np.ndarray | None:
        """Each MEMBER node's set, one row per node padded with NaN (which equals nothing);
        the sets are listed in ``membership_values`` in node order, each ended by a NaN."""
        wanted = np.flatnonzero(modes == _MEMBER)
        if not len(wanted):
            return None
        values = node.attr("membership_values")
        sets: list[list[float]] = [[]]
        for v in np.asarray([] if values is None else values, np.float64).reshape(-1).tolist():
            if math.isnan(v):
                sets.append([])
            else:
                sets[-1].append(v)
        sets = sets[: len(wanted)]
        if len(sets) < len(wanted) or values is None:
            raise ConversionError(
                message(
                    f"TreeEnsemble node {node.name!r} has fewer member sets than set-membership nodes",
                    expected=f"{len(wanted)} sets in membership_values, each ended by a NaN",
                    received=len(sets) if values is not None else "no membership_values",
                )
            )
        table = np.full((len(self.true), max(1, max(len(s) for s in sets))), np.nan)
        for row, members in zip(wanted, sets):
            table[row, : len(members)] = members
        return table

    def _depth(self, node) -> int:
        """The most interior nodes on any path from a root to a leaf."""
        depth = np.zeros(len(self.true), np.int64)  # leaves: 0
        for _ in range(self.n + 1):  # one more pass than any acyclic tree needs
            longer = np.maximum(depth[self.true], depth[self.false]) + 1
            updated = np.where(np.arange(len(depth)) < self.n, longer, 0)
            if np.array_equal(updated, depth):
                return int(depth[self.roots].max(initial=0))
            depth = updated
        raise ConversionError(
            message(
                f"TreeEnsemble node {node.name!r} has a cycle among its nodes",
                expected="trees: nodes_truenodeids and nodes_falsenodeids lead to leaves",
            )
        )


@handler("TreeEnsemble", since=5, domain=_ML)
def tree_ensemble(ctx, node, x):
    """``[N, F]`` features to ``[N, n_targets]``: every tree is walked at once by gathering
    each position's feature, split and children from static tables, ``depth`` times."""
    forest = _Forest(node)
    ops = ctx.ops
    dtype = ops.dtype(x)
    compare_dtype = str(np.result_type(np.dtype(dtype), forest.splits.dtype))
    x_compare = ops.cast(x, compare_dtype) if compare_dtype != dtype else x
    table = ops.asarray
    true, false = table(forest.true), table(forest.false)
    features, splits = table(forest.features), table(forest.splits, compare_dtype)
    used_modes = sorted(set(forest.modes[: forest.n].tolist()))
    unknown = [m for m in used_modes if m not in _COMPARE and m != _MEMBER]
    if unknown:
        raise UnsupportedOp(
            message(
                f"TreeEnsemble node {node.name!r} has unknown nodes_modes",
                received=unknown,
                choices=[str(m) for m in range(7)],
            )
        )
    modes = table(forest.modes)
    members = None if forest.members is None else table(forest.members, compare_dtype)
    missing_true = table(forest.missing_true) if forest.missing_true.any() else None
    batch, trees = ops.shape(x)[0], len(forest.roots)
    at = ops.broadcast_to(ops.reshape(table(forest.roots), (1, trees)), (batch, trees))
    for _ in range(forest.depth):
        value = ops.take_along_axis(x_compare, ops.take(features, at, axis=0), axis=1)
        split = ops.take(splits, at, axis=0)
        goes_true = None
        for mode in used_modes:
            if mode == _MEMBER:
                pool = ops.take(members, at, axis=0)  # [N, trees, members]
                hit = ops.max(ops.cast(ops.equal(ops.expand_dims(value, -1), pool), "int32"), axis=-1)
                result = ops.greater(hit, 0)
            else:
                result = getattr(ops, _COMPARE[mode])(value, split)
            goes_true = (
                result
                if goes_true is None
                else ops.where(ops.equal(ops.take(modes, at, axis=0), mode), result, goes_true)
            )
        if missing_true is not None:
            goes_true = ops.logical_or(goes_true, ops.logical_and(ops.take(missing_true, at, axis=0), ops.isnan(value)))
        at = ops.where(goes_true, ops.take(true, at, axis=0), ops.take(false, at, axis=0))
    leaf = ops.subtract(at, forest.n)
    weight = ops.take(table(forest.leaf_weights, dtype), leaf, axis=0)  # [N, trees]
    targets = ops.take(table(forest.leaf_targets), leaf, axis=0)
    hits = ops.equal(ops.expand_dims(targets, -1), table(np.arange(node.attr("n_targets", 1))))  # [N, trees, targets]
    weight = ops.expand_dims(weight, -1)
    aggregate = node.attr("aggregate_function", _SUM)
    if aggregate in (_SUM, _AVERAGE):
        y = ops.sum(ops.where(hits, weight, 0), axis=1)
        y = ops.divide(y, trees) if aggregate == _AVERAGE else y
    elif aggregate in (_MIN, _MAX):
        info = np.finfo(np.dtype(dtype))
        far = float(info.max if aggregate == _MIN else info.min)
        chosen = ops.where(hits, weight, far)
        y = ops.min(chosen, axis=1) if aggregate == _MIN else ops.max(chosen, axis=1)
    else:
        raise UnsupportedOp(
            message(
                f"TreeEnsemble node {node.name!r} has an unknown aggregate_function",
                received=aggregate,
                choices=["0 (AVERAGE)", "1 (SUM)", "2 (MIN)", "3 (MAX)"],
            )
        )
    return _post_transform(ctx, node, y)


def _post_transform(ctx, node, y):
    ops = ctx.ops
    transform = node.attr("post_transform", _NONE)
    if transform == _NONE:
        return y
    if transform == _SOFTMAX:
        return ops.softmax(y, axis=-1)
    if transform == _LOGISTIC:
        return ops.sigmoid(y)
    if transform == _SOFTMAX_ZERO:  # a softmax over the non-zero scores; zeros stay zero
        nonzero = ops.not_equal(y, 0)
        e = ops.where(nonzero, ops.exp(ops.subtract(y, ops.max(y, axis=-1, keepdims=True))), 0)
        total = ops.sum(e, axis=-1, keepdims=True)
        return ops.where(ops.greater(total, 0), ops.divide(e, ops.where(ops.greater(total, 0), total, 1)), 0)
    raise UnsupportedOp(
        message(
            f"TreeEnsemble node {node.name!r} has a post_transform the importer does not implement",
            received=transform,
            choices=["0 (NONE)", "1 (SOFTMAX)", "2 (LOGISTIC)", "3 (SOFTMAX_ZERO)"],
            fix="apply PROBIT (4) after the node, or export without it",
        )
    )


# -- TfIdfVectorizer -----------------------------------------------------------------------


def _ngram_pool(node) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], int, list]:
    """``{n: (grams [K, n], output columns [K])}`` for the n-gram lengths counted, the
    output width, and the pool (an n-gram listed twice keeps its last column)."""
    pool = node.attr("pool_int64s")
    pool = list(node.attr("pool_strings") or []) if pool is None else list(pool)
    starts = list(node.attr("ngram_counts")) + [len(pool)]
    columns = np.asarray(node.attr("ngram_indexes"), np.int64)
    lowest, highest = node.attr("min_gram_length"), node.attr("max_gram_length")
    found: dict[int, dict[tuple, int]] = {}
    gram_id = 0
    for size, (start, end) in enumerate(zip(starts[:-1], starts[1:]), start=1):
        count = max(end - start, 0) // size
        if lowest <= size <= highest:
            for k in range(count):
                found.setdefault(size, {})[tuple(pool[start + k * size : start + (k + 1) * size])] = int(
                    columns[gram_id + k]
                )
        gram_id += count
    grams = {
        size: (np.asarray(list(table), dtype=object).reshape(len(table), size), np.asarray(list(table.values())))
        for size, table in found.items()
    }
    return grams, int(columns.max(initial=-1)) + 1, pool


@handler("TfIdfVectorizer", since=9)
def tfidf_vectorizer(ctx, node, x):
    """Counts of the pool's n-grams in each row of ``x`` (``[C]`` or ``[N, C]``), weighted.

    An n-gram of length ``n`` with skip ``s`` reads positions ``p, p+s+1, ..., p+(n-1)(s+1)``;
    every such window is compared with every pool n-gram of that length at once, for each
    skip up to ``max_skip_count`` (unigrams once). String pools work on string inputs, which
    are numpy arrays: the strings become integer codes first."""
    grams, width, pool = _ngram_pool(node)
    ops = ctx.ops
    if node.attr("pool_strings") is not None:
        if not _is_strings(x):
            raise ConversionError(
                message(
                    f"TfIdfVectorizer node {node.name!r} has a string pool but a numeric input",
                    expected="a string tensor input",
                    received=getattr(x, "dtype", type(x).__name__),
                )
            )
        codes = {word: i for i, word in enumerate(dict.fromkeys(pool))}
        x = np.asarray([codes.get(w, -1) for w in x.reshape(-1).tolist()], np.int64).reshape(x.shape)
        grams = {n: (np.vectorize(codes.get, otypes=[np.int64])(g), c) for n, (g, c) in grams.items()}
    shape = ops.shape(x)
    if len(shape) not in (1, 2):
        raise ConversionError(
            message(
                f"TfIdfVectorizer node {node.name!r} needs a 1-D or 2-D input",
                expected="[C] or [N, C]",
                received=list(shape),
            )
        )
    rows = ops.reshape(ops.asarray(x) if isinstance(x, np.ndarray) else x, (1, -1)) if len(shape) == 1 else x
    length = int(shape[-1])
    counts = None
    for size, (pool_grams, columns) in grams.items():
        found = None
        for skip in [0] if size == 1 else range(node.attr("max_skip_count", 0) + 1):
            windows = length - (size - 1) * (skip + 1)
            if windows <= 0:
                continue
            match = None
            for j in range(size):  # [N, windows, K]: the window's j-th item is the gram's j-th
                items = ops.take(rows, ops.asarray(np.arange(windows) + j * (skip + 1), "int64"), axis=1)
                same = ops.equal(
                    ops.expand_dims(items, -1), ops.asarray(pool_grams[:, j].astype(np.int64), ops.dtype(rows))
                )
                match = same if match is None else ops.logical_and(match, same)
            here = ops.sum(ops.cast(match, "float32"), axis=1)
            found = here if found is None else ops.add(found, here)
        if found is not None:
            spread = np.zeros((len(columns), width), np.float32)
            spread[np.arange(len(columns)), columns] = 1
            to_columns = ops.matmul(found, ops.asarray(spread))
            counts = to_columns if counts is None else ops.add(counts, to_columns)
    if counts is None:
        counts = ops.multiply(ops.sum(ops.cast(rows, "float32"), axis=1, keepdims=True), ops.zeros((1, width)))
    y = _weigh(node, ops, counts, width)
    return ops.reshape(y, (width,)) if len(shape) == 1 else y


def _weigh(node, ops, counts, width: int):
    mode = node.attr("mode")
    weights = node.attr("weights")
    if mode not in ("TF", "IDF", "TFIDF"):
        raise UnsupportedOp(
            message(
                f"TfIdfVectorizer node {node.name!r} has an unknown mode", received=mode, choices=["TF", "IDF", "TFIDF"]
            )
        )
    if mode == "IDF":
        counts = ops.cast(ops.greater(counts, 0), "float32")
    if mode == "TF" or not weights:
        return counts
    if len(weights) < width:
        raise ConversionError(
            message(
                f"TfIdfVectorizer node {node.name!r} has too few weights",
                expected=f"one per output column ({width})",
                received=len(weights),
            )
        )
    return ops.multiply(counts, ops.asarray(np.asarray(weights[:width], np.float32)))
