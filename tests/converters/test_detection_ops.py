"""ONNX's detection and scatter ops (NonMaxSuppression, RoiAlign, TensorScatter) on every
backend, compiled where the backend compiles, against ONNX's reference evaluator; and the
random ops (Bernoulli, training-mode Dropout), whose bits differ from the reference's by
design, held to their distributions instead."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx", reason="ONNX detection-op tests need onnx (pip install onnx)")
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from tests.converters.graphs import onnx_model
from xdevice import ConversionError
from xdevice.converters.importer import from_onnx

node, info = helper.make_node, helper.make_tensor_value_info
FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, initializers=(), opset=22):
    return onnx_model(nodes, inputs, outputs, initializers, opset=opset)


def _const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def _run(backend, model, *inputs, compiled=False):
    """The model's outputs as numpy, eagerly or through the backend's compiler."""
    imported = from_onnx(model, backend=backend.name, check=False)
    run = backend.jit(imported.apply) if compiled else imported.apply
    return [backend.ops.to_numpy(y) for y in run(imported.params, *(backend.ops.asarray(x) for x in inputs))]


def _compiles(backend) -> bool:
    return backend.jit(_run) is not _run


# -- NonMaxSuppression ------------------------------------------------------------------------


def _nms_model(center_point_box=0, score_threshold=True):
    limits = [_const("limit", [2], np.int64), _const("iou", [0.4])]
    limits += [_const("score_min", [0.2])] if score_threshold else []
    names = ["boxes", "scores", "limit", "iou"] + (["score_min"] if score_threshold else [])
    nms = node("NonMaxSuppression", names, ["selected"], center_point_box=center_point_box)
    inputs = [info("boxes", FLOAT, [2, 6, 4]), info("scores", FLOAT, [2, 3, 6])]
    return _model([nms], inputs, [info("selected", INT64, None)], limits, opset=11)


def _nms_data(center_point_box):
    rng = np.random.default_rng(1)
    corner = rng.uniform(0, 4, (2, 6, 2)).astype(np.float32)
    size = rng.uniform(0.5, 3, (2, 6, 2)).astype(np.float32)
    if center_point_box:
        boxes = np.concatenate([corner, size], axis=-1)
    else:  # corners given in either order
        boxes = np.concatenate([corner + size, corner], axis=-1)
    scores = rng.uniform(0, 1, (2, 3, 6)).astype(np.float32)
    scores[0, 0, :2] = 0.9  # a tie: the lower box index goes first
    return boxes, scores


@pytest.mark.parametrize("center_point_box", [0, 1])
@pytest.mark.parametrize("score_threshold", [True, False])
def test_non_max_suppression_keeps_what_the_reference_keeps(backend, center_point_box, score_threshold):
    boxes, scores = _nms_data(center_point_box)
    model = _nms_model(center_point_box, score_threshold)
    (want,) = ReferenceEvaluator(model).run(None, {"boxes": boxes, "scores": scores})
    (got,) = _run(backend, model, boxes, scores)
    assert got.dtype.kind == "i" and len(want) > 0  # JAX holds int64 as int32 unless x64 is on
    np.testing.assert_array_equal(got, want)


def test_non_max_suppression_without_a_limit_selects_nothing(backend):
    boxes, scores = _nms_data(0)
    model = _model(
        [node("NonMaxSuppression", ["boxes", "scores"], ["selected"])],
        [info("boxes", FLOAT, [2, 6, 4]), info("scores", FLOAT, [2, 3, 6])],
        [info("selected", INT64, None)],
        opset=11,
    )
    (got,) = _run(backend, model, boxes, scores)
    assert got.shape == (0, 3)


def test_non_max_suppression_refuses_traced_boxes_by_name(backend):
    """Its output length depends on the scores, so a compiled graph cannot hold it."""
    if not _compiles(backend):
        pytest.skip(f"{backend.name} runs eagerly here")
    with pytest.raises(ConversionError, match=r"NonMaxSuppression node .*value known when the graph is built"):
        _run(backend, _nms_model(), *_nms_data(0), compiled=True)


# -- RoiAlign ---------------------------------------------------------------------------------

ROI_ALIGN_CASES = {
    # name: (attributes, opset)
    "avg, half_pixel, 2 samples": (dict(sampling_ratio=2, output_height=3, output_width=4), 22),
    "max, half_pixel, 2 samples": (dict(mode="max", sampling_ratio=2, output_height=3, output_width=2), 22),
    "avg, output_half_pixel, scaled": (
        dict(coordinate_transformation_mode="output_half_pixel", spatial_scale=0.5, output_height=2, output_width=2),
        22,
    ),
    "avg, adaptive grid per ROI": (dict(output_height=2, output_width=3), 22),
    "max, adaptive grid per ROI": (dict(mode="max", output_height=3, output_width=3), 22),
}


def _roi_align_model(attrs, opset):
    roi = node("RoiAlign", ["x", "rois", "batch"], ["y"], **attrs)
    inputs = [info("x", FLOAT, [2, 3, 7, 8]), info("rois", FLOAT, [4, 4]), info("batch", INT64, [4])]
    return _model([roi], inputs, [info("y", FLOAT, None)], opset=opset)


ROIS = np.array(
    # x1, y1, x2, y2: inside, a thin sliver, one past the map's edge, and a large one
    [[0.5, 1.0, 4.0, 6.0], [2.0, 2.0, 2.3, 5.0], [5.0, 4.0, 9.5, 8.5], [0.0, 0.0, 7.9, 6.9]],
    np.float32,
)


@pytest.mark.parametrize("case", list(ROI_ALIGN_CASES))
def test_roi_align_matches_the_onnx_reference(backend, case):
    attrs, opset = ROI_ALIGN_CASES[case]
    model = _roi_align_model(attrs, opset)
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 8)).astype(np.float32)
    batch = np.array([0, 1, 1, 0], np.int64)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x, "rois": ROIS, "batch": batch})
    (got,) = _run(backend, model, x, ROIS, batch)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_opset_10_does_not_shift_by_half_a_pixel(backend):
    """Opset 10 predates ``coordinate_transformation_mode``; its behaviour is what opset 16
    calls ``output_half_pixel`` (ONNX's reference evaluator applies 16's default instead)."""
    attrs = dict(sampling_ratio=1, output_height=2, output_width=2)
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 8)).astype(np.float32)
    batch = np.array([0, 1, 1, 0], np.int64)
    legacy = _roi_align_model({**attrs, "coordinate_transformation_mode": "output_half_pixel"}, 16)
    (want,) = ReferenceEvaluator(legacy).run(None, {"x": x, "rois": ROIS, "batch": batch})
    (got,) = _run(backend, _roi_align_model(attrs, 10), x, ROIS, batch)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_with_a_fixed_sampling_ratio_compiles(backend):
    if not _compiles(backend):
        pytest.skip(f"{backend.name} runs eagerly here")
    model = _roi_align_model(dict(sampling_ratio=2, output_height=3, output_width=4), 22)
    x = np.random.default_rng(3).standard_normal((2, 3, 7, 8)).astype(np.float32)
    batch = np.array([1, 0, 1, 0], np.int64)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x, "rois": ROIS, "batch": batch})
    (got,) = _run(backend, model, x, ROIS, batch, compiled=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_with_an_adaptive_grid_refuses_traced_rois_by_name(backend):
    if not _compiles(backend):
        pytest.skip(f"{backend.name} runs eagerly here")
    model = _roi_align_model(dict(output_height=2, output_width=2), 22)
    x = np.zeros((2, 3, 7, 8), np.float32)
    with pytest.raises(ConversionError, match=r"RoiAlign node .*value known when the graph is built"):
        _run(backend, model, x, ROIS, np.zeros(4, np.int64), compiled=True)


# -- TensorScatter ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1])
def test_tensor_scatter_writes_each_batch_entry_from_its_index(backend, mode, axis):
    past = np.random.default_rng(4).standard_normal((3, 5, 6, 2)).astype(np.float32)
    update_shape = list(past.shape)
    update_shape[axis] = 3
    update = np.random.default_rng(5).standard_normal(update_shape).astype(np.float32)
    starts = np.array([0, 2, 4 if mode == "circular" else 1], np.int64)  # circular: 4, then 0, 1 (axis 1)
    model = _model(
        [node("TensorScatter", ["past", "update", "starts"], ["present"], mode=mode, axis=axis)],
        [info("past", FLOAT, past.shape), info("update", FLOAT, update.shape), info("starts", INT64, [3])],
        [info("present", FLOAT, None)],
        opset=24,
    )
    (want,) = ReferenceEvaluator(model).run(None, {"past": past, "update": update, "starts": starts})
    (got,) = _run(backend, model, past, update, starts, compiled=True)
    np.testing.assert_array_equal(got, want)


def test_tensor_scatter_without_indices_writes_from_the_start(backend):
    past, update = np.zeros((2, 4, 3), np.float32), np.ones((2, 2, 3), np.float32)
    model = _model(
        [node("TensorScatter", ["past", "update"], ["present"], axis=1)],
        [info("past", FLOAT, past.shape), info("update", FLOAT, update.shape)],
        [info("present", FLOAT, None)],
        opset=24,
    )
    (got,) = _run(backend, model, past, update)
    assert got[:, :2].tolist() == update.tolist() and not got[:, 2:].any()


# -- random ops: distributions, not bits ------------------------------------------------------

DRAWS = 100_000


def _within(sample_mean: float, p: float, draws: int = DRAWS, errors: float = 5.0) -> bool:
    """The mean of ``draws`` Bernoulli(p) draws lies within ``errors`` standard errors of p."""
    return abs(sample_mean - p) <= errors * np.sqrt(p * (1 - p) / draws)


def _bernoulli_model(seed=None, dtype=None):
    attrs = {k: v for k, v in (("seed", seed), ("dtype", dtype)) if v is not None}
    return _model(
        [node("Bernoulli", ["p"], ["draws"], **attrs)],
        [info("p", FLOAT, [DRAWS])],
        [info("draws", dtype or FLOAT, None)],
        opset=15,
    )


@pytest.mark.parametrize("p", [0.05, 0.3, 0.5, 0.9])
def test_bernoulli_draws_ones_with_probability_p(backend, p):
    (draws,) = _run(backend, _bernoulli_model(seed=7.0), np.full(DRAWS, p, np.float32))
    assert set(np.unique(draws)) <= {0.0, 1.0}
    assert _within(draws.mean(), p), draws.mean()


def test_bernoulli_of_double_probabilities(backend):
    model = _bernoulli_model(seed=5.0)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.elem_type = TensorProto.DOUBLE
    (draws,) = _run(backend, model, np.full(DRAWS, 0.3))
    assert _within(draws.mean(), 0.3), draws.mean()


def test_bernoulli_of_zero_and_one_is_certain(backend):
    p = np.tile(np.array([0.0, 1.0], np.float32), DRAWS // 2)
    (draws,) = _run(backend, _bernoulli_model(), p)
    np.testing.assert_array_equal(draws, p)


def test_bernoulli_seed_repeats_its_draws_and_another_seed_does_not(backend):
    p = np.full(DRAWS, 0.5, np.float32)
    (first,) = _run(backend, _bernoulli_model(seed=1.0, dtype=TensorProto.INT64), p)
    (again,) = _run(backend, _bernoulli_model(seed=1.0, dtype=TensorProto.INT64), p)
    (other,) = _run(backend, _bernoulli_model(seed=2.0, dtype=TensorProto.INT64), p)
    assert first.dtype.kind == "i"
    np.testing.assert_array_equal(first, again)
    assert (first != other).mean() > 0.4  # independent fair coins differ half the time


def _dropout_model(ratio, seed=None):
    attrs = {"seed": seed} if seed is not None else {}
    return _model(
        [node("Dropout", ["x", "ratio", "training"], ["y", "mask"], **attrs)],
        [info("x", FLOAT, [DRAWS])],
        [info("y", FLOAT, None), info("mask", TensorProto.BOOL, None)],
        [_const("ratio", ratio), _const("training", True, np.bool_)],
        opset=13,
    )


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.75])
def test_training_dropout_keeps_1_minus_ratio_and_scales_what_it_keeps(backend, ratio):
    x = np.random.default_rng(6).uniform(1, 2, DRAWS).astype(np.float32)
    y, mask = _run(backend, _dropout_model(ratio, seed=3), x)
    assert mask.dtype == np.bool_
    assert _within(mask.mean(), 1 - ratio), mask.mean()
    np.testing.assert_allclose(y, np.where(mask, x / (1 - ratio), 0.0), rtol=1e-6)


def test_training_dropout_seed_repeats_its_mask(backend):
    x = np.ones(DRAWS, np.float32)
    _, first = _run(backend, _dropout_model(0.5, seed=11), x)
    _, again = _run(backend, _dropout_model(0.5, seed=11), x)
    _, other = _run(backend, _dropout_model(0.5, seed=12), x)
    np.testing.assert_array_equal(first, again)
    assert (first != other).mean() > 0.4


def test_inference_dropout_is_the_identity(backend):
    x = np.random.default_rng(7).standard_normal(1000).astype(np.float32)
    model = _model(
        [node("Dropout", ["x"], ["y", "mask"], ratio=0.5)],
        [info("x", FLOAT, [1000])],
        [info("y", FLOAT, None), info("mask", TensorProto.BOOL, None)],
        opset=13,
    )
    y, mask = _run(backend, model, x)
    np.testing.assert_array_equal(y, x)
    assert mask.all()
