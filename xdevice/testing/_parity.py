"""Parity: the same model or function on every backend, measured against numpy in float64.

The reference is the numpy backend run in float64 (its gradients from the numpy tape,
itself checked against finite differences); each backend runs in the dtype under test and
is held to that dtype's row of the tolerance table (``xdevice._tolerance``). Nothing is
compared with itself.

For a zoo model, parity checks the output in inference mode; in training mode the output
and the updated buffers (batch-norm statistics); and with ``grads=True`` the gradient of
a cross-entropy loss in training mode with respect to every trainable parameter.

Gradients jump at kinks: a ReLU input at 0, a tie in a max. An input that close to a kink
can fall on the other side in another framework's float32 rounding and legitimately change
a gradient by a discrete amount. So the numpy reference measures how close the inputs come
(relative to their scale); ``parity`` draws example inputs that stay ``KINK_MARGIN`` clear,
and when given inputs do not, failing gradient rows say so.

Parity states the float32 matmul precision it ran under (``xdevice.configure(matmul_precision=...)``,
``"highest"`` by default) and what each framework reports. TF32 and bfloat16 products are off
by about 1e-3 relative, so a check whose tolerance is tighter (float32's, 1e-4) under "high" or
"medium" would fail for the precision, not for a defect: it runs under "highest" instead, for
the check only, and the report says so.

Parity runs on the CPU, whatever the machine has: each backend computes inside its framework's
cpu:0 scope (``Backend.default_device``), since JAX and TensorFlow would otherwise compute on
GPU 0, TensorFlow even on CPU tensors.

Parity runs the zoo, so it lives in ``xdevice.testing``, the layer above ``xdevice.models``
(the floor, ``xdevice/_*.py``, imports nothing above it). It reaches each framework only
through the ``Backend`` contract: ``ops``, ``value_and_grad``, ``kink_margin`` and ``default_device``. It is
re-exported as ``xdevice.testing.parity`` and ``xdevice.parity``; the module is private so
that the function, not the module, answers to ``xdevice.testing.parity``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from xdevice import _configure, _registry
from xdevice._device import Device
from xdevice._errors import ParityError, message
from xdevice._tolerance import TOLERANCES, compare

if TYPE_CHECKING:
    from xdevice.models import Model

__all__ = ["ParityRow", "ParityReport", "parity", "assert_parity", "compare_tensors", "KINK_MARGIN"]

#: Closest relative approach to a kink that float32 rounding (about 1e-7 relative per
#: operation, compounding over a network) cannot cross.
KINK_MARGIN = 1e-6
_DRAWS = 32
#: The relative error TF32 and bfloat16 products reach (TF32 keeps 10 bits of mantissa): a
#: tolerance below it is checked under "highest".
REDUCED_PRECISION_RTOL = 1e-3


@dataclasses.dataclass(frozen=True)
class ParityRow:
    """One tensor of one backend against the reference."""

    subject: str
    backend: str
    tensor: str
    max_abs: float
    max_rel: float
    worst_index: tuple[int, ...]
    actual: float
    expected: float
    ok: bool
    note: str = ""

    def describe(self) -> str:
        return (
            f"{self.subject}: backend {self.backend!r}, tensor {self.tensor!r}: worst at index "
            f"{self.worst_index}: {self.actual!r} vs reference {self.expected!r} "
            f"(max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g})" + (f"; {self.note}" if self.note else "")
        )


class ParityReport(list[ParityRow]):
    """Rows of a parity run; ``ok`` when every row is within tolerance."""

    def __init__(
        self,
        rows: Iterable[ParityRow] = (),
        dtype: str = "float32",
        precision: str | None = None,
        precision_note: str = "",
        precisions: dict[str, object] | None = None,
    ) -> None:
        super().__init__(rows)
        self.dtype = dtype
        #: the float32 matmul precision the check ran under, and why if it is not the configured one
        self.precision = precision or _configure.matmul_precision()
        self.precision_note = precision_note
        #: per backend, the precision its framework reported (``Backend.numerics``)
        self.precisions: dict[str, object] = dict(precisions or {})

    # list's __add__ returns a plain list, this += the report itself (keeping its precision)
    def __iadd__(self, rows: Iterable[ParityRow]) -> ParityReport:  # type: ignore[override,misc]  # see above
        super().__iadd__(rows)
        if isinstance(rows, ParityReport):
            self.precision = rows.precision
            self.precision_note = rows.precision_note or self.precision_note
            self.precisions.update(rows.precisions)
        return self

    def precision_line(self) -> str:
        """``matmul precision highest (torch highest, jax highest, ...)``, with the note if any."""
        line = f"matmul precision {self.precision}"
        if self.precisions:
            line += " (" + ", ".join(f"{name} {value}" for name, value in self.precisions.items()) + ")"
        return line + (f"; {self.precision_note}" if self.precision_note else "")

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self)

    @property
    def violations(self) -> list[ParityRow]:
        return [row for row in self if not row.ok]

    def raise_for_violations(self) -> None:
        if self.violations:
            worst = max(self.violations, key=lambda r: r.max_abs)
            rtol, atol = TOLERANCES[self.dtype]
            raise ParityError(
                message(
                    f"{len(self.violations)} tensor(s) differ from the numpy reference beyond the {self.dtype} "
                    f"tolerance (|a - e| <= {atol:g} + {rtol:g} * |e|), under {self.precision_line()}",
                    received=worst.describe(),
                )
            )

    def summary(self) -> list[tuple[str, str, int, float, float, bool]]:
        """One line per (subject, backend): tensors checked, worst abs and rel error, ok."""
        groups: dict[tuple[str, str], list[ParityRow]] = {}
        for row in self:
            groups.setdefault((row.subject, row.backend), []).append(row)
        return [
            (s, b, len(rows), max(r.max_abs for r in rows), max(r.max_rel for r in rows), all(r.ok for r in rows))
            for (s, b), rows in groups.items()
        ]

    def __str__(self) -> str:
        rtol, atol = TOLERANCES[self.dtype]
        lines = [
            f"parity against numpy float64, {self.dtype} tolerance |a-e| <= {atol:g} + {rtol:g}*|e|",
            self.precision_line(),
            f"{'model':<12} {'backend':<11} {'tensors':>7} {'max abs':>10} {'max rel':>10}  ok",
        ]
        for subject, backend, count, worst_abs, worst_rel, ok in self.summary():
            lines.append(
                f"{subject:<12} {backend:<11} {count:>7} {worst_abs:>10.2e} {worst_rel:>10.2e}  {'yes' if ok else 'NO'}"
            )
        lines += [f"  violation: {row.describe()}" for row in self.violations[:10]]
        return "\n".join(lines)

    def to_markdown(self) -> str:
        lines = ["| model | backend | tensors | max abs | max rel | ok |", "|---|---|---:|---:|---:|---|"]
        for subject, backend, count, worst_abs, worst_rel, ok in self.summary():
            lines.append(
                f"| {subject} | {backend} | {count} | {worst_abs:.2e} | {worst_rel:.2e} | {'yes' if ok else '**no**'} |"
            )
        return "\n".join([*lines, "", self.precision_line()])

    def to_json(self) -> str:
        return json.dumps(
            {
                "dtype": self.dtype,
                "ok": self.ok,
                "matmul_precision": self.precision,
                "precision_note": self.precision_note,
                "precisions": self.precisions,
                "rows": [dataclasses.asdict(r) for r in self],
            },
            indent=2,
            default=str,
        )


def compare_tensors(
    subject: str, backend: str, actual: dict[str, Any], expected: dict[str, Any], dtype: str
) -> list[ParityRow]:
    """Rows for every tensor in ``expected``; a missing or misshapen tensor fails."""
    rows = []
    for name, want in expected.items():
        got = actual.get(name)
        result = compare(got, want, dtype) if got is not None else None
        if result is None:
            rows.append(
                ParityRow(subject, backend, name, float("inf"), float("inf"), (), float("nan"), float("nan"), False)
            )
        else:
            rows.append(
                ParityRow(
                    subject,
                    backend,
                    name,
                    result.max_abs,
                    result.max_rel,
                    result.worst_index,
                    result.actual,
                    result.expected,
                    result.ok,
                )
            )
    return rows


def parity(
    model: Any = "mlp",
    backends: Sequence[str] | None = None,
    inputs: Any = None,
    grads: bool | None = None,
    dtype: str = "float32",
    seed: int = 0,
    batch: int = 4,
) -> ParityReport:
    """Run a zoo model on each backend and compare with the numpy float64 reference.

    Args:
        model: a zoo name or a ``Model`` (its weights are used).
        backends: backends to check (default: every installed one, numpy included).
        inputs: a numpy batch (default: ``model.example_input(batch, seed)``).
        grads: also compare the gradient of a training loss for every trainable parameter.
            Default: yes in float32, no in half precision, where a backward pass run entirely
            in float16/bfloat16 loses most of its digits in every framework (measured: the
            bfloat16 ResNet's gradients are 2e-1 off normwise on torch, JAX and TF alike);
            training in half precision keeps float32 master weights instead.
        dtype: the float dtype the backends run in (``float32``, ``float16``, ``bfloat16``).

    Returns:
        A :class:`ParityReport`; ``report.ok`` says whether every tensor is within tolerance.

    >>> parity("mlp", backends=["numpy"], grads=False).ok
    True
    """
    import numpy as np

    from xdevice import models  # not at import: the pytest plugin loads this package in every session

    if isinstance(model, str):
        model = models.build(model, seed=seed)
    if grads is None:
        grads = dtype not in ("float16", "bfloat16")
    names = list(backends) if backends is not None else _registry.backends()
    reference = model.to("numpy", dtype="float64")
    if inputs is None:
        x, margin = _clear_example(reference, batch, seed)
    else:
        x = np.asarray(inputs)
        margin = _kink_margin(reference, x)
    note = (
        ""
        if margin > KINK_MARGIN
        else (
            f"the reference input comes within {margin:.1e} (relative) of a kink (ReLU at 0, a tie in a max), "
            "where float32 rounding may legitimately flip a gradient: try other inputs"
        )
    )
    # one label per output row: (rows,) for a classifier, (rows, tokens) for a language model
    shape = np.shape(reference(x))
    labels = np.random.default_rng(seed + 1).integers(0, shape[-1], size=shape[:-1])
    expected = _zoo_tensors(reference, x, labels, grads)
    with _checked_precision(dtype, names) as report:
        for name in names:
            with _on_cpu(name):
                actual = _zoo_tensors(model.to(name, device="cpu", dtype=dtype), x, labels, grads)
            rows = compare_tensors(model.name, name, actual, expected, dtype)
            report += [
                dataclasses.replace(r, note=note) if note and not r.ok and r.tensor.startswith("grad ") else r
                for r in rows
            ]
    return report


def _on_cpu(name: str) -> contextlib.AbstractContextManager[Any]:
    """The scope in which backend ``name`` computes on cpu:0 (without it JAX and TensorFlow
    compute on GPU 0 when there is one, TensorFlow even on CPU tensors)."""
    return _registry.backend(name).default_device(Device("cpu", 0))


@contextlib.contextmanager
def _checked_precision(dtype: str, names: Sequence[str]) -> Iterator[ParityReport]:
    """An empty report for a check on ``names`` in ``dtype``, run under a precision that can
    meet the dtype's tolerance: "highest" for the check when the configured one cannot (then
    restored), said in the report."""
    configured = _configure.matmul_precision()
    rtol = TOLERANCES.get(dtype, TOLERANCES["float32"])[0]
    switch = configured != "highest" and rtol < REDUCED_PRECISION_RTOL
    note = ""
    if switch:
        note = (
            f"switched from {configured!r} to 'highest' for this check: {configured!r} products are off by about "
            f"{REDUCED_PRECISION_RTOL:g} relative, beyond the {dtype} tolerance ({rtol:g})"
        )
        _configure.configure(matmul_precision="highest")
    try:
        report = ParityReport(dtype=dtype, precision=_configure.matmul_precision(), precision_note=note)
        report.precisions = {name: _registry.backend(name).numerics().get("matmul_precision") for name in names}
        yield report
    finally:
        if switch:
            _configure.configure(matmul_precision=configured)


def _kink_margin(reference: Model, x: Any) -> float:
    with _registry.backend("numpy").kink_margin() as found:  # the reference's own instrument
        reference(x, train=True)
    return min(found, default=float("inf"))


def _clear_example(reference: Model, batch: int, seed: int) -> tuple[Any, float]:
    """The first example batch from ``seed`` on whose kinks float32 cannot flip a gradient."""
    margin = 0.0
    for draw in range(seed, seed + _DRAWS):
        x = reference.example_input(batch, draw)
        margin = _kink_margin(reference, x)
        if margin > KINK_MARGIN:
            break
    return x, margin


def _zoo_tensors(model: Model, x: Any, labels: Any, grads: bool) -> dict[str, Any]:
    """Everything parity compares for one model on one backend, as numpy arrays."""
    backend = _registry.backend(model.backend)
    ops = backend.ops
    dtype = ops.dtype(model.params[model.trainable[0]])
    from xdevice.backends.opset import numpy_dtype  # the op set's module is large: not at import

    inputs = ops.asarray(x.astype(numpy_dtype(dtype)) if x.dtype.kind == "f" else x)
    out = {"output": ops.to_numpy(model.apply(ops, model.params, inputs, train=False))}
    if model.buffers:
        y, updates = model.apply(ops, model.params, inputs, train=True)
        out["output (train)"] = ops.to_numpy(y)
        out.update({f"{k} (updated)": ops.to_numpy(v) for k, v in updates.items()})
    if grads:
        fixed = {k: v for k, v in model.params.items() if k not in model.trainable}
        target = ops.asarray(labels)

        def loss(trainable: dict[str, Any]) -> Any:
            logits, _ = model.apply(ops, {**fixed, **trainable}, inputs, train=True)
            width = ops.shape(logits)[-1]
            return ops.cross_entropy(ops.reshape(logits, (-1, width)), ops.reshape(target, (-1,)))

        value, gradients = backend.value_and_grad(loss, {k: model.params[k] for k in model.trainable})
        out["loss"] = ops.to_numpy(value)
        out.update({f"grad {k}": ops.to_numpy(g) for k, g in gradients.items()})
    return out


def assert_parity(
    fn: Callable[..., Any],
    inputs: Sequence[Any],
    backends: Sequence[str] | None = None,
    dtype: str = "float32",
    subject: str | None = None,
) -> ParityReport:
    """Assert that ``fn(ops, *inputs)`` agrees on every backend with the numpy reference.

    ``fn`` is written once against the op set; ``inputs`` are numpy arrays (floats are given
    to the reference in float64 and to each backend in ``dtype``). ``fn`` may return one
    array, a sequence, or a dict of arrays.

    Raises:
        ParityError: naming the backend, the tensor, the worst index and both values.

    >>> import numpy as np
    >>> assert_parity(lambda ops, x: ops.softmax(x), [np.ones((2, 3))], backends=["numpy"]).ok
    True
    """
    import numpy as np

    from xdevice.backends.opset import numpy_dtype

    label = subject or str(getattr(fn, "__name__", "function"))
    names = list(backends) if backends is not None else _registry.backends()

    def run(name: str, float_dtype: str) -> dict[str, Any]:
        ops = _registry.backend(name).ops
        with _on_cpu(name):
            args = [
                ops.asarray(np.asarray(v).astype(numpy_dtype(float_dtype)))
                if np.asarray(v).dtype.kind == "f"
                else (ops.asarray(v) if isinstance(v, np.ndarray) else v)
                for v in inputs
            ]
            result = fn(ops, *args)
        items: Iterable[tuple[str, Any]]
        if isinstance(result, dict):
            items = result.items()
        elif isinstance(result, (list, tuple)):
            items = ((f"output {i}", r) for i, r in enumerate(result))
        else:
            items = [("output", result)]
        return {key: ops.to_numpy(value) for key, value in items}

    expected = run("numpy", "float64")
    with _checked_precision(dtype, names) as report:
        for name in names:
            report += compare_tensors(label, name, run(name, dtype), expected, dtype)
    report.raise_for_violations()
    return report
