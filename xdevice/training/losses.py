"""Losses and metrics written once over the op set, so every backend computes the same thing.

A loss is ``loss(ops, outputs, targets) -> scalar``; a metric has the same shape. Names
(``"cross_entropy"``, ``"mse"``, ``"accuracy"``) or your own callables are accepted.

>>> from xdevice import backend
>>> ops = backend("numpy").ops
>>> float(mse(ops, ops.asarray([[1.0, 2.0]]), ops.asarray([[1.0, 4.0]])))
2.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["LOSSES", "METRICS", "accuracy", "cross_entropy", "loss_function", "metric_function", "mse"]


def cross_entropy(ops: Any, logits: Any, labels: Any) -> Any:
    """Mean negative log-likelihood of integer ``labels`` (N,) under ``logits`` (N, classes)."""
    return ops.cross_entropy(logits, labels)


def mse(ops: Any, outputs: Any, targets: Any) -> Any:
    """Mean squared error over every element."""
    return ops.mean(ops.square(ops.subtract(outputs, ops.cast(targets, ops.dtype(outputs)))))


def accuracy(ops: Any, logits: Any, labels: Any) -> Any:
    """The fraction of rows whose largest logit is at the integer label."""
    predicted = ops.argmax(logits, axis=-1)
    hits = ops.equal(ops.cast(predicted, "int32"), ops.cast(labels, "int32"))
    return ops.mean(ops.cast(hits, "float32"))


LOSSES: dict[str, Callable] = {"cross_entropy": cross_entropy, "mse": mse}
METRICS: dict[str, Callable] = {"accuracy": accuracy}


def loss_function(loss: str | Callable) -> Callable:
    """``loss`` as a callable ``(ops, outputs, targets) -> scalar``."""
    return _lookup(loss, LOSSES, "loss")


def metric_function(metric: str | Callable) -> Callable:
    """``metric`` as a callable ``(ops, outputs, targets) -> scalar``."""
    return _lookup(metric, METRICS, "metric")


def _lookup(value: str | Callable, table: dict[str, Callable], what: str) -> Callable:
    if callable(value):
        return value
    if value not in table:
        raise ConfigurationError(
            message(
                f"Unknown {what}",
                received=value,
                choices=sorted(table),
                fix="pass one of these names, or a function (ops, outputs, targets)",
            )
        )
    return table[value]
