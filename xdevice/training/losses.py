"""Losses and metrics written once over the op set, so every backend computes the same thing.

A loss is ``loss(ops, outputs, targets) -> scalar``; a metric has the same shape. Names or
your own callables are accepted:

- ``"cross_entropy"``: one output per class; integer labels ``(N,)``, or probabilities
  ``(N, classes)`` (one-hot or soft labels: the soft-label cross-entropy); a language model's
  ``(N, T, vocab)`` logits take one label per position, ``(N, T)``;
- ``"binary_cross_entropy"`` (``"bce"``): one output, a logit; 0/1 or probability targets
  (several outputs with one target column each: multi-label);
- ``"mse"``: mean squared error, for regression.

Keras's names (``"sparse_categorical_crossentropy"``, ``"binary_crossentropy"``,
``"mean_squared_error"``...) are accepted as aliases. ``"accuracy"`` follows the loss: the
largest logit against the label for cross-entropy, ``logit > 0`` against ``target > 0.5``
for binary cross-entropy; a regression loss has none. The targets themselves are checked
before training by :mod:`xdevice.training.targets`.

>>> from xdevice import backend
>>> ops = backend("numpy").ops
>>> float(mse(ops, ops.asarray([[1.0, 2.0]]), ops.asarray([[1.0, 4.0]])))
2.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = [
    "ALIASES",
    "CLASSIFICATION",
    "LOSSES",
    "METRICS",
    "accuracy",
    "binary_accuracy",
    "binary_cross_entropy",
    "cross_entropy",
    "default_metrics",
    "loss_function",
    "loss_name",
    "metric_function",
    "mse",
]


def cross_entropy(ops: Any, logits: Any, targets: Any) -> Any:
    """Mean negative log-likelihood of integer labels ``(N,)`` under ``logits`` ``(N, classes)``
    (or one label per position, ``(N, T)`` under ``(N, T, classes)``: a language model's);
    targets of the logits' rank are probabilities (one-hot or soft labels), and the loss is
    ``-sum(targets * log_softmax(logits))`` averaged over rows."""
    rank = len(ops.shape(logits))
    if len(ops.shape(targets)) != rank:
        if rank > 2:  # a label per position, (N, T) under (N, T, classes): every position counts once
            width = ops.shape(logits)[-1]
            return ops.cross_entropy(ops.reshape(logits, (-1, width)), ops.reshape(targets, (-1,)))
        return ops.cross_entropy(logits, targets)
    log_p = ops.log_softmax(logits, axis=-1)
    return ops.negative(ops.mean(ops.sum(ops.multiply(ops.cast(targets, ops.dtype(log_p)), log_p), axis=-1)))


def binary_cross_entropy(ops: Any, logits: Any, targets: Any) -> Any:
    """Mean binary cross-entropy of 0/1 or probability ``targets`` under ``logits`` (one output
    per target: ``(N,)`` or ``(N, 1)``, targets either way), computed from the logits without
    overflow: ``max(z, 0) - z * y + log(1 + exp(-|z|))`` (``BCEWithLogitsLoss``'s form)."""
    targets = _like(ops, targets, logits)
    return ops.mean(
        ops.add(
            ops.subtract(ops.relu(logits), ops.multiply(logits, targets)),
            ops.log(ops.add(1.0, ops.exp(ops.negative(ops.abs(logits))))),
        )
    )


def mse(ops: Any, outputs: Any, targets: Any) -> Any:
    """Mean squared error over every element (targets ``(N,)`` meet outputs ``(N, 1)``, not
    broadcast into ``(N, N)``)."""
    return ops.mean(ops.square(ops.subtract(outputs, _like(ops, targets, outputs))))


def accuracy(ops: Any, logits: Any, labels: Any) -> Any:
    """The fraction of rows whose largest logit is at the integer label (for probability
    targets: at their largest probability)."""
    if len(ops.shape(labels)) == len(ops.shape(logits)):
        labels = ops.argmax(labels, axis=-1)
    predicted = ops.argmax(logits, axis=-1)
    hits = ops.equal(ops.cast(predicted, "int32"), ops.cast(labels, "int32"))
    return ops.mean(ops.cast(hits, "float32"))


def binary_accuracy(ops: Any, logits: Any, targets: Any) -> Any:
    """The fraction of targets on the side of 0.5 that their logit is on 0 (``sigmoid > 0.5``)."""
    hits = ops.equal(ops.greater(logits, 0.0), ops.greater(_like(ops, targets, logits), 0.5))
    return ops.mean(ops.cast(hits, "float32"))


def _like(ops: Any, targets: Any, outputs: Any) -> Any:
    """``targets`` in the outputs' dtype and rank: ``(N,)`` and ``(N, 1)`` meet either way."""
    targets = ops.cast(targets, ops.dtype(outputs))
    rank, want = len(ops.shape(targets)), len(ops.shape(outputs))
    if rank == want - 1:
        return ops.expand_dims(targets, -1)
    if rank == want + 1:
        return ops.squeeze(targets, -1)
    return targets


LOSSES: dict[str, Callable] = {
    "cross_entropy": cross_entropy,
    "binary_cross_entropy": binary_cross_entropy,
    "mse": mse,
}
#: other names people type for them (Keras's among them)
ALIASES = {
    "bce": "binary_cross_entropy",
    "binary_crossentropy": "binary_cross_entropy",
    "sparse_categorical_crossentropy": "cross_entropy",
    "categorical_crossentropy": "cross_entropy",
    "mean_squared_error": "mse",
}
#: the classification losses, and the accuracy that goes with each
CLASSIFICATION: dict[str, Callable] = {"cross_entropy": accuracy, "binary_cross_entropy": binary_accuracy}
METRICS: dict[str, Callable] = {"accuracy": accuracy, "binary_accuracy": binary_accuracy}


def loss_name(loss: str | Callable) -> str | None:
    """The canonical name of a named loss (aliases resolved), None for a callable.

    >>> loss_name("bce")
    'binary_cross_entropy'
    """
    if callable(loss):
        return None
    _lookup(loss, LOSSES, "loss")  # an unknown name is refused here, with the choices
    return ALIASES.get(loss, loss)


def loss_function(loss: str | Callable) -> Callable:
    """``loss`` as a callable ``(ops, outputs, targets) -> scalar``."""
    return _lookup(loss, LOSSES, "loss")


def default_metrics(loss: str | Callable) -> tuple[str, ...]:
    """The metrics reported when none are asked for: accuracy for a classification loss,
    nothing for a regression loss or your own function."""
    return ("accuracy",) if loss_name(loss) in CLASSIFICATION else ()


def metric_function(metric: str | Callable, loss: str | Callable | None = None) -> Callable:
    """``metric`` as a callable ``(ops, outputs, targets) -> scalar``; ``"accuracy"`` is the
    one that goes with ``loss`` (binary for binary cross-entropy). A regression loss has no
    accuracy: asking for one is refused."""
    name = None if loss is None else loss_name(loss)
    if metric == "accuracy" and name is not None:
        if name not in CLASSIFICATION:
            raise ConfigurationError(
                message(
                    f"accuracy compares predicted classes with labels, and loss={name!r} is a regression loss",
                    received="metrics=['accuracy']",
                    fix="leave metrics out, or use loss='cross_entropy' (class labels) or "
                    "loss='binary_cross_entropy' (0/1 targets)",
                )
            )
        return CLASSIFICATION[name]
    return _lookup(metric, METRICS, "metric")


def _lookup(value: str | Callable, table: dict[str, Callable], what: str) -> Callable:
    if callable(value):
        return value
    if table is LOSSES and isinstance(value, str):
        value = ALIASES.get(value, value)
    if not isinstance(value, str) or value not in table:
        raise ConfigurationError(
            message(
                f"Unknown {what}",
                received=value,
                choices=sorted(table) + (sorted(ALIASES) if table is LOSSES else []),
                fix="pass one of these names, or a function (ops, outputs, targets)",
            )
        )
    return table[value]
