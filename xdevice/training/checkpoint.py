"""Checkpoints as safetensors + JSON: parameters, buffers, optimizer state, step and position.

A checkpoint is a folder: ``model.safetensors`` (``param/<name>`` and ``buffer/<name>``),
``optimizer.safetensors`` (the optimizer's state arrays) and ``trainer.json`` (format,
step, epoch, batch within the epoch, the data seed, the optimizer's settings, loss,
precision, backend, and the history so far). Shuffling depends only on (seed, epoch), so
that is all the data RNG there is to keep; the next steps after a resume are the same
steps. Nothing is pickled.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from xdevice._errors import ConfigurationError, message

__all__ = ["FORMAT", "read", "write"]

FORMAT = "xdevice.checkpoint/1"


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
    if record.get("format") != FORMAT:
        raise ConfigurationError(message("Unknown checkpoint format", expected=FORMAT, received=record.get("format")))
    return load_file(str(files[0])), load_file(str(files[1])), record


def _contiguous(value: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(value)
