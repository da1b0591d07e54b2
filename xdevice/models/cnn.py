"""``cnn``: two conv-ReLU-maxpool blocks and a dense classifier, for 3x32x32 images (NCHW)."""

from __future__ import annotations

import numpy as np

from xdevice.models._init import Param, conv, dense

DEFAULTS = {"channels": [32, 64], "image": [3, 32, 32], "classes": 10}


def parameters(spec: dict) -> dict[str, Param]:
    table, width = {}, spec["image"][0]
    for i, size in enumerate(spec["channels"]):
        table.update(conv(f"conv{i}", width, size, 3))
        width = size
    side = spec["image"][1] // 2 ** len(spec["channels"])
    table.update(dense("out", width * side * side, spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    for i in range(len(spec["channels"])):
        x = ops.conv(x, params[f"conv{i}.weight"], params[f"conv{i}.bias"], padding=1)
        x = ops.max_pool(ops.relu(x), 2)
    y = ops.linear(ops.flatten(x), params["out.weight"], params["out.bias"])
    return (y, {}) if train else y


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(batch, *spec["image"])).astype(np.float32)
