"""``cnn``: two conv-ReLU-maxpool blocks and a dense classifier, for 3x32x32 images (NCHW)."""

from __future__ import annotations

import numpy as np

from xdevice._errors import ConfigurationError, message
from xdevice.models._fit import Fitting, check_image, image_fitting
from xdevice.models._init import Param, conv, dense

DEFAULTS = {"channels": [32, 64], "image": [3, 32, 32], "classes": 10}
HYPERPARAMETERS = {
    "channels": "output channels of each conv block (3x3 conv, ReLU, 2x2 max pool)",
    "image": "[channels, height, width] of the input images ([1, 8, 8] for 8x8 grey images)",
    "classes": "outputs: one logit per class",
}
INPUT = "float[rows, *image]: images, channels first (NCHW)"
OUTPUT = "float[rows, classes]: logits (no softmax)"


def check(spec: dict) -> None:
    """``image`` is ``[channels, height, width]`` and survives every 2x2 pool."""
    check_image("cnn", spec)
    side, blocks = min(spec["image"][1:]), len(spec["channels"])
    if side < 2**blocks:
        fewer = list(spec["channels"])[: side.bit_length() - 1]  # as many 2x2 pools as the side allows
        raise ConfigurationError(
            message(
                f"An image of {spec['image'][1]}x{spec['image'][2]} vanishes under {blocks} 2x2 pools",
                expected=f"height and width of at least {2**blocks}, or fewer conv blocks",
                received=spec["image"],
                fix=f'models.build("cnn", image={list(spec["image"])}, channels={fewer})',
            )
        )


def parameters(spec: dict) -> dict[str, Param]:
    table, width = {}, spec["image"][0]
    for i, size in enumerate(spec["channels"]):
        table.update(conv(f"conv{i}", width, size, 3))
        width = size
    pools = 2 ** len(spec["channels"])
    table.update(dense("out", width * (spec["image"][1] // pools) * (spec["image"][2] // pools), spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    for i in range(len(spec["channels"])):
        x = ops.conv(x, params[f"conv{i}.weight"], params[f"conv{i}.bias"], padding=1)
        x = ops.max_pool(ops.relu(x), 2)
    y = ops.linear(ops.flatten(x), params["out.weight"], params["out.bias"])
    return (y, {}) if train else y


def fitting(spec: dict, row: tuple[int, ...]) -> Fitting | None:
    """The dense layer is sized for ``image``: only images of that shape fit."""
    return image_fitting(spec, row)


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(batch, *spec["image"])).astype(np.float32)
