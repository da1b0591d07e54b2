"""``vit``: the Vision Transformer ViT-B/16 at 224x224, as transformers'
``ViTForImageClassification`` computes it; logits from the CLS token.

The image is cut into patches by a convolution of the patch's size and stride (16x16: 196
patches of a 224x224 image); a learned CLS token goes first and learned position
embeddings are added. Pre-norm encoder blocks follow (layer norm, multi-head attention
with biases on q, k and v, residual; layer norm, an exact (erf) GELU MLP, residual; layer
norm epsilon 1e-12), then a final layer norm and a linear classifier on the CLS token.
Attention goes through the op set's ``attention``, so each backend's fused kernel runs it.

The position embeddings are learned for one image size: images must have it (transformers'
``interpolate_pos_encoding`` is not computed). ``build("vit", weights=folder)`` reads a
transformers folder; ``hidden_act`` other than ``gelu`` and a ``head_dim`` that does not
split the width evenly are refused by name. The zoo trains without dropout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message
from xdevice.models import _pretrained, _remat
from xdevice.models._attention import fused_heads
from xdevice.models._fit import Fitting, check_heads, check_image, image_fitting
from xdevice.models._init import Param, conv, dense, norm

DEFAULTS: dict[str, Any] = {
    "image": [3, 224, 224],
    "patch": 16,
    "width": 768,
    "layers": 12,
    "heads": 12,
    "mlp": 3072,
    "classes": 1000,
    "qkv_bias": True,
    "eps": 1e-12,
    "remat": False,
}
SMALL: dict[str, Any] = {
    "image": [3, 32, 32],
    "patch": 8,
    "width": 32,
    "layers": 2,
    "heads": 2,
    "mlp": 64,
    "classes": 10,
}
HYPERPARAMETERS = {
    "image": "[channels, height, width]: the one image size the position embeddings are learned for",
    "patch": "side of the square patches (the patch convolution's kernel and stride)",
    "width": "the model width (patch embeddings, attention, residual stream)",
    "layers": "pre-norm encoder blocks",
    "heads": "attention heads; they split the width, which they must divide",
    "mlp": "hidden width of each block's GELU MLP",
    "classes": "outputs: one logit per class",
    "qkv_bias": "whether the query, key and value projections have biases",
    "eps": "layer norm's epsilon",
    "remat": "training recomputes each block's activations in the backward pass instead of keeping them",
}
INPUT = "float[rows, image[0], image[1], image[2]]: images, channels first (NCHW), of the configured size"
OUTPUT = "float[rows, classes]: logits from the CLS token (no softmax)"
INPUTS: tuple[str, ...] = ()
TRANSFORMERS_CLASS = "ViTForImageClassification"
MODEL_TYPE = "vit"


def check(spec: dict) -> None:
    check_image("vit", spec)
    _, height, width = spec["image"]
    if not 0 < spec["patch"] <= min(height, width):
        raise ConfigurationError(
            message(
                "ViT's patches must fit in the image",
                expected=f"1 <= patch <= {min(height, width)}",
                received=f"patch={spec['patch']}, image={spec['image']}",
            )
        )
    check_heads("ViT", spec)


def _patches(spec: dict) -> int:
    _, height, width = spec["image"]
    return (height // spec["patch"]) * (width // spec["patch"])


def parameters(spec: dict) -> dict[str, Param]:
    d = spec["width"]
    table = {
        **conv("patches", spec["image"][0], d, spec["patch"]),
        "cls.weight": Param((d,), "normal"),
        "positions.weight": Param((_patches(spec) + 1, d), "normal"),
    }
    for i in range(spec["layers"]):
        b = f"block{i}"
        table.update(norm(f"{b}.norm1", d))
        table.update(dense(f"{b}.attn.qkv", d, 3 * d, bias=spec["qkv_bias"]))
        table.update(dense(f"{b}.attn.out", d, d))
        table.update(norm(f"{b}.norm2", d))
        table.update(dense(f"{b}.mlp.fc1", d, spec["mlp"]))
        table.update(dense(f"{b}.mlp.fc2", spec["mlp"], d))
    table.update(norm("norm", d))
    table.update(dense("out", d, spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    d, heads, eps, patch = spec["width"], spec["heads"], spec["eps"], spec["patch"]
    size = tuple(ops.shape(x)[2:])
    if all(isinstance(v, int) for v in size) and list(size) != list(spec["image"][1:]):
        raise ConfigurationError(
            message(
                "ViT takes images of the size its position embeddings are learned for",
                expected=f"{spec['image'][1]}x{spec['image'][2]} images",
                received=f"{size[0]}x{size[1]}",
                fix=f"resize the images to {spec['image'][1]}x{spec['image'][2]}",
            )
        )
    p = _patches(spec)
    t = p + 1
    h = ops.conv(x, params["patches.weight"], params["patches.bias"], stride=patch)  # (N, d, H/patch, W/patch)
    h = ops.transpose(ops.reshape(h, (-1, d, p)), (0, 2, 1))
    # the CLS token goes in front as a zero row plus (CLS + its position): the same sums as
    # transformers' concatenation, with no array sized by the batch (which may be dynamic)
    cls = ops.pad(ops.reshape(params["cls.weight"], (1, d)), [(0, p), (0, 0)])
    h = ops.add(ops.pad(h, [(0, 0), (1, 0), (0, 0)]), ops.add(params["positions.weight"], cls))
    for i in range(spec["layers"]):
        b = f"block{i}"

        def run(h, params, b=b):
            y = ops.layer_norm(h, params[f"{b}.norm1.scale"], params[f"{b}.norm1.offset"], eps=eps)
            q, k, v = fused_heads(
                ops, y, params[f"{b}.attn.qkv.weight"], params.get(f"{b}.attn.qkv.bias"), t, heads, d // heads
            )
            attended = ops.reshape(ops.transpose(ops.attention(q, k, v), (0, 2, 1, 3)), (-1, t, d))
            h = ops.add(h, ops.linear(attended, params[f"{b}.attn.out.weight"], params[f"{b}.attn.out.bias"]))
            y = ops.layer_norm(h, params[f"{b}.norm2.scale"], params[f"{b}.norm2.offset"], eps=eps)
            y = ops.gelu(ops.linear(y, params[f"{b}.mlp.fc1.weight"], params[f"{b}.mlp.fc1.bias"]))
            return ops.add(h, ops.linear(y, params[f"{b}.mlp.fc2.weight"], params[f"{b}.mlp.fc2.bias"]))

        h = _remat.block(ops, run, h, params, f"{b}.", spec.get("remat", False) and train)
    # layer norm is per token: normalising the CLS token alone gives what the classifier reads
    first = ops.layer_norm(ops.take(h, 0, axis=1), params["norm.scale"], params["norm.offset"], eps=eps)
    y = ops.linear(first, params["out.weight"], params["out.bias"])
    return (y, {}) if train else y


def fitting(spec: dict, row: tuple[int, ...]) -> Fitting | None:
    """Images of the configured size only: the position embeddings are learned for it."""
    image = list(spec["image"])
    if list(row) == image:
        return None
    if len(row) == 3 and row[0] == image[0]:
        return Fitting(f"x resized to {image[1]}x{image[2]} (the size ViT's position embeddings are learned for)")
    return image_fitting(spec, row)


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(batch, *spec["image"])).astype(np.float32)


# -- transformers checkpoints -----------------------------------------------------------------


def _pair(value: Any, field: str) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        if len(value) != 2:
            raise ConfigurationError(message(f"ViT's {field} is one size or [height, width]", received=value))
        return int(value[0]), int(value[1])
    return int(value), int(value)


def spec_from_config(config: dict) -> dict:
    """The spec from a ``ViTConfig`` dict; fields that change the math and are not computed are refused."""
    _pretrained.refuse("vit", config, "hidden_act", "gelu")
    width, heads = int(config.get("hidden_size", 768)), int(config.get("num_attention_heads", 12))
    if heads and not width % heads:
        _pretrained.refuse("vit", config, "head_dim", width // heads)
    patch = _pair(config.get("patch_size", 16), "patch_size")
    if patch[0] != patch[1]:
        _pretrained.refuse("vit", config, "patch_size", (patch[0], [patch[0], patch[0]]))
    if config.get("num_labels") == 0 or config.get("id2label") == {}:
        raise ConfigurationError(
            message(
                "The zoo's 'vit' ends in a classifier",
                expected="num_labels >= 1",
                received="num_labels=0 (transformers' identity head: the CLS token's features)",
            )
        )
    spec: dict[str, Any] = {
        "image": [int(config.get("num_channels", 3)), *_pair(config.get("image_size", 224), "image_size")],
        "patch": patch[0],
        "width": width,
        "layers": int(config.get("num_hidden_layers", 12)),
        "heads": heads,
        "mlp": int(config.get("intermediate_size", 3072)),
        "classes": _pretrained.classes(config),
        "qkv_bias": bool(config.get("qkv_bias", True)),
        "eps": float(config.get("layer_norm_eps", 1e-12)),
    }
    check({**DEFAULTS, **spec})
    return spec


def _layer(i: int) -> dict[str, tuple[str, str]]:
    """A block's transformers names: ``save_pretrained``'s (ViT's original ones) and those of
    transformers 5's modules (``ViTModel.state_dict()``), which its loader maps to each other."""
    old, new = f"encoder.layer.{i}", f"layers.{i}"
    return {
        "norm1": (f"{old}.layernorm_before", f"{new}.layernorm_before"),
        "q": (f"{old}.attention.attention.query", f"{new}.attention.q_proj"),
        "k": (f"{old}.attention.attention.key", f"{new}.attention.k_proj"),
        "v": (f"{old}.attention.attention.value", f"{new}.attention.v_proj"),
        "attn.out": (f"{old}.attention.output.dense", f"{new}.attention.o_proj"),
        "norm2": (f"{old}.layernorm_after", f"{new}.layernorm_after"),
        "mlp.fc1": (f"{old}.intermediate.dense", f"{new}.mlp.fc1"),
        "mlp.fc2": (f"{old}.output.dense", f"{new}.mlp.fc2"),
    }


_PREFIXES = ("vit.", "")


def _take(tensors: dict[str, np.ndarray], names: tuple[str, ...], suffix: str) -> np.ndarray:
    """The first of ``names`` (+ ``suffix``) the checkpoint holds, under either prefix."""
    for name in names:
        if any(prefix + name + suffix in tensors for prefix in _PREFIXES):
            return _pretrained.take(tensors, name + suffix, prefixes=_PREFIXES)
    return _pretrained.take(tensors, names[0] + suffix, prefixes=_PREFIXES)  # raises, naming the first


def params_from_transformers(tensors: dict[str, np.ndarray], spec: dict) -> dict[str, np.ndarray]:
    """Zoo arrays from a ``ViTForImageClassification`` state dict: q, k and v side by side in
    ``qkv``, every ``nn.Linear`` weight transposed to (in, out), the CLS token and the position
    embeddings without their leading 1."""
    d = spec["width"]
    out = {
        "patches.weight": _take(tensors, ("embeddings.patch_embeddings.projection",), ".weight"),
        "patches.bias": _take(tensors, ("embeddings.patch_embeddings.projection",), ".bias"),
        "cls.weight": _take(tensors, ("embeddings.cls_token",), "").reshape(d),
        "positions.weight": _take(tensors, ("embeddings.position_embeddings",), "").reshape(-1, d),
        "norm.scale": _take(tensors, ("layernorm",), ".weight"),
        "norm.offset": _take(tensors, ("layernorm",), ".bias"),
        "out.weight": _pretrained.take(tensors, "classifier.weight").T,
        "out.bias": _pretrained.take(tensors, "classifier.bias"),
    }
    for i in range(spec["layers"]):
        b, names = f"block{i}", _layer(i)
        for key in ("norm1", "norm2"):
            out[f"{b}.{key}.scale"] = _take(tensors, names[key], ".weight")
            out[f"{b}.{key}.offset"] = _take(tensors, names[key], ".bias")
        for key in ("attn.out", "mlp.fc1", "mlp.fc2"):
            out[f"{b}.{key}.weight"] = _take(tensors, names[key], ".weight").T
            out[f"{b}.{key}.bias"] = _take(tensors, names[key], ".bias")
        out[f"{b}.attn.qkv.weight"] = np.concatenate([_take(tensors, names[p], ".weight").T for p in "qkv"], axis=1)
        if spec["qkv_bias"]:
            out[f"{b}.attn.qkv.bias"] = np.concatenate([_take(tensors, names[p], ".bias") for p in "qkv"])
    return out


def to_transformers(params: dict[str, np.ndarray], spec: dict) -> tuple[dict, dict[str, np.ndarray]]:
    """A ``ViTConfig`` dict and ``ViTForImageClassification`` tensors (the names
    ``save_pretrained`` writes) for these weights."""
    channels, height, width = spec["image"]
    classes, d = spec["classes"], spec["width"]
    config = {
        "architectures": [TRANSFORMERS_CLASS],
        "model_type": MODEL_TYPE,
        "hidden_size": d,
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "intermediate_size": spec["mlp"],
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": spec["eps"],
        "image_size": height if height == width else [height, width],
        "patch_size": spec["patch"],
        "num_channels": channels,
        "qkv_bias": spec["qkv_bias"],
        "id2label": {str(i): f"LABEL_{i}" for i in range(classes)},
        "label2id": {f"LABEL_{i}": i for i in range(classes)},
    }
    f32 = {key: np.asarray(value, np.float32) for key, value in params.items()}
    tensors = {
        "vit.embeddings.patch_embeddings.projection.weight": f32["patches.weight"],
        "vit.embeddings.patch_embeddings.projection.bias": f32["patches.bias"],
        "vit.embeddings.cls_token": f32["cls.weight"].reshape(1, 1, d),
        "vit.embeddings.position_embeddings": f32["positions.weight"][None],
        "vit.layernorm.weight": f32["norm.scale"],
        "vit.layernorm.bias": f32["norm.offset"],
        "classifier.weight": f32["out.weight"].T,
        "classifier.bias": f32["out.bias"],
    }
    for i in range(spec["layers"]):
        b, names = f"block{i}", {key: f"vit.{old}" for key, (old, _) in _layer(i).items()}
        for key in ("norm1", "norm2"):
            tensors[f"{names[key]}.weight"] = f32[f"{b}.{key}.scale"]
            tensors[f"{names[key]}.bias"] = f32[f"{b}.{key}.offset"]
        for key in ("attn.out", "mlp.fc1", "mlp.fc2"):
            tensors[f"{names[key]}.weight"] = f32[f"{b}.{key}.weight"].T
            tensors[f"{names[key]}.bias"] = f32[f"{b}.{key}.bias"]
        for part, weight in zip("qkv", np.split(f32[f"{b}.attn.qkv.weight"], 3, axis=1)):
            tensors[f"{names[part]}.weight"] = weight.T
        if spec["qkv_bias"]:
            for part, bias in zip("qkv", np.split(f32[f"{b}.attn.qkv.bias"], 3)):
                tensors[f"{names[part]}.bias"] = bias
    return config, tensors
