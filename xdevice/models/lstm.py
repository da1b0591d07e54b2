"""``lstm``: token embedding, one LSTM layer, and a dense classifier on the last hidden state."""

from __future__ import annotations

import numpy as np

from xdevice.models._fit import Fitting
from xdevice.models._init import Param, dense

DEFAULTS = {"vocab": 1000, "embedding": 64, "hidden": 128, "length": 32, "classes": 10}
HYPERPARAMETERS = {
    "vocab": "token ids run 0 <= id < vocab (the embedding's rows)",
    "embedding": "width of each token's embedding",
    "hidden": "the LSTM's hidden (and cell) state width",
    "length": "tokens per row of example_input (any length runs)",
    "classes": "outputs: one logit per class",
}
INPUT = "int[rows, tokens]: token ids, any number of tokens"
OUTPUT = "float[rows, classes]: logits from the last hidden state (no softmax)"


def parameters(spec: dict) -> dict[str, Param]:
    h, e = spec["hidden"], spec["embedding"]
    return {
        "embedding.weight": Param((spec["vocab"], e), "fan_in", 1),
        # PyTorch draws every LSTM weight from ±1/sqrt(hidden): fan_in = hidden
        "lstm.w_ih": Param((e, 4 * h), "fan_in", h),
        "lstm.w_hh": Param((h, 4 * h), "fan_in", h),
        "lstm.b": Param((4 * h,), "fan_in", h),
        **dense("out", h, spec["classes"]),
    }


def apply(ops, params, x, spec, train=False):
    embedded = ops.take(params["embedding.weight"], x, axis=0)
    # the batch from the input's own shape: a dynamic one while exporting (see Ops.shape)
    zeros = ops.zeros((ops.shape(x)[0], spec["hidden"]), ops.dtype(params["lstm.w_hh"]))
    _, h, _ = ops.lstm(embedded, zeros, zeros, params["lstm.w_ih"], params["lstm.w_hh"], params["lstm.b"])
    y = ops.linear(h, params["out.weight"], params["out.bias"])
    return (y, {}) if train else y


def fitting(spec: dict, row: tuple[int, ...]) -> Fitting | None:
    """Rows of token ids of any length."""
    return None if len(row) == 1 else Fitting()


def example_input(spec: dict, batch: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, spec["vocab"], size=(batch, spec["length"])).astype(np.int32)
