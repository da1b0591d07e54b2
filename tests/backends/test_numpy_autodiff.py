"""The numpy tape is the gradient reference, so it is checked against finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import xdevice

from .op_cases import CASES
from .test_ops import differentiable, outputs, substitute

NUMPY = xdevice.backend("numpy")
GRAD_CASES = [c for c in CASES if c.grad]
STEP = 1e-6


@pytest.mark.parametrize("case", GRAD_CASES, ids=[c.id for c in GRAD_CASES])
def test_tape_gradient_matches_central_finite_differences(case):
    ops = NUMPY.ops
    inputs = list(case.inputs(np.random.default_rng(0)))
    cotangents = [
        np.random.default_rng(1 + i).normal(size=np.shape(o))
        for i, o in enumerate(outputs(getattr(ops, case.op)(*inputs, **case.kwargs)))
    ]

    def loss(params):
        given = substitute(inputs, params)
        total = 0.0
        for out, cot in zip(outputs(getattr(ops, case.op)(*given, **case.kwargs)), cotangents):
            total = ops.add(total, ops.sum(ops.multiply(out, cot)))
        return total

    params = differentiable(inputs, case.grad)
    _, grads = NUMPY.value_and_grad(loss, params)
    for key, leaf in params.items():
        numeric = np.zeros_like(leaf)
        for index in np.ndindex(leaf.shape):
            original = leaf[index]
            leaf[index] = original + STEP
            up = float(loss(params))
            leaf[index] = original - STEP
            down = float(loss(params))
            leaf[index] = original
            numeric[index] = (up - down) / (2 * STEP)
        np.testing.assert_allclose(grads[key], numeric, rtol=1e-5, atol=1e-6, err_msg=f"{case.id} input {key}")
