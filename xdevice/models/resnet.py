"""``resnet``: a small CIFAR ResNet (ResNet-8: a stem and three stages of one basic block),
with batch norm; stride 2 and a 1x1 projection shortcut where a stage narrows the image.

In training, batch norm normalises with the batch's statistics and updates its running
``mean`` and ``var`` buffers with PyTorch's rule: momentum 0.1, unbiased variance.
"""

from __future__ import annotations

import numpy as np

from xdevice.models._fit import check_image, pooled_image_fitting
from xdevice.models._init import Param, batch_norm, conv, dense, norm

DEFAULTS = {"widths": [16, 32, 64], "image": [3, 32, 32], "classes": 10, "momentum": 0.1, "eps": 1e-5}
HYPERPARAMETERS = {
    "widths": "channels of each stage (one basic block each; every stage after the first halves the image)",
    "image": "[channels, height, width] of the example input; only channels sizes weights (any height, width run)",
    "classes": "outputs: one logit per class",
    "momentum": "batch norm's running-statistics momentum (PyTorch's rule)",
    "eps": "batch norm's epsilon",
}
INPUT = "float[rows, image[0], height, width]: images, channels first (NCHW), any height and width"
OUTPUT = "float[rows, classes]: logits (no softmax)"


def check(spec: dict) -> None:
    check_image("resnet", spec)


def parameters(spec: dict) -> dict[str, Param]:
    first = spec["widths"][0]
    table = {**conv("stem.conv", spec["image"][0], first, 3, bias=False), **norm("stem.bn", first, True)}
    width = first
    for i, size in enumerate(spec["widths"]):
        block = f"stage{i}"
        table.update(conv(f"{block}.conv1", width, size, 3, bias=False))
        table.update(norm(f"{block}.bn1", size, True))
        table.update(conv(f"{block}.conv2", size, size, 3, bias=False))
        table.update(norm(f"{block}.bn2", size, True))
        if i > 0:
            table.update(conv(f"{block}.shortcut", width, size, 1, bias=False))
            table.update(norm(f"{block}.shortcut_bn", size, True))
        width = size
    table.update(dense("out", width, spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    updates: dict = {}

    def bn(name, x):
        return batch_norm(ops, params, name, x, spec, train, updates)

    x = ops.relu(bn("stem.bn", ops.conv(x, params["stem.conv.weight"], padding=1)))
    for i in range(len(spec["widths"])):
        block, stride = f"stage{i}", 1 if i == 0 else 2
        h = ops.relu(bn(f"{block}.bn1", ops.conv(x, params[f"{block}.conv1.weight"], stride=stride, padding=1)))
        h = bn(f"{block}.bn2", ops.conv(h, params[f"{block}.conv2.weight"], padding=1))
        if i > 0:
            x = bn(f"{block}.shortcut_bn", ops.conv(x, params[f"{block}.shortcut.weight"], stride=stride))
        x = ops.relu(ops.add(h, x))
    logits = ops.linear(ops.mean(x, axis=(2, 3)), params["out.weight"], params["out.bias"])
    return (logits, updates) if train else logits


fitting = pooled_image_fitting


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(batch, *spec["image"])).astype(np.float32)
