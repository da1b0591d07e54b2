"""The optimizer update is written once (the op set's composites); a backend's fused or in-place
path gives the reference's numbers."""

from __future__ import annotations

import numpy as np
import pytest

import xdevice
from xdevice import compare
from xdevice.training.optimizers import SGD, Adam, AdamW

OPTIMIZERS = {
    "sgd": SGD(lr=0.1, weight_decay=0.01),
    "momentum": SGD(lr=0.1, momentum=0.9),
    "nesterov": SGD(lr=0.1, momentum=0.9, nesterov=True),
    "adam": Adam(lr=0.01, weight_decay=0.01),
    "adamw": AdamW(lr=0.01),
}


def run(backend, optimizer, inplace: bool, steps: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ops = backend.ops
    params = {
        f"w{i}": ops.asarray(rng.normal(size=shape).astype(np.float32))
        for i, shape in enumerate([(4, 3), (3,), (2, 2, 2)])
    }
    grads = [
        {k: ops.asarray(rng.normal(size=ops.shape(v)).astype(np.float32)) for k, v in params.items()}
        for _ in range(steps)
    ]
    state = optimizer.init(ops, params)
    for g in grads:
        params, state = optimizer.update(ops, params, g, state, inplace=inplace)
    return {
        **{k: ops.to_numpy(v) for k, v in params.items()},
        **{k: ops.to_numpy(v) for k, v in state.items() if k != "step"},
    }


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_the_trainers_in_place_update_gives_the_reference_numbers(backend, name):
    expected = run(xdevice.backend("numpy"), OPTIMIZERS[name], inplace=False)
    got = run(backend, OPTIMIZERS[name], inplace=True)
    assert sorted(got) == sorted(expected)
    for key in expected:
        result = compare(got[key], expected[key], "float32")
        assert result.ok, f"{key}: {result}"


def test_the_in_place_update_writes_into_the_arrays_it_was_given():
    torch = pytest.importorskip("torch")
    ops = xdevice.backend("torch").ops
    params = {"w": torch.ones(3)}
    new, _ = Adam(lr=0.1).update(ops, params, {"w": torch.ones(3)}, Adam().init(ops, params), inplace=True)
    assert new["w"] is params["w"] and float(params["w"][0]) < 1.0
    pure = {"w": torch.ones(3)}
    Adam(lr=0.1).update(ops, pure, {"w": torch.ones(3)}, Adam().init(ops, pure))
    assert float(pure["w"][0]) == 1.0  # without inplace the update is pure
