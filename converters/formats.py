"""``xdevice convert``: an ONNX model saved in a framework's own format, loadable without xdevice.

- ``torch``: a ``torch.export.ExportedProgram`` file (``.pt2``): ``torch.export.load(path).module()(x)``.
- ``tensorflow``: a SavedModel directory: ``loaded = tf.saved_model.load(path); loaded.serve(x)``
  (keep ``loaded``: the weights live as long as it does).
- ``jax``: a serialized ``jax.export.Exported`` (``.jax``):
  ``jax.export.deserialize(bytearray(open(path, "rb").read())).call(x)``.

The model is imported (``from_onnx``) on that framework and traced once by its backend
(``Backend.save_converted``, in the backend's ``export.py``); the saved program holds only that
framework's ops and the weights. The batch axis stays dynamic when the
model allows it; a graph that computes shapes from its input (Shape -> ... -> Reshape)
pins the batch to the example's size instead, and the result says so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from xdevice import _registry
from xdevice._errors import ConversionError, message
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.model import ImportedModel, from_onnx

__all__ = ["Converted", "convert_model", "formats"]

_EXAMPLE_BATCH = 2


def formats() -> dict[str, str]:
    """Installed backend -> the suffix of its framework's own saved program (``Backend.saved_format``)."""
    found = {}
    for name in _registry.backends():
        with contextlib.suppress(Exception):  # a framework that fails to load has no format here
            suffix = _registry.backend(name).saved_format
            if suffix:
                found[name] = suffix
    return found


@dataclasses.dataclass
class Converted:
    path: Path
    framework: str
    dynamic_batch: bool
    inputs: list[tuple[str, str, tuple]]
    seconds: float
    note: str = ""


def convert_model(model: Any, to: str, output: str | os.PathLike | None = None) -> Converted:
    """Write the ONNX ``model`` (path, bytes or ModelProto) in framework ``to``'s own format."""
    suffix = _registry.backend(to).saved_format if to in _registry.backends(all=True) else None
    if suffix is None:
        raise ConversionError(message("Unknown target format", received=to, choices=list(formats())))
    start = time.perf_counter()
    imported = from_onnx(model, backend=to)
    base = Path(model).with_suffix("") if isinstance(model, (str, os.PathLike)) else Path("model")
    path = Path(output) if output else base.with_suffix(suffix)
    specs = _input_specs(imported)
    examples = [_example(dtype, shape) for _, dtype, shape in specs]
    writer = imported.backend.save_converted
    note = ""
    try:
        writer(imported, specs, examples, path, dynamic=True)
        dynamic = any(None in shape for _, _, shape in specs)
    except Exception as error:  # noqa: BLE001 - any tracer's refusal of a dynamic batch
        writer(imported, specs, examples, path, dynamic=False)
        dynamic = False
        note = (f"batch fixed at {_EXAMPLE_BATCH}: the graph computes shapes from its input "
                f"({type(error).__name__}: {str(error).splitlines()[0][:120]})")
    return Converted(path, to, dynamic, specs, time.perf_counter() - start, note)


def _input_specs(imported: ImportedModel) -> list[tuple[str, str, tuple]]:
    """``(name, dtype, shape)`` per graph input; None marks a dimension that is not fixed."""
    by_name = {i.name: i for i in imported.proto.graph.input}
    specs = []
    for name in imported.input_names:
        kind = by_name[name].type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim)
        specs.append((name, onnx_dtype(kind.elem_type), shape))
    return specs


def _example(dtype: str, shape: tuple) -> np.ndarray:
    concrete = tuple(_EXAMPLE_BATCH if d is None else d for d in shape)
    if dtype.startswith(("int", "uint")):
        return np.ones(concrete, dtype=dtype)
    if dtype == "bool":
        return np.ones(concrete, dtype=bool)
    return np.random.default_rng(0).normal(size=concrete).astype(dtype)


def __getattr__(name: str) -> Any:
    if name == "FORMATS":  # the table of formats(), kept by its old name (it loads the backends)
        return formats()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
