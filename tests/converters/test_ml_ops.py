"""The ``ai.onnx.ml`` ops (TreeEnsemble, LabelEncoder, Binarizer, ArrayFeatureExtractor),
TfIdfVectorizer and the ``ai.onnx.preview.training`` optimizer steps on every backend,
compiled where the backend compiles, against ONNX's reference evaluator."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX ml-op tests need onnx (pip install onnx)")
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from tests.converters.graphs import onnx_model
from xdevice import UnsupportedOp
from xdevice.converters.importer import from_onnx

node, info, tensor = helper.make_node, helper.make_tensor_value_info, helper.make_tensor
ML, TRAINING = "ai.onnx.ml", "ai.onnx.preview.training"


def _model(nodes, inputs, outputs):
    return onnx_model(nodes, inputs, outputs, opset=20, domains={ML: 5, TRAINING: 1})


def _run_compiled(backend, model, *inputs):
    """The model's outputs as numpy, run through the backend's compiler (eager where it has none)."""
    imported = from_onnx(model, backend=backend.name, check=False)
    outputs = backend.jit(imported.apply)(imported.params, *(backend.ops.asarray(x) for x in inputs))
    return [backend.ops.to_numpy(y) for y in outputs]


def _reference(model, **feeds):
    return ReferenceEvaluator(model).run(None, feeds)


# -- TreeEnsemble ---------------------------------------------------------------------------


def _forest(aggregate: int, post_transform: int = 0):
    """Three trees over 3 features: one 3 levels deep (LEQ, GT, a set test, a NaN that goes
    the true way), one of a single split (LT), and one that is a single leaf."""
    node_rows = [
        # (mode, feature, split, true id, true is leaf, false id, false is leaf, NaN goes true)
        (0, 0, 0.5, 1, 0, 2, 0, 0),  # tree 0 root: x0 <= 0.5
        (3, 1, -0.2, 0, 1, 3, 0, 1),  # x1 > -0.2 (NaN: true) -> leaf 0
        (6, 2, 0.0, 1, 1, 2, 1, 0),  # x2 in {1, 3} -> leaf 1 else leaf 2
        (2, 2, 0.7, 3, 1, 4, 1, 0),  # x2 >= 0.7
        (1, 1, 0.1, 5, 1, 6, 1, 0),  # tree 1 root: x1 < 0.1
        (0, 0, 0.0, 5, 1, 5, 1, 0),  # tree 2: a single leaf (both branches name leaf 5)
    ]
    mode, feature, split, true_id, true_leaf, false_id, false_leaf, tracks = map(list, zip(*node_rows))
    weights = [1.0, -2.0, 3.5, 0.25, 4.0, -1.5, 2.0]
    return node(
        "TreeEnsemble",
        ["x"],
        ["y"],
        domain=ML,
        n_targets=3,
        aggregate_function=aggregate,
        post_transform=post_transform,
        tree_roots=[0, 4, 5],
        nodes_modes=tensor("nodes_modes", TensorProto.UINT8, (6,), mode),
        nodes_featureids=feature,
        nodes_splits=tensor("nodes_splits", TensorProto.DOUBLE, (6,), split),
        nodes_truenodeids=true_id,
        nodes_trueleafs=true_leaf,
        nodes_falsenodeids=false_id,
        nodes_falseleafs=false_leaf,
        nodes_missing_value_tracks_true=tracks,
        membership_values=tensor("membership_values", TensorProto.FLOAT, (3,), [1.0, 3.0, np.nan]),
        leaf_targetids=[0, 1, 2, 0, 1, 2, 0],
        leaf_weights=tensor("leaf_weights", TensorProto.FLOAT, (7,), weights),
    )


FOREST_INPUT = np.array(
    [[0.1, 0.3, 1.0], [0.2, np.nan, 9.0], [0.4, -0.5, 3.0], [0.4, -0.5, 2.0], [0.9, 0.0, 0.8], [0.9, 0.2, 0.1]],
    np.float32,
)


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3], ids=["average", "sum", "min", "max"])
def test_tree_ensemble_walks_every_tree_like_the_onnx_reference(backend, aggregate):
    model = _model(
        [_forest(aggregate)], [info("x", TensorProto.FLOAT, [None, 3])], [info("y", TensorProto.FLOAT, None)]
    )
    (want,) = _reference(model, x=FOREST_INPUT)
    (got,) = _run_compiled(backend, model, FOREST_INPUT)
    assert got.dtype == np.float32 and got.shape == (6, 3)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_tree_ensemble_applies_its_softmax_post_transform(backend):
    x = info("x", TensorProto.FLOAT, [None, 3])
    raw, soft = (_model([_forest(1, post)], [x], [info("y", TensorProto.FLOAT, None)]) for post in (0, 1))
    (scores,) = _reference(raw, x=FOREST_INPUT)  # ONNX's reference leaves post_transform out
    (got,) = _run_compiled(backend, soft, FOREST_INPUT)
    want = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- TfIdfVectorizer -------------------------------------------------------------------------


def _tfidf(mode, *, low, high, skips, weights=None):
    pool = [2, 3, 5, 4, 5, 6, 7, 8, 6, 7, 3, 4, 5]  # 4 unigrams, 3 bigrams, 1 trigram
    extra = {"weights": weights} if weights is not None else {}
    return node(
        "TfIdfVectorizer",
        ["x"],
        ["y"],
        mode=mode,
        min_gram_length=low,
        max_gram_length=high,
        max_skip_count=skips,
        ngram_counts=[0, 4, 10],
        ngram_indexes=[7, 0, 1, 2, 3, 4, 5, 6],  # n-gram i -> output column
        pool_int64s=pool,
        **extra,
    )


TFIDF_CASES = {
    "TF, uni- to trigrams, skips up to 2": ("TF", 1, 3, 2, None),
    "TF, bigrams only, no skip": ("TF", 2, 2, 0, None),
    "IDF with weights": ("IDF", 1, 2, 1, [0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4]),
    "TFIDF with weights, trigrams only": ("TFIDF", 3, 3, 3, [0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4]),
}


@pytest.mark.parametrize("case", list(TFIDF_CASES))
@pytest.mark.parametrize("shape", [(12,), (2, 6)], ids=["one row", "a batch"])
def test_tfidf_vectorizer_counts_ngrams_like_the_onnx_reference(backend, case, shape):
    mode, low, high, skips, weights = TFIDF_CASES[case]
    x = np.array([1, 3, 4, 5, 3, 4, 5, 6, 7, 2, 6, 8], np.int32).reshape(shape)
    model = _model(
        [_tfidf(mode, low=low, high=high, skips=skips, weights=weights)],
        [info("x", TensorProto.INT32, shape)],
        [info("y", TensorProto.FLOAT, None)],
    )
    (want,) = _reference(model, x=x)
    (got,) = _run_compiled(backend, model, x)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want)
    assert got.any()  # the cases count something


def test_tfidf_vectorizer_counts_string_ngrams_on_every_backend(backend):
    vectorize = node(
        "TfIdfVectorizer",
        ["x"],
        ["y"],
        mode="TF",
        min_gram_length=1,
        max_gram_length=2,
        max_skip_count=1,
        ngram_counts=[0, 2],
        ngram_indexes=[0, 1, 2],
        pool_strings=["to", "be", "to", "be"],
    )
    model = _model([vectorize], [info("x", TensorProto.STRING, [6])], [info("y", TensorProto.FLOAT, None)])
    x = np.array(["to", "be", "or", "not", "to", "be"], dtype=object)
    got = from_onnx(model, backend=backend.name, check=False)(x)
    np.testing.assert_allclose(backend.ops.to_numpy(got), _reference(model, x=x)[0])


# -- LabelEncoder, Binarizer, ArrayFeatureExtractor ----------------------------------------


def test_label_encoder_maps_numbers_with_the_last_repeated_key_and_nan_winning(backend):
    encode = node(
        "LabelEncoder",
        ["x"],
        ["y"],
        domain=ML,
        keys_floats=[1.5, -2.0, 1.5, float("nan")],
        values_int64s=[10, 20, 30, 40],
        default_int64=-7,
    )
    model = _model([encode], [info("x", TensorProto.FLOAT, [5])], [info("y", TensorProto.INT64, None)])
    x = np.array([1.5, 0.0, -2.0, np.nan, 1.5], np.float32)
    (got,) = _run_compiled(backend, model, x)
    assert got.dtype == backend.ops.dtype(backend.ops.asarray(np.zeros((), np.int64)))  # JAX without x64: int32
    np.testing.assert_array_equal(got, [30, -7, 20, 40, 30])


def test_label_encoder_maps_an_input_string_tensor_on_every_backend(backend):
    encode = node("LabelEncoder", ["x"], ["y"], domain=ML, keys_strings=["a", "b"], values_int64s=[1, 2])
    model = _model([encode], [info("x", TensorProto.STRING, [3])], [info("y", TensorProto.INT64, None)])
    got = from_onnx(model, backend=backend.name, check=False)(np.array(["b", "z", "a"], dtype=object))
    np.testing.assert_array_equal(backend.ops.to_numpy(got), [2, -1, 1])


def test_label_encoder_to_strings_runs_on_numpy_only(backend):
    encode = node("LabelEncoder", ["x"], ["y"], domain=ML, keys_int64s=[1, 2], values_strings=["one", "two"])
    model = _model([encode], [info("x", TensorProto.INT64, [3])], [info("y", TensorProto.STRING, None)])
    imported = from_onnx(model, backend=backend.name, check=False)
    x = np.array([2, 5, 1], np.int64)
    if backend.name != "numpy":
        with pytest.raises(UnsupportedOp, match="no string tensors"):
            imported(x)
    else:
        assert imported(x).tolist() == ["two", "_Unused", "one"]


def test_binarizer_and_array_feature_extractor_match_the_onnx_reference(backend):
    nodes = [
        node("Binarizer", ["x"], ["b"], domain=ML, threshold=0.25),
        node("ArrayFeatureExtractor", ["x", "i"], ["picked"], domain=ML),
        node("ArrayFeatureExtractor", ["row", "i"], ["from_row"], domain=ML),
    ]
    model = _model(
        nodes,
        [info("x", TensorProto.FLOAT, [2, 4]), info("i", TensorProto.INT64, [3]), info("row", TensorProto.FLOAT, [4])],
        [info(name, TensorProto.FLOAT, None) for name in ("b", "picked", "from_row")],
    )
    x = np.array([[0.1, 0.3, -1.0, 0.25], [2.0, 0.0, 0.26, -0.5]], np.float32)
    i, row = np.array([3, 0, 3], np.int64), np.array([5.0, 6.0, 7.0, 8.0], np.float32)
    want = _reference(model, x=x, i=i, row=row)
    got = _run_compiled(backend, model, x, i, row)
    assert got[2].shape == (1, 3)  # a 1-D input gives one row
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)


# -- the training domain's optimizer steps ----------------------------------------------------

OPTIMIZERS = {
    # name: (op, attributes, groups of tensors after R and T)
    "adagrad": ("Adagrad", {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.01}, "XGH"),
    "adam": ("Adam", {"alpha": 0.85, "beta": 0.99, "norm_coefficient": 0.02, "norm_coefficient_post": 0.1}, "XGVH"),
    "momentum": ("Momentum", {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}, "XGV"),
    "nesterov": ("Momentum", {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}, "XGV"),
}


@pytest.mark.parametrize("step", [0, 3], ids=["first step", "later step"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_update_two_tensors_like_the_onnx_reference(backend, name, step):
    op, attributes, kinds = OPTIMIZERS[name]
    shapes = [(3,), (2, 2)]
    names = [f"{kind}{i}" for kind in kinds for i in range(len(shapes))]
    rng = np.random.default_rng(0)
    feeds = {"R": np.array(0.1, np.float32), "T": np.array(step, np.int64)}
    for n in names:
        value = rng.normal(size=shapes[int(n[1])]).astype(np.float32)
        feeds[n] = np.abs(value) if n[0] == "H" else value  # accumulated squares are >= 0
    outputs = [f"{n}_new" for n in names if n[0] != "G"]
    model = _model(
        [node(op, ["R", "T", *names], outputs, domain=TRAINING, **attributes)],
        [info(n, TensorProto.INT64 if n == "T" else TensorProto.FLOAT, feeds[n].shape) for n in feeds],
        [info(n, TensorProto.FLOAT, None) for n in outputs],
    )
    want = _reference(model, **feeds)
    got = _run_compiled(backend, model, *feeds.values())
    assert [g.dtype for g in got] == [np.float32] * len(outputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
