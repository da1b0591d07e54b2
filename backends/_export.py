"""What every backend's ``export.py`` shares: output names left for core, errors, callables."""

from __future__ import annotations

from typing import Any

from xdevice._errors import ConversionError, message

__all__ = ["OUTPUT_NAMES", "record_output_names", "as_function", "exporter_failed", "identifier"]

#: where a backend's export_onnx leaves the source's output names for core to apply
OUTPUT_NAMES = "xdevice:output_names"


def record_output_names(proto: Any, names: list[str]) -> None:
    """Leave ``names`` (the source's outputs, flattened) in ``proto`` for export to apply."""
    import json

    proto.metadata_props.add(key=OUTPUT_NAMES, value=json.dumps(list(names)))


def as_function(target: Any) -> Any:
    """A functional model as one callable of its inputs: ``(apply_fn, params)`` becomes
    ``lambda *xs: apply_fn(params, *xs)`` (params closed over, so an exporter bakes them in
    as initializers); a plain function is itself."""
    if isinstance(target, tuple) and len(target) == 2 and callable(target[0]):
        apply_fn, params = target  # params may be callable too (an equinox module is a pytree)
        return lambda *xs: apply_fn(params, *xs)
    if callable(target):
        return target
    raise ConversionError(
        message(
            "Cannot export this object",
            expected="an (apply_fn, params) pair or a function of arrays",
            received=type(target).__qualname__,
        )
    )


def exporter_failed(exporter: str, error: BaseException, fix: str) -> ConversionError:
    """The ConversionError for a third-party exporter that raised: its own summary (first
    lines only: the traceback stays on ``__cause__``) and what to try."""
    summary = " ".join(str(error).split("\n")[:6]).strip()
    if len(summary) > 800:
        summary = summary[:800] + " ..."
    return ConversionError(
        message(f"{exporter} could not export the model", received=f"{type(error).__name__}: {summary}", fix=fix)
    )


def identifier(name: str) -> str:
    """A dimension's name as the frameworks' symbolic shapes take it (a Python identifier)."""
    import re

    found = re.sub(r"\W", "_", str(name))
    return found if found and not found[0].isdigit() else f"d_{found}"
