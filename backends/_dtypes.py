"""numpy dtypes numpy lacks (bfloat16, float8, int4) from ml_dtypes, found without a framework."""

from __future__ import annotations

from typing import Any

from xdevice._errors import ConversionError, message

__all__ = ["ml_dtype", "is_numpy_bfloat16"]


def ml_dtype(name: str = "bfloat16") -> Any:
    """numpy's dtype for ``name`` (bfloat16, float8, int4...) from ``ml_dtypes`` (installed with
    JAX and TensorFlow)."""
    try:
        import ml_dtypes
    except ImportError as error:
        raise ConversionError(
            message(
                f"numpy has no {name} type without ml_dtypes", received=f"a {name} array", fix="pip install ml_dtypes"
            )
        ) from error
    return getattr(ml_dtypes, name)


def is_numpy_bfloat16(x: Any) -> bool:
    """Whether ``x`` is a numpy array of ml_dtypes' bfloat16 (no framework import needed)."""
    dtype = getattr(x, "dtype", None)
    return type(x).__module__ == "numpy" and getattr(dtype, "name", "") == "bfloat16"
