"""Checkpoints as safetensors + JSON: parameters, buffers, optimizer state, step and position.

A checkpoint is a folder: ``model.safetensors`` (``param/<name>`` and ``buffer/<name>``),
``optimizer.safetensors`` (the optimizer's state arrays) and ``trainer.json`` (format,
step, epoch, batch within the epoch, the data seed, the optimizer's settings, loss,
precision, backend, and the history so far). Shuffling depends only on (seed, epoch), so
that is all the data RNG there is to keep; the next steps after a resume are the same
steps. Nothing is pickled.

Names say where a parameter sits in the model, never a name the framework generated: a
Keras model rebuilt in the same process (``sequential_1/dense_2``) loads what its twin
(``sequential/dense``) saved. Format 1 named Keras variables by their generated path; its
checkpoints are read with those paths cut to the structural name.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["FORMAT", "check", "read", "write"]

FORMAT = "xdevice.checkpoint/2"
_FORMAT_1 = "xdevice.checkpoint/1"
# format 1's Keras name, "<index>:<generated path>/<short name>", cut to "<index>:<short name>"
_GENERATED_PATH = re.compile(r"(?<![^/])(\d{3}):(?:[^/]+/)+([^/]+)$")
_LISTED = 8  # keys shown per side in a mismatch


def write(folder: str | os.PathLike, arrays: dict[str, Any], optimizer: dict[str, Any], record: dict) -> Path:
    """Write the three files into ``folder`` (created); numpy arrays in, nothing pickled."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: _contiguous(v) for k, v in arrays.items()}, str(folder / "model.safetensors"))
    save_file({k: _contiguous(v) for k, v in optimizer.items()}, str(folder / "optimizer.safetensors"))
    (folder / "trainer.json").write_text(json.dumps({"format": FORMAT, **record}, indent=1))
    return folder


def read(folder: str | os.PathLike) -> tuple[dict[str, Any], dict[str, Any], dict]:
    """``(model arrays, optimizer arrays, record)`` from a checkpoint folder.

    Raises:
        ConfigurationError: a missing or foreign file, with the path.
    """
    from safetensors.numpy import load_file

    folder = Path(folder)
    files = [folder / "model.safetensors", folder / "optimizer.safetensors", folder / "trainer.json"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise ConfigurationError(
            message(
                "Not a complete xdevice checkpoint",
                received=missing,
                expected="model.safetensors, optimizer.safetensors, trainer.json",
                fix="pass the folder Trainer.save wrote",
            )
        )
    record = json.loads(files[2].read_text())
    if record.get("format") not in (FORMAT, _FORMAT_1):
        raise ConfigurationError(message("Unknown checkpoint format", expected=FORMAT, received=record.get("format")))
    arrays, optimizer = load_file(str(files[0])), load_file(str(files[1]))
    if record["format"] == _FORMAT_1 and record.get("backend") == "tensorflow":
        arrays, optimizer = _structural(arrays), _structural(optimizer)
    return arrays, optimizer, record


def check(expected: dict[str, tuple], found: dict[str, tuple], what: str) -> None:
    """Raise unless the checkpoint's arrays (``found``, name to shape) are the ones this
    model or optimizer holds (``expected``): the same names with the same shapes.

    Raises:
        ConfigurationError: the first name or shape that differs, then both lists.
    """
    expected, found = _shapes(expected), _shapes(found)
    if expected == found:
        return
    first = min(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
    if first not in found:
        difference = f"{first} {expected[first]} is not in the checkpoint"
    elif first not in expected:
        difference = f"the checkpoint has {first} {found[first]}, which this {what} does not"
    else:
        difference = f"{first} is {expected[first]} here and {found[first]} in the checkpoint"
    raise ConfigurationError(
        message(
            f"The checkpoint does not match this {what}: {difference}",
            expected=_listing(expected, first),
            received=_listing(found, first),
            fix="build the same model and optimizer first",
        )
    )


def _shapes(shapes: dict[str, tuple]) -> dict[str, tuple]:
    # a scalar is written as one element: numpy's ascontiguousarray gives at least one axis
    return {k: tuple(s) or (1,) for k, s in shapes.items()}


def _listing(shapes: dict[str, tuple], first: str) -> str:
    """Up to ``_LISTED`` names with their shapes, from a little before ``first``."""
    names = sorted(shapes)
    start = max(0, min(sum(n < first for n in names) - 2, len(names) - _LISTED))
    shown = [f"{n} {tuple(shapes[n])}" for n in names[start : start + _LISTED]]
    after = len(names) - start - len(shown)
    parts = ([f"({start} before)"] if start else []) + shown + ([f"({after} more)"] if after else [])
    return ", ".join(parts) or "(none)"


def _structural(arrays: dict[str, Any]) -> dict[str, Any]:
    return {_GENERATED_PATH.sub(r"\1:\2", k): v for k, v in arrays.items()}


def _contiguous(value: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(value)
