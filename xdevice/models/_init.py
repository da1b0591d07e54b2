"""Parameter tables and seeded numpy initialisation, shared by every zoo model, and the batch
norm that updates its running buffers (``resnet``, ``resnet50``).

A model lists its parameters as ``{name: Param}``, in a fixed order; initialising draws
them one after another from one ``numpy.random.Generator``, so a seed fixes every weight
on every backend. Initialisers follow PyTorch's defaults (Kaiming-uniform weights with
``a=sqrt(5)``, biases uniform in ``±1/sqrt(fan_in)``), so a zoo model trains like the
PyTorch network it mirrors.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

__all__ = ["Param", "initialise", "dense", "conv", "norm", "batch_norm"]


@dataclasses.dataclass(frozen=True)
class Param:
    """One named array: its shape, how to draw it, and whether training updates it by
    gradient (a *buffer*, such as batch norm's running mean, is updated by the forward pass)."""

    shape: tuple[int, ...]
    init: str  # "fan_in" (±1/sqrt(fan)), "zeros", "ones", "normal" (std 0.02)
    fan_in: int = 1
    trainable: bool = True


def initialise(table: dict[str, Param], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, param in table.items():
        if param.init == "zeros":
            value = np.zeros(param.shape)
        elif param.init == "ones":
            value = np.ones(param.shape)
        elif param.init == "normal":
            value = rng.normal(0.0, 0.02, param.shape)
        else:
            bound = 1.0 / math.sqrt(param.fan_in)
            value = rng.uniform(-bound, bound, param.shape)
        out[name] = value.astype(np.float32)
    return out


def dense(prefix: str, inputs: int, outputs: int, bias: bool = True) -> dict[str, Param]:
    """``{prefix}.weight`` (in, out) and ``{prefix}.bias`` (out,)."""
    table = {f"{prefix}.weight": Param((inputs, outputs), "fan_in", inputs)}
    if bias:
        table[f"{prefix}.bias"] = Param((outputs,), "fan_in", inputs)
    return table


def conv(prefix: str, inputs: int, outputs: int, kernel: int, bias: bool = True) -> dict[str, Param]:
    """``{prefix}.weight`` (O, I, k, k) and ``{prefix}.bias`` (O,)."""
    fan = inputs * kernel * kernel
    table = {f"{prefix}.weight": Param((outputs, inputs, kernel, kernel), "fan_in", fan)}
    if bias:
        table[f"{prefix}.bias"] = Param((outputs,), "fan_in", fan)
    return table


def norm(prefix: str, size: int, running: bool = False) -> dict[str, Param]:
    """``scale`` and ``offset``; with ``running``, batch norm's ``mean`` and ``var`` buffers."""
    table = {f"{prefix}.scale": Param((size,), "ones"), f"{prefix}.offset": Param((size,), "zeros")}
    if running:
        table[f"{prefix}.mean"] = Param((size,), "zeros", trainable=False)
        table[f"{prefix}.var"] = Param((size,), "ones", trainable=False)
    return table


def batch_norm(ops, params: dict, name: str, x, spec: dict, train: bool, updates: dict):
    """Batch norm ``name`` over NCHW ``x``: the running ``mean`` and ``var`` in inference; in
    training the batch's statistics, with the new running values put in ``updates`` (PyTorch's
    rule: momentum ``spec["momentum"]``, unbiased variance), not assigned in place."""
    p = {k: params[f"{name}.{k}"] for k in ("scale", "offset", "mean", "var")}
    if not train:
        return ops.batch_norm(x, p["scale"], p["offset"], p["mean"], p["var"], spec["eps"])
    y, mean, var = ops.batch_norm_train(x, p["scale"], p["offset"], spec["eps"])
    n = ops.shape(x)[0] * ops.shape(x)[2] * ops.shape(x)[3]
    m = spec["momentum"]
    updates[f"{name}.mean"] = ops.add(ops.multiply(p["mean"], 1 - m), ops.multiply(ops.stop_gradient(mean), m))
    unbiased = ops.multiply(ops.stop_gradient(var), n / (n - 1))
    updates[f"{name}.var"] = ops.add(ops.multiply(p["var"], 1 - m), ops.multiply(unbiased, m))
    return y
