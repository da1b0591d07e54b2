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
from collections.abc import Iterator

import numpy as np

__all__ = ["Param", "initialise", "drawn", "dense", "conv", "norm", "batch_norm"]


@dataclasses.dataclass(frozen=True)
class Param:
    """One named array: its shape, how to draw it, and whether training updates it by
    gradient (a *buffer*, such as batch norm's running mean, is updated by the forward pass)."""

    shape: tuple[int, ...]
    init: str  # "fan_in" (±1/sqrt(fan)), "zeros", "ones", "normal" (std 0.02)
    fan_in: int = 1
    trainable: bool = True


def initialise(table: dict[str, Param], seed: int) -> dict[str, np.ndarray]:
    """Every array of ``table``, drawn from ``seed`` (:func:`drawn`'s, in one dict)."""
    return dict(drawn(table, seed))


#: how many values a draw makes at once (32 MB of float64): a large array is drawn in runs of
#: its rows, each cast to float32 as it comes, not whole in float64 first (llama's embedding,
#: 128,256 x 2,048, would take 2.1 GB for that alone)
_RUN = 1 << 22


def drawn(table: dict[str, Param], seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, float32 array)`` for every array of ``table``, in order, drawn one after another
    from one ``numpy.random.default_rng(seed)``: a caller that takes each as it comes (placing it
    on a device) never holds them all in numpy. A large array is drawn in runs of rows; numpy's
    ``Generator`` gives the same values drawn in runs as at once (uniform and normal alike), so
    the weights are the same as one draw of each array would give.

    >>> a, b = (dict(drawn({"w": Param((3, 2), "normal")}, 0)) for _ in range(2))
    >>> a["w"].dtype, bool((a["w"] == b["w"]).all())
    (dtype('float32'), True)
    """
    rng = np.random.default_rng(seed)
    for name, param in table.items():
        yield name, _draw(rng, param)


def _draw(rng: np.random.Generator, param: Param) -> np.ndarray:
    if param.init == "zeros":
        return np.zeros(param.shape, np.float32)
    if param.init == "ones":
        return np.ones(param.shape, np.float32)
    shape = param.shape
    row = math.prod(shape[1:])
    if len(shape) < 2 or shape[0] * row <= _RUN:
        return _values(rng, param, shape).astype(np.float32)
    out = np.empty(shape, np.float32)
    step = max(_RUN // max(row, 1), 1)
    for start in range(0, shape[0], step):
        stop = min(start + step, shape[0])
        out[start:stop] = _values(rng, param, (stop - start, *shape[1:]))
    return out


def _values(rng: np.random.Generator, param: Param, shape: tuple[int, ...]) -> np.ndarray:
    """The next ``shape`` values of ``param``'s distribution (float64, as numpy draws them)."""
    if param.init == "normal":
        return rng.normal(0.0, 0.02, shape)
    bound = 1.0 / math.sqrt(param.fan_in)
    return rng.uniform(-bound, bound, shape)


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
