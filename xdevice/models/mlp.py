"""``mlp``: a multilayer perceptron, 784-512-512-10 with ReLU (MNIST-sized)."""

from __future__ import annotations

import math

import numpy as np

from xdevice.models._fit import Fitting
from xdevice.models._init import Param, dense

DEFAULTS = {"inputs": 784, "hidden": [512, 512], "classes": 10}
HYPERPARAMETERS = {
    "inputs": "features per row (64 for 8x8 images flattened)",
    "hidden": "width of each hidden layer, in order ([] for a linear model)",
    "classes": "outputs: one logit per class",
}
INPUT = "float[rows, inputs]: one feature vector per row"
OUTPUT = "float[rows, classes]: logits (no softmax)"


def parameters(spec: dict) -> dict[str, Param]:
    table, width = {}, spec["inputs"]
    for i, size in enumerate(spec["hidden"]):
        table.update(dense(f"dense{i}", width, size))
        width = size
    table.update(dense("out", width, spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    for i in range(len(spec["hidden"])):
        x = ops.relu(ops.linear(x, params[f"dense{i}.weight"], params[f"dense{i}.bias"]))
    y = ops.linear(x, params["out.weight"], params["out.bias"])
    return (y, {}) if train else y


def fitting(spec: dict, row: tuple[int, ...]) -> Fitting | None:
    """Rows of any shape fit once flattened, with ``inputs`` their size."""
    if row == (spec["inputs"],):
        return None
    if len(row) == 1:
        return Fitting(None, {"inputs": row[0]})
    features = math.prod(row)
    return Fitting("x.reshape(len(x), -1)", {} if features == spec["inputs"] else {"inputs": features})


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(batch, spec["inputs"])).astype(np.float32)
