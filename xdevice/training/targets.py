"""Targets and token ids checked once, in core, before the first step on every backend.

The frameworks disagree about bad targets: PyTorch raises ``IndexError`` for a label past
the last class, NumPy's indexing wraps -1 to the last class, JAX's gather clamps and trains
on garbage, TensorFlow fails deep inside a graph. So the trainer checks the values itself,
on the host, for every kind of model (zoo, imported, the frameworks' own), before any step
runs: ``(x, y)`` arrays whole when ``fit`` starts, an iterable's batches as they come (each
before it is placed). Each refusal names the offending values, how many rows hold them, and
the fix that fits the data.

- ``cross_entropy``: integer labels ``(N,)`` in ``0 <= y < classes``, ``classes`` the model's
  output width; ``(N, 1)`` is read as ``(N,)`` with a note; probabilities ``(N, classes)``
  (one-hot or soft labels, each row summing to 1) are taken as such (the soft-label loss);
  a model with one output is refused (``binary_cross_entropy`` is its loss).
- ``binary_cross_entropy``: 0/1 or probability targets, one per output (``(N,)`` or
  ``(N, 1)`` for one output).
- token ids (the zoo's ``lstm`` and ``transformer``): integers in ``0 <= id < vocab``.
- a framework's own model: float inputs in its parameters' dtype, as a zoo model's must be.

>>> import numpy as np
>>> rules = Rules("cross_entropy", outputs=3)
>>> rules.check(np.zeros((4, 2), "float32"), np.array([0, 1, 2, 1]))[1].tolist()
[0, 1, 2, 1]
>>> rules.check(np.zeros((4, 2), "float32"), np.array([0, 1, 3, 5]))  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
xdevice._errors.ConfigurationError: y holds class labels outside 0 <= y < 3 ... in 2 of 4 rows: [3, 5]. ...
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from xdevice._errors import ConfigurationError, message
from xdevice._tensors import to_host
from xdevice.models._fit import check_token_ids

__all__ = ["FLOATS", "Rules", "dtype_name"]

#: float dtype names an input may have
FLOATS = ("float16", "bfloat16", "float32", "float64")
_SHOWN = 8  # distinct offending values shown in a message


@dataclasses.dataclass
class Rules:
    """What the batches must hold for this model and loss.

    Attributes:
        loss: the loss's canonical name (None: your own function, whose targets are yours).
        outputs: the model's output width (None until known: a framework's own model learns
            it from one forward pass on the first batch); ``shape``: one row's output shape.
        vocab: the vocabulary size of a model that takes token ids.
        dtype: the parameters' float dtype, which float inputs must have (a framework's own
            model; a zoo model's input is checked with its shape).
        build: the zoo model's name, so that a fix can say ``models.build(name, classes=...)``.
    """

    loss: str | None
    outputs: int | None = None
    shape: tuple[int, ...] | None = None
    vocab: int | None = None
    dtype: str | None = None
    build: str | None = None
    noted: bool = dataclasses.field(default=False, repr=False)  # the (N, 1) note, once

    def __post_init__(self):
        if self.outputs is not None:
            self.set_outputs(self.shape if self.shape is not None else (self.outputs,))

    def set_outputs(self, shape: tuple[int, ...]) -> None:
        """One row's output shape (its last axis: the width); cross-entropy needs a width of
        two or more."""
        self.shape, self.outputs = tuple(shape), int(shape[-1]) if shape else 1
        if self.outputs == 1 and self.loss == "cross_entropy":
            raise ConfigurationError(
                message(
                    "cross_entropy needs one output per class, and this model has one output",
                    received="loss='cross_entropy'",
                    fix="loss='binary_cross_entropy' (alias 'bce') trains one output on 0/1 targets; or "
                    + (f"models.build({self.build!r}, classes=2)" if self.build else "give the model 2 outputs"),
                )
            )

    def check(self, x: Any, y: Any, name: str = "y") -> tuple[Any, Any]:
        """``(x, y)`` checked (:meth:`check_x`, :meth:`check_y`).

        Raises:
            ConfigurationError: what the model or the loss cannot take, with the values, count
                and fix.
        """
        self.check_x(x)
        return x, self.check_y(y, name)

    def check_y(self, y: Any, name: str = "y") -> Any:
        """``y`` as the loss reads it (``(N, 1)`` labels squeezed, integral floats as int64,
        integer probabilities as float32), or ``y`` itself when nothing changes."""
        if y is None or self.loss is None:
            return y
        values = to_host(y)
        if values.dtype.kind not in "biuf":
            raise ConfigurationError(
                message(
                    f"{name} holds {values.dtype.name} values, and {self.loss} takes numbers",
                    received=f"{name}[:3] = {values.reshape(-1)[:3].tolist()}",
                    fix=f"number the classes: classes, {name} = np.unique({name}, return_inverse=True)",
                )
            )
        if not np.isfinite(values).all():  # NaN or inf: no label, no probability
            bad = ~np.isfinite(values)
            raise ConfigurationError(
                message(
                    f"{name} holds NaN or inf in {_rows(bad)} of {len(values)} rows",
                    fix=f"drop those rows, or fill them: np.nan_to_num({name})",
                )
            )
        if self.loss == "cross_entropy":
            checked = self._labels(values, name)
        elif self.loss == "binary_cross_entropy":
            checked = self._binary(values, name)
        else:
            checked = self._regression(values, name)
        return y if checked is values else checked

    def check_x(self, x: Any) -> None:
        """x's dtype against the parameters' (a framework's own model) and its token ids
        against the vocabulary."""
        if self.dtype is not None and hasattr(x, "shape"):
            got = dtype_name(x)
            if got in FLOATS and got != self.dtype:
                raise ConfigurationError(
                    message(
                        "x does not have the dtype of the model's parameters",
                        expected=self.dtype,
                        received=f"{got}{list(x.shape)}",
                        fix=f"x.astype({self.dtype!r})",
                    )
                )
        if self.vocab is not None and hasattr(x, "shape"):
            self._tokens(to_host(x))

    # -- each loss's targets ------------------------------------------------------------

    def _labels(self, y: np.ndarray, name: str) -> np.ndarray:
        classes = self.outputs
        positions = tuple(self.shape[:-1]) if self.shape is not None else ()  # a language model's (tokens,)
        # one label per position: (rows, tokens) under (rows, tokens, vocab) logits
        per_position = bool(positions) and y.shape[1:] == positions
        if not per_position and y.ndim == 2 and y.shape[1] == 1:
            if not self.noted:
                self.noted = True
                warnings.warn(
                    f"{name} of shape {y.shape} read as class labels of shape ({len(y)},) ({name}[:, 0])",
                    UserWarning,
                    stacklevel=2,
                )
            y = y[:, 0]
        elif not per_position and y.ndim == 2 and y.shape[1] > 1 and (classes is None or y.shape[1] == classes):
            return self._probabilities(y, name)
        if y.ndim != 1 and not per_position:
            width = classes if classes is not None else "classes"
            raise ConfigurationError(
                message(
                    f"{name} does not have the shape of class labels",
                    expected=f"integer labels (rows,), or probabilities (rows, {width}) for {width} outputs",
                    received=f"{y.dtype.name}{list(y.shape)}",
                    fix=f"{name}.argmax(1) turns (rows, k) scores into labels"
                    if y.ndim == 2
                    else f"{name}.reshape(-1) if there is one label per row",
                )
            )
        if y.dtype.kind == "f":
            fractional = y != np.round(y)
            if fractional.any():
                raise ConfigurationError(
                    message(
                        f"{name} holds values that are not whole numbers in {_rows(fractional)} of {len(y)} rows: "
                        f"{_shown(y[fractional])}, and cross_entropy takes class labels",
                        fix="loss='mse' for a regression target, loss='binary_cross_entropy' for 0..1 targets "
                        f"of one output, or {name}.astype('int64') if these are classes",
                    )
                )
        if y.dtype.kind != "i" and y.dtype.kind != "u":
            y = y.astype(np.int64)
        low = y < 0
        bad = low | (y >= classes) if classes is not None else low
        if bad.any():
            top = int(y.max())
            raise ConfigurationError(
                message(
                    f"{name} holds class labels outside 0 <= {name} < {classes if classes is not None else 'classes'}"
                    + (f" (the model has {classes} outputs)" if classes is not None else "")
                    + f" in {_rows(bad)} of {len(y)} rows: {_shown(y[bad])}",
                    fix=self._label_fix(y, name, top, bool(low.any())),
                )
            )
        return y

    def _label_fix(self, y: np.ndarray, name: str, top: int, negative: bool) -> str:
        renumber = f"renumber them 0..k-1: classes, {name} = np.unique({name}, return_inverse=True)"
        if negative:
            return f"drop the rows whose label is negative (often 'no label'): keep = {name} >= 0; or {renumber}"
        if int(y.min()) == 1 and top == self.outputs:
            return f"{name} - 1: the labels count from 1"
        size = "vocab" if self.shape is not None and len(self.shape) > 1 else "classes"  # a language model's
        wider = f"models.build({self.build!r}, {size}={top + 1})" if self.build else f"a model with {top + 1} outputs"
        return f"{wider} for labels 0..{top}; or {renumber}"

    def _probabilities(self, y: np.ndarray, name: str) -> np.ndarray:
        outside = np.asarray(((y < 0) | (y > 1)).any(axis=1))
        if outside.any():
            raise ConfigurationError(
                message(
                    f"{name} of shape {list(y.shape)} is read as class probabilities (one-hot or soft labels), and "
                    f"{_rows(outside)} of {len(y)} rows hold values outside [0, 1]: {_shown(y[(y < 0) | (y > 1)])}",
                    fix=f"{name}.argmax(1) if these are scores (labels, one per row); softmax them if they are logits",
                )
            )
        sums = y.sum(axis=1, dtype=np.float64)
        off = np.asarray(np.abs(sums - 1) > 1e-3)
        if off.any():
            raise ConfigurationError(
                message(
                    f"{name} of shape {list(y.shape)} is read as class probabilities (one-hot or soft labels), and "
                    f"{_rows(off)} of {len(y)} rows do not sum to 1: sums {_shown(np.round(sums[off], 4))}",
                    fix=f"several labels per row: loss='binary_cross_entropy' (multi-label); one per row: "
                    f"{name}.argmax(1), or {name} / {name}.sum(1, keepdims=True)",
                )
            )
        return y.astype(np.float32) if y.dtype.kind != "f" else y

    def _binary(self, y: np.ndarray, name: str) -> np.ndarray:
        outputs = self.outputs
        one = outputs in (None, 1)
        fits = (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)) if one else (y.ndim == 2 and y.shape[1] == outputs)
        if not fits:
            labels = y.ndim == 1 and not one
            raise ConfigurationError(
                message(
                    f"binary_cross_entropy takes one target per output, and the model has {outputs or 1} output(s)",
                    expected="targets (rows,) or (rows, 1)" if one else f"targets (rows, {outputs})",
                    received=f"{name} {y.dtype.name}{list(y.shape)}",
                    fix=f"loss='cross_entropy' for one class of {outputs} per row"
                    if labels
                    else "a model with one output per target column",
                )
            )
        outside = (y < 0) | (y > 1)
        if outside.any():
            seen = set(np.unique(y).tolist())
            if seen <= {-1, 1}:
                fix = f"({name} > 0).astype('float32') turns -1/1 into 0/1"
            elif y.dtype.kind in "iu" and one:
                fix = (
                    f"loss='cross_entropy' with {int(y.max()) + 1} outputs for classes 0..{int(y.max())}, "
                    f"or ({name} == c).astype('float32') for class c against the rest"
                )
            else:
                fix = f"scale {name} into [0, 1]"
            raise ConfigurationError(
                message(
                    f"binary_cross_entropy takes 0/1 or probability targets, and {name} holds values outside [0, 1] "
                    f"in {_rows(outside)} of {len(y)} rows: {_shown(y[outside])}",
                    fix=fix,
                )
            )
        return y.astype(np.float32) if y.dtype.kind != "f" else y

    def _regression(self, y: np.ndarray, name: str) -> np.ndarray:
        """Targets of the outputs' shape (a trailing axis of 1 on either side is allowed: ``(N,)``
        meets ``(N, 1)``); broadcasting ``(N, 1)`` against ``(N,)`` would compare every row
        with every other."""
        shape, row = self.shape, tuple(y.shape[1:])
        if shape is None or row in (shape, (*shape, 1)) or (*row, 1) == shape:
            return y
        size = int(np.prod(shape))
        raise ConfigurationError(
            message(
                f"{name} does not have the shape of the model's outputs, which {self.loss} compares element by element",
                expected=f"(rows, {', '.join(map(str, shape))})" if shape else "(rows,)",
                received=f"{y.dtype.name}{list(y.shape)}",
                fix=f"{name}.reshape(len({name}), {', '.join(map(str, shape))})"
                if int(np.prod(row)) == size and shape
                else f"a model with {int(np.prod(row))} output(s), one per target column",
            )
        )

    def _tokens(self, ids: np.ndarray) -> None:
        if self.vocab is not None:
            check_token_ids(ids, self.vocab, self.build)


def dtype_name(x: Any) -> str:
    """The dtype name of any framework's array (``torch.float64`` -> ``"float64"``)."""
    dtype = getattr(x, "dtype", None)
    return str(getattr(dtype, "name", None) or str(dtype).rsplit(".", 1)[-1])


def _rows(bad: np.ndarray) -> int:
    """How many rows hold at least one offending value."""
    return int(bad.reshape(len(bad), -1).any(axis=1).sum()) if bad.ndim > 1 else int(bad.sum())


def _shown(values: np.ndarray) -> str:
    distinct = np.unique(values).tolist()
    more = f", ... ({len(distinct)} distinct)" if len(distinct) > _SHOWN else ""
    return f"[{', '.join(str(v) for v in distinct[:_SHOWN])}{more}]"
