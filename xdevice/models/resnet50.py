"""``resnet50``: ResNet-50 v1.5, as transformers' ``ResNetForImageClassification`` computes it
(the ``microsoft/resnet-50`` layout), with batch norm; logits for ImageNet's 1,000 classes.

The stem is a 7x7 convolution of stride 2, batch norm, ReLU and a 3x3 max pool of stride 2;
four stages of bottleneck blocks follow (1x1 down to a quarter of the stage's width, 3x3,
1x1 back up; 3, 4, 6 and 3 blocks of widths 256, 512, 1024, 2048). Version 1.5 puts a
stage's stride 2 on the 3x3 convolution (``downsample_in_bottleneck=True``: on the first
1x1, version 1); the first stage keeps the stem's size (``downsample_in_first_stage``). A
block's shortcut is a 1x1 convolution and batch norm where its width or size changes, the
identity elsewhere. Global average pooling and a linear classifier end it. Basic blocks
(two 3x3 convolutions: ResNet-18/34's, ``block="basic"``) are computed too.

In training, batch norm normalises with the batch's statistics and updates its running
``mean`` and ``var`` buffers with PyTorch's rule: momentum 0.1, unbiased variance.
``build("resnet50", weights=folder)`` reads a transformers folder; every transformers
configuration field that changes the math is computed, except ``hidden_act`` other than
``relu``, which is refused by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, ConversionError, message
from xdevice.models import _pretrained, _remat
from xdevice.models._fit import check_image, pooled_image_fitting
from xdevice.models._init import Param, batch_norm, conv, dense, norm

DEFAULTS: dict[str, Any] = {
    "image": [3, 224, 224],
    "stem": 64,
    "widths": [256, 512, 1024, 2048],
    "depths": [3, 4, 6, 3],
    "block": "bottleneck",
    "downsample_in_first_stage": False,
    "downsample_in_bottleneck": False,
    "classes": 1000,
    "momentum": 0.1,
    "eps": 1e-5,
    "remat": False,
}
SMALL: dict[str, Any] = {
    "image": [3, 48, 48],
    "stem": 8,
    "widths": [8, 16, 16, 32],
    "depths": [1, 1, 1, 1],
    "classes": 10,
}
HYPERPARAMETERS = {
    "image": "[channels, height, width] of the example input; only channels sizes weights (any height, width run)",
    "stem": "channels of the 7x7 stem convolution (transformers' embedding_size)",
    "widths": "output channels of each stage (transformers' hidden_sizes); a bottleneck works at a quarter of it",
    "depths": "blocks in each stage; every stage after the first halves the image",
    "block": '"bottleneck" (1x1, 3x3, 1x1: ResNet-50 and up) or "basic" (3x3, 3x3: ResNet-18/34)',
    "downsample_in_first_stage": "whether the first stage halves the image too (False: the max pool already did)",
    "downsample_in_bottleneck": "stride 2 on a bottleneck's first 1x1 (ResNet v1) instead of its 3x3 (False: v1.5)",
    "classes": "outputs: one logit per class",
    "momentum": "batch norm's running-statistics momentum (PyTorch's rule)",
    "eps": "batch norm's epsilon (transformers' is PyTorch's default, 1e-5)",
    "remat": "training recomputes each block's activations in the backward pass instead of keeping them",
}
INPUT = "float[rows, image[0], height, width]: images, channels first (NCHW), any height and width"
OUTPUT = "float[rows, classes]: logits (no softmax)"
INPUTS: tuple[str, ...] = ()
TRANSFORMERS_CLASS = "ResNetForImageClassification"
MODEL_TYPE = "resnet"
_BLOCKS = ("bottleneck", "basic")


def check(spec: dict) -> None:
    check_image("resnet50", spec)
    if spec["block"] not in _BLOCKS:
        raise ConfigurationError(
            message("Unknown ResNet block", expected="a block type", received=spec["block"], choices=_BLOCKS)
        )
    if len(spec["widths"]) != len(spec["depths"]) or not spec["widths"]:
        raise ConfigurationError(
            message(
                "ResNet takes one width and one depth per stage",
                expected="widths and depths of the same length",
                received=f"widths={spec['widths']}, depths={spec['depths']}",
            )
        )
    smallest = 4 if spec["block"] == "bottleneck" else 1
    if min(spec["widths"]) < smallest or min(spec["depths"]) < 1 or spec["classes"] < 1:
        raise ConfigurationError(
            message(
                "ResNet's stages need channels and blocks, and its classifier outputs",
                expected=f"widths of at least {smallest} (a bottleneck works at a quarter), depths and classes >= 1",
                received=f"widths={spec['widths']}, depths={spec['depths']}, classes={spec['classes']}",
            )
        )


def _blocks(spec: dict) -> Iterator[tuple[str, int, int, int]]:
    """``(name, in_channels, out_channels, stride)`` of every block, in order: one place that
    ``parameters``, ``apply`` and the checkpoint names agree on (transformers' ``ResNetStage``)."""
    width = spec["stem"]
    for s, (size, depth) in enumerate(zip(spec["widths"], spec["depths"])):
        for b in range(depth):
            stride = 2 if b == 0 and (s > 0 or spec["downsample_in_first_stage"]) else 1
            yield f"stage{s}.block{b}", width, size, stride
            width = size


def _convs(spec: dict, width: int, size: int, stride: int) -> list[tuple[int, int, int, int]]:
    """A block's convolutions: ``(in, out, kernel, stride)``; the last has no ReLU of its own."""
    if spec["block"] == "basic":
        return [(width, size, 3, stride), (size, size, 3, 1)]
    inner = size // 4
    first, middle = (stride, 1) if spec["downsample_in_bottleneck"] else (1, stride)
    return [(width, inner, 1, first), (inner, inner, 3, middle), (inner, size, 1, 1)]


def _projects(width: int, size: int, stride: int) -> bool:
    return width != size or stride != 1


def parameters(spec: dict) -> dict[str, Param]:
    channels, stem = spec["image"][0], spec["stem"]
    table = {**conv("stem.conv", channels, stem, 7, bias=False), **norm("stem.bn", stem, True)}
    for name, width, size, stride in _blocks(spec):
        for j, (inputs, outputs, kernel, _) in enumerate(_convs(spec, width, size, stride), 1):
            table.update(conv(f"{name}.conv{j}", inputs, outputs, kernel, bias=False))
            table.update(norm(f"{name}.bn{j}", outputs, True))
        if _projects(width, size, stride):
            table.update(conv(f"{name}.shortcut", width, size, 1, bias=False))
            table.update(norm(f"{name}.shortcut_bn", size, True))
    table.update(dense("out", spec["widths"][-1], spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    updates: dict = {}

    def bn(name, x, params, updates):
        return batch_norm(ops, params, name, x, spec, train, updates)

    x = ops.relu(bn("stem.bn", ops.conv(x, params["stem.conv.weight"], stride=2, padding=3), params, updates))
    x = ops.max_pool(x, 3, stride=2, padding=1)
    for name, width, size, stride in _blocks(spec):
        convs, projects = _convs(spec, width, size, stride), _projects(width, size, stride)
        norms = [f"{name}.bn{j}" for j in range(1, len(convs) + 1)] + [f"{name}.shortcut_bn"] * projects
        # the running statistics leave the block as outputs: a recomputed block has no side effects
        statistics = [f"{norm}.{kind}" for norm in norms for kind in ("mean", "var")] if train else []

        def run(x, params, name=name, convs=convs, projects=projects, stride=stride, statistics=statistics):
            own: dict = {}
            h = x
            for j, (_, _, kernel, step) in enumerate(convs, 1):
                h = ops.conv(h, params[f"{name}.conv{j}.weight"], stride=step, padding=kernel // 2)
                h = bn(f"{name}.bn{j}", h, params, own)
                if j < len(convs):
                    h = ops.relu(h)
            if projects:
                x = ops.conv(x, params[f"{name}.shortcut.weight"], stride=stride)
                x = bn(f"{name}.shortcut_bn", x, params, own)
            return (ops.relu(ops.add(h, x)), *(own[key] for key in statistics))

        x, *values = _remat.block(ops, run, x, params, f"{name}.", spec.get("remat", False) and train)
        updates.update(zip(statistics, values))
    logits = ops.linear(ops.mean(x, axis=(2, 3)), params["out.weight"], params["out.bias"])
    return (logits, updates) if train else logits


fitting = pooled_image_fitting


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(batch, *spec["image"])).astype(np.float32)


# -- transformers checkpoints -----------------------------------------------------------------

_NORM = {"scale": "weight", "offset": "bias", "mean": "running_mean", "var": "running_var"}


def _names(spec: dict) -> dict[str, str]:
    """Zoo name -> transformers' name (``ResNetForImageClassification``, the ``resnet.`` prefix left out
    except for the classifier, which sits outside it)."""
    names = {"stem.conv.weight": "embedder.embedder.convolution.weight"}
    names.update({f"stem.bn.{k}": f"embedder.embedder.normalization.{v}" for k, v in _NORM.items()})
    for name, width, size, stride in _blocks(spec):
        s, b = (int(part[5:]) for part in name.split("."))  # "stage2.block1" -> 2, 1
        layer = f"encoder.stages.{s}.layers.{b}"
        for j in range(len(_convs(spec, width, size, stride))):
            names[f"{name}.conv{j + 1}.weight"] = f"{layer}.layer.{j}.convolution.weight"
            names.update({f"{name}.bn{j + 1}.{k}": f"{layer}.layer.{j}.normalization.{v}" for k, v in _NORM.items()})
        if _projects(width, size, stride):
            names[f"{name}.shortcut.weight"] = f"{layer}.shortcut.convolution.weight"
            names.update({f"{name}.shortcut_bn.{k}": f"{layer}.shortcut.normalization.{v}" for k, v in _NORM.items()})
    return names


def spec_from_config(config: dict) -> dict:
    """The spec from a ``ResNetConfig`` dict; ``hidden_act`` other than ``relu`` is refused."""
    _pretrained.refuse("resnet50", config, "hidden_act", "relu")
    _pretrained.refuse("resnet50", config, "layer_type", _BLOCKS)
    if config.get("num_labels") == 0 or config.get("id2label") == {}:
        raise ConfigurationError(
            message(
                "The zoo's 'resnet50' ends in a classifier",
                expected="num_labels >= 1",
                received="num_labels=0 (transformers' identity head: the pooled features)",
            )
        )
    spec: dict[str, Any] = {
        "image": [int(config.get("num_channels", 3)), *DEFAULTS["image"][1:]],
        "stem": int(config.get("embedding_size", DEFAULTS["stem"])),
        "widths": [int(v) for v in config.get("hidden_sizes", DEFAULTS["widths"])],
        "depths": [int(v) for v in config.get("depths", DEFAULTS["depths"])],
        "block": config.get("layer_type", "bottleneck"),
        "downsample_in_first_stage": bool(config.get("downsample_in_first_stage", False)),
        "downsample_in_bottleneck": bool(config.get("downsample_in_bottleneck", False)),
        "classes": _pretrained.classes(config),
    }
    check({**DEFAULTS, **spec})
    return spec


def params_from_transformers(tensors: dict[str, np.ndarray], spec: dict) -> dict[str, np.ndarray]:
    """Zoo arrays from a ``ResNetForImageClassification`` state dict (a ``ResNetModel``'s has no classifier)."""
    out = {key: _pretrained.take(tensors, name, prefixes=("resnet.", "")) for key, name in _names(spec).items()}
    out["out.weight"] = _pretrained.take(tensors, "classifier.1.weight").T  # nn.Linear stores (out, in)
    out["out.bias"] = _pretrained.take(tensors, "classifier.1.bias")
    return out


def to_transformers(params: dict[str, np.ndarray], spec: dict) -> tuple[dict, dict[str, np.ndarray]]:
    """A ``ResNetConfig`` dict and ``ResNetForImageClassification`` tensors for these weights.

    Batch norm's ``num_batches_tracked`` step counters are left out (transformers starts
    them at 0, and they change nothing under momentum 0.1)."""
    if spec["eps"] != DEFAULTS["eps"]:
        raise ConversionError(
            message(
                "transformers' ResNet has a fixed batch norm epsilon",
                expected=f"eps={DEFAULTS['eps']}",
                received=f"eps={spec['eps']}",
                fix="save a model built with the default eps",
            )
        )
    classes = spec["classes"]
    config = {
        "architectures": [TRANSFORMERS_CLASS],
        "model_type": MODEL_TYPE,
        "num_channels": spec["image"][0],
        "embedding_size": spec["stem"],
        "hidden_sizes": list(spec["widths"]),
        "depths": list(spec["depths"]),
        "layer_type": spec["block"],
        "hidden_act": "relu",
        "downsample_in_first_stage": spec["downsample_in_first_stage"],
        "downsample_in_bottleneck": spec["downsample_in_bottleneck"],
        "id2label": {str(i): f"LABEL_{i}" for i in range(classes)},
        "label2id": {f"LABEL_{i}": i for i in range(classes)},
    }
    tensors = {f"resnet.{name}": np.asarray(params[key], np.float32) for key, name in _names(spec).items()}
    tensors["classifier.1.weight"] = np.asarray(params["out.weight"], np.float32).T
    tensors["classifier.1.bias"] = np.asarray(params["out.bias"], np.float32)
    return config, tensors
