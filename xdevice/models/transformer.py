"""``transformer``: token + position embeddings, pre-norm encoder blocks with multi-head
attention under a padding mask and a GELU MLP, a final layer norm, a masked mean over the
tokens, and a classifier. Token 0 is padding.
"""

from __future__ import annotations

import numpy as np

from xdevice.models._attention import fused_heads
from xdevice.models._fit import check_heads, token_fitting
from xdevice.models._init import Param, dense, norm

DEFAULTS = {"vocab": 1000, "length": 32, "width": 64, "heads": 4, "mlp": 128, "blocks": 2, "classes": 10, "eps": 1e-5}
HYPERPARAMETERS = {
    "vocab": "token ids run 0 <= id < vocab; 0 is padding",
    "length": "the most tokens per row (the position embedding's rows)",
    "width": "the model width (embeddings, attention, residual stream)",
    "heads": "attention heads; they split the width, which they must divide",
    "mlp": "hidden width of each block's GELU MLP",
    "blocks": "pre-norm encoder blocks",
    "classes": "outputs: one logit per class",
    "eps": "layer norm's epsilon",
}
INPUT = "int[rows, tokens]: token ids, at most length tokens, 0 for padding"
OUTPUT = "float[rows, classes]: logits from the masked mean over the tokens (no softmax)"


def check(spec: dict) -> None:
    check_heads("the transformer", spec)


def parameters(spec: dict) -> dict[str, Param]:
    d = spec["width"]
    table = {
        "tokens.weight": Param((spec["vocab"], d), "normal"),
        "positions.weight": Param((spec["length"], d), "normal"),
    }
    for i in range(spec["blocks"]):
        b = f"block{i}"
        table.update(norm(f"{b}.norm1", d))
        table.update(dense(f"{b}.attn.qkv", d, 3 * d))
        table.update(dense(f"{b}.attn.out", d, d))
        table.update(norm(f"{b}.norm2", d))
        table.update(dense(f"{b}.mlp.fc1", d, spec["mlp"]))
        table.update(dense(f"{b}.mlp.fc2", spec["mlp"], d))
    table.update(norm("norm", d))
    table.update(dense("out", d, spec["classes"]))
    return table


def apply(ops, params, x, spec, train=False):
    t = ops.shape(x)[1]  # the batch stays -1 in reshapes: it may only be known at run time
    d, heads, eps = spec["width"], spec["heads"], spec["eps"]
    keep = ops.not_equal(x, 0)  # (N, T): real tokens
    h = ops.add(ops.take(params["tokens.weight"], x, axis=0), ops.slice(params["positions.weight"], [0], [t], axes=[0]))
    mask = ops.reshape(keep, (-1, 1, 1, t))
    for i in range(spec["blocks"]):
        b = f"block{i}"
        y = ops.layer_norm(h, params[f"{b}.norm1.scale"], params[f"{b}.norm1.offset"], eps=eps)
        q, k, v = fused_heads(
            ops, y, params[f"{b}.attn.qkv.weight"], params[f"{b}.attn.qkv.bias"], t, heads, d // heads
        )
        attended = ops.reshape(ops.transpose(ops.attention(q, k, v, mask), (0, 2, 1, 3)), (-1, t, d))
        h = ops.add(h, ops.linear(attended, params[f"{b}.attn.out.weight"], params[f"{b}.attn.out.bias"]))
        y = ops.layer_norm(h, params[f"{b}.norm2.scale"], params[f"{b}.norm2.offset"], eps=eps)
        y = ops.gelu(ops.linear(y, params[f"{b}.mlp.fc1.weight"], params[f"{b}.mlp.fc1.bias"]))
        h = ops.add(h, ops.linear(y, params[f"{b}.mlp.fc2.weight"], params[f"{b}.mlp.fc2.bias"]))
    h = ops.layer_norm(h, params["norm.scale"], params["norm.offset"], eps=eps)
    weights = ops.cast(ops.expand_dims(keep, -1), ops.dtype(h))
    pooled = ops.divide(ops.sum(ops.multiply(h, weights), axis=1), ops.sum(weights, axis=1))
    y = ops.linear(pooled, params["out.weight"], params["out.bias"])
    return (y, {}) if train else y


fitting = token_fitting


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    """Token ids with trailing padding: every row keeps at least a quarter of its tokens."""
    ids = rng.integers(1, spec["vocab"], size=(batch, spec["length"]))
    lengths = rng.integers(spec["length"] // 4, spec["length"] + 1, size=batch)
    ids[np.arange(spec["length"])[None, :] >= lengths[:, None]] = 0
    return ids.astype(np.int32)
