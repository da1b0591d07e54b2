"""The op set's ``attention`` on every backend against the numpy composite, and the fused
kernel each framework reaches through it (torch's ``scaled_dot_product_attention``, JAX's
``jax.nn.dot_product_attention``; TensorFlow has none and runs the composite).

A mask is boolean, True where a query may attend; a fully masked row attends uniformly,
with no gradient to its query or to the keys, on every backend.
"""

from __future__ import annotations

import numpy as np
import pytest

import xdevice
from xdevice._tolerance import compare

REFERENCE = xdevice.backend("numpy").ops
B, H, T, S, D = 2, 3, 5, 6, 8


def _inputs(seed: int = 0, t: int = T) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=(B, H, t, D)), rng.normal(size=(B, H, S, D)), rng.normal(size=(B, H, S, D))


def _padding() -> np.ndarray:
    """Keys hidden per row (B, 1, 1, S): the second row keeps 4 of 6."""
    mask = np.ones((B, 1, 1, S), bool)
    mask[1, ..., 4:] = False
    return mask


def _fully_masked_row() -> np.ndarray:
    """(B, 1, T, S): the first row's third query may attend nowhere."""
    mask = np.broadcast_to(_padding(), (B, 1, T, S)).copy()
    mask[0, 0, 2] = False
    return mask


def _causal() -> np.ndarray:
    """(S, S): each query attends to itself and the keys before it."""
    return np.tril(np.ones((S, S), bool))


MASKS = {"none": None, "padding": _padding, "fully-masked-row": _fully_masked_row, "causal": _causal}


def _run(ops, q, k, v, mask, dtype="float32"):
    args = [ops.cast(ops.asarray(a.astype("float32")), dtype) for a in (q, k, v)]
    return ops.attention(*args, None if mask is None else ops.asarray(mask))


@pytest.mark.parametrize("masked", MASKS)
def test_attention_matches_the_numpy_composite(backend, masked):
    mask = MASKS[masked]() if MASKS[masked] else None
    q, k, v = _inputs(t=S if masked == "causal" else T)
    expected = REFERENCE.attention(q, k, v, mask)
    result = compare(backend.ops.to_numpy(_run(backend.ops, q, k, v, mask)), expected)
    assert result.ok, f"{backend.name} attention, mask {masked}: {result.describe()}"


def test_a_fully_masked_row_attends_uniformly(backend):
    q, k, v = _inputs()
    out = backend.ops.to_numpy(_run(backend.ops, q, k, v, _fully_masked_row()))
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out[0, :, 2], np.broadcast_to(v[0].mean(axis=-2), out[0, :, 2].shape), atol=1e-5)


@pytest.mark.parametrize("masked", ["none", "fully-masked-row", "causal"])
def test_attention_gradients_match_the_numpy_reference(backend, masked):
    mask = MASKS[masked]() if MASKS[masked] else None
    q, k, v = _inputs(t=S if masked == "causal" else T)
    cotangent = np.random.default_rng(1).normal(size=q.shape[:-1] + (D,))

    def gradients(target, dtype):
        ops = target.ops
        given = {name: ops.asarray(a.astype(dtype)) for name, a in zip("qkv", (q, k, v))}
        weight = ops.asarray(cotangent.astype(dtype))
        where = None if mask is None else ops.asarray(mask)

        def loss(p):
            return ops.sum(ops.multiply(ops.attention(p["q"], p["k"], p["v"], where), weight))

        return target.value_and_grad(loss, given)[1]

    expected = gradients(xdevice.backend("numpy"), "float64")
    actual = gradients(backend, "float32")
    for name in "qkv":
        result = compare(backend.ops.to_numpy(actual[name]), expected[name])
        assert result.ok, f"{backend.name} gradient of {name}, mask {masked}: {result.describe()}"
    if masked == "fully-masked-row":  # the row that attends nowhere leaves its query no gradient
        assert not np.any(backend.ops.to_numpy(actual["q"])[0, :, 2])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_attention_stays_within_its_tolerance(backend, dtype):
    if backend.name == "numpy":
        pytest.skip("the numpy backend is the float64 reference (and has no bfloat16 arithmetic)")
    q, k, v = _inputs()
    mask = _fully_masked_row()
    out = _run(backend.ops, q, k, v, mask, dtype)
    assert backend.ops.dtype(out) == dtype
    result = compare(backend.ops.to_numpy(backend.ops.cast(out, "float32")), REFERENCE.attention(q, k, v, mask), dtype)
    assert result.ok, f"{backend.name} {dtype} attention: {result.describe()}"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_jax_attention_compiles_under_jit_in_every_float_dtype(dtype):
    """XLA:CPU refuses the F16_F16_F32 dot that jax.nn.dot_product_attention asks for in
    float16 only when compiling: eager calls would not show it."""
    jax = pytest.importorskip("jax")
    ops = xdevice.backend("jax").ops
    q, k, v = (ops.cast(ops.asarray(a.astype("float32")), dtype) for a in _inputs())
    out = jax.jit(ops.attention)(q, k, v, ops.asarray(_padding()))
    expected = REFERENCE.attention(*_inputs(), _padding())
    assert compare(np.asarray(out, dtype="float32"), expected, dtype).ok


def test_each_framework_reaches_its_fused_kernel(backend, monkeypatch):
    q, k, v = _inputs()
    if backend.name == "torch":
        import torch
        from torch.profiler import profile

        with profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            _run(backend.ops, q, k, v, _padding())
        kernels = {event.name for event in prof.events() if event.name.startswith("aten::_scaled_dot_product")}
        assert kernels and not any("math" in name for name in kernels), kernels  # a fused kernel, not the math one
    elif backend.name == "jax":
        import jax

        calls = []
        fused = jax.nn.dot_product_attention
        monkeypatch.setattr(jax.nn, "dot_product_attention", lambda *a, **kw: calls.append(a) or fused(*a, **kw))
        jax.jit(backend.ops.attention)(*(backend.ops.asarray(a.astype("float32")) for a in (q, k, v)), _padding())
        assert calls, "jax.nn.dot_product_attention was not called"
        assert [np.shape(a) for a in calls[0]] == [(B, T, H, D), (B, S, H, D), (B, S, H, D)]  # its BTNH layout
    else:
        pytest.skip(f"{backend.name} has no fused attention kernel: the composite runs")
