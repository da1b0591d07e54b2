"""What every backend's ``export.py`` shares: output names left for core, errors, callables."""

from __future__ import annotations

import re
from typing import Any

from xdevice._errors import ConversionError, message

__all__ = ["OUTPUT_NAMES", "record_output_names", "as_function", "exporter_failed", "summary", "identifier"]

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
    """The ConversionError for a third-party exporter that raised: its error in one line
    (:func:`summary`) and what to try. Raise it ``from error``: the original, whole, stays on
    ``__cause__``."""
    return ConversionError(message(f"{exporter} could not export the model", received=summary(error), fix=fix))


#: what exporters print around the cause, addressed to their own developers: PyTorch's "Next
#: steps" (create an issue in the PyTorch GitHub repository, submit a PR, report=True) and the
#: frame of its "Exception summary"
_BOILERPLATE = re.compile(
    r"create an issue|submit a PR|report=True|implement it and register it|^- Modify the model code"
    r"|^## Exception summary|^\(Refer to the full stack trace|^\W*$",
    re.IGNORECASE,
)
_STEP = re.compile(r"\s*This is step \d+/\d+ of exporting the model to ONNX\. Next steps:\s*")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def summary(error: BaseException, limit: int = 500) -> str:
    r"""``error`` in one line: ``Type: first line``, without terminal colour codes or the
    exporter's advice to its own developers, and with the innermost cause's first line when
    the error only wraps it (PyTorch's "Failed to convert the exported program...").

    >>> summary(ValueError("\x1b[96mbad\x1b[0m shape\n- Create an issue in the PyTorch GitHub repository"))
    'ValueError: bad shape'
    """
    text = f"{type(error).__name__}: {_first_line(error)}"
    root = error
    while root.__cause__ is not None and root.__cause__ is not root:
        root = root.__cause__
    if root is not error and _first_line(root) and _first_line(root) not in text:
        text += f" (caused by {type(root).__name__}: {_first_line(root)})"
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def _first_line(error: BaseException) -> str:
    lines = (_STEP.sub(" ", line).strip() for line in _ANSI.sub("", str(error)).splitlines())
    return next((line for line in lines if line and not _BOILERPLATE.search(line)), "")


def identifier(name: str) -> str:
    """A dimension's name as the frameworks' symbolic shapes take it (a Python identifier)."""
    import re

    found = re.sub(r"\W", "_", str(name))
    return found if found and not found[0].isdigit() else f"d_{found}"
