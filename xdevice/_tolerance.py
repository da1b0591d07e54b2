"""One tolerance table per dtype, and the one comparison every parity check uses.

An element passes when ``|actual - expected| <= atol + rtol * |expected|`` (numpy's
``allclose`` rule). The reference is computed in float64, so the budget is the tested
dtype's own rounding, accumulated through a network.

| dtype    | rtol | atol |
|----------|------|------|
| float64  | 1e-7 | 1e-9 |
| float32  | 1e-4 | 1e-5 |
| float16  | 1e-2 | 1e-3 |
| bfloat16 | 5e-2 | 1e-2 |
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["TOLERANCES", "Comparison", "compare"]

TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-9),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (5e-2, 1e-2),
}


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How far ``actual`` is from ``expected``, and where it is worst.

    ``reason`` says why the arrays could not be compared element by element (shapes that
    differ, a dtype that is not a number), with both sides; it is empty otherwise.
    """

    max_abs: float
    max_rel: float  # over elements whose reference exceeds atol
    worst_index: tuple[int, ...]
    actual: float
    expected: float
    rtol: float
    atol: float
    ok: bool
    reason: str = ""

    def describe(self) -> str:
        if self.reason:
            return self.reason
        return (
            f"worst at index {self.worst_index}: {self.actual!r} vs expected {self.expected!r} "
            f"(max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}; "
            f"allowed {self.atol:g} + {self.rtol:g} * |expected|)"
        )


def compare(actual: Any, expected: Any, dtype: str = "float32", *, scale: float = 1.0) -> Comparison:
    """Compare two numpy-convertible arrays under ``dtype``'s tolerance.

    Shapes must match (no broadcasting); NaN matches NaN only where both have it; integers
    and booleans must be equal. ``scale`` multiplies the absolute allowance: a check of outputs
    whose magnitude is far below 1 passes ``scale=max|expected|`` so that ``atol`` means the
    same to them. Arrays that cannot be compared element by element (other shapes, text)
    are not an error: the result is not ``ok`` and its ``reason`` names both sides, so a
    report of many tensors still lists them all.

    >>> compare([1.0, 2.0], [1.0, 2.00001]).ok
    True
    >>> compare([3e-11], [1e-11], scale=1e-11).ok   # no longer lost under atol=1e-5
    False
    >>> compare([[1.0, 2.0]], [1.0, 2.0, 3.0]).reason
    'The shapes differ: actual (1, 2), expected (3,); compare arrays of the same shape'
    """
    import numpy as np

    a = np.asarray(actual)
    e = np.asarray(expected)
    reason = _incomparable(a, e)
    if reason:
        return Comparison(float("inf"), float("inf"), (), float("nan"), float("nan"), 0, 0, False, reason)
    exact = a.dtype.kind in "biu" or e.dtype.kind in "biu"
    rtol, atol = (0.0, 0.0) if exact else TOLERANCES.get(dtype, TOLERANCES["float32"])
    atol *= scale
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):  # NaN and inf are handled below
        return _compare(a, a64, e64, rtol, atol)


def _incomparable(a: Any, e: Any) -> str:  # numpy arrays
    """Why ``a`` and ``e`` cannot be compared element by element, or ``""``."""
    for side, array in (("actual", a), ("expected", e)):
        # ml_dtypes' bfloat16, float8 and int4 are numbers of numpy kind "V" (void)
        if array.dtype.kind not in "biufc" and not array.dtype.name.startswith(("bfloat", "float", "int", "uint")):
            return f"The {side} array has dtype {array.dtype}, not a number (actual {a.dtype}, expected {e.dtype})"
    if a.shape != e.shape:
        hint = " (the same values in another layout? .reshape() one side)" if a.size == e.size else ""
        return f"The shapes differ: actual {a.shape}, expected {e.shape}; compare arrays of the same shape{hint}"
    return ""


def _compare(a: Any, a64: Any, e64: Any, rtol: float, atol: float) -> Comparison:  # numpy arrays
    import numpy as np

    both_nan = np.isnan(a64) & np.isnan(e64)
    same_inf = np.isinf(a64) & (a64 == e64)
    diff = np.where(both_nan | same_inf, 0.0, np.abs(a64 - e64))
    diff = np.where(np.isnan(diff), np.inf, diff)
    excess = diff - (atol + rtol * np.where(np.isfinite(e64), np.abs(e64), 0.0))
    if a.size == 0:
        return Comparison(0.0, 0.0, (), 0.0, 0.0, rtol, atol, True)
    worst = np.unravel_index(int(np.argmax(excess)), a.shape) if a.ndim else ()
    # relative error only where the reference is larger than the absolute allowance
    significant = np.abs(e64) > max(atol, np.finfo(np.float32).tiny)
    rel = np.where(significant, diff / np.where(significant, np.abs(e64), 1.0), 0.0)
    return Comparison(
        float(diff.max()),
        float(rel.max()),
        tuple(int(i) for i in worst),
        a64[worst].item(),
        e64[worst].item(),
        rtol,
        atol,
        bool((excess <= 0).all()),
    )
