"""``xdevice convert``: an ONNX model saved in a framework's own format, loadable without xdevice.

- ``torch``: a ``torch.export.ExportedProgram`` file (``.pt2``): ``torch.export.load(path).module()(x)``.
- ``tensorflow``: a SavedModel directory: ``loaded = tf.saved_model.load(path); loaded.serve(x)``
  (keep ``loaded``: the weights live as long as it does).
- ``jax``: a serialized ``jax.export.Exported`` (``.jax``):
  ``jax.export.deserialize(bytearray(open(path, "rb").read())).call(x)``.

The model is imported (``from_onnx``) on that framework and traced once by its backend
(``Backend.save_converted``, in the backend's ``export.py``); the saved program holds only that
framework's ops and the weights. Every symbolic dimension of the graph's inputs stays symbolic
where the framework's tracer can keep it (see ``convert_model``); the result says which were
fixed, and why.
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
    """A converted model: ``inputs`` are ``(name, dtype, shape)`` with each dimension as the
    saved program takes it: a number where fixed, a name where any size is accepted (one name,
    one size, across inputs); ``dynamic`` says which symbolic dims stayed free, ``note`` why
    the others were fixed."""

    path: Path
    framework: str
    dynamic_batch: bool
    inputs: list[tuple[str, str, tuple]]
    seconds: float
    note: str = ""


def convert_model(model: Any, to: str, output: str | os.PathLike | None = None) -> Converted:
    """Write the ONNX ``model`` (path, bytes or ModelProto) in framework ``to``'s own format.

    Every dimension the graph leaves symbolic stays symbolic in the saved program (named dims
    shared across inputs bind to one size); when the framework's tracer cannot keep them all,
    the batch alone stays free, and failing that every dimension is fixed at the example's
    size: ``Converted.note`` says which, and why.
    """
    suffix = _registry.backend(to).saved_format if to in _registry.backends(all=True) else None
    if suffix is None:
        raise ConversionError(message("Unknown target format", received=to, choices=list(formats())))
    start = time.perf_counter()
    imported = from_onnx(model, backend=to)
    base = Path(model).with_suffix("") if isinstance(model, (str, os.PathLike)) else Path("model")
    path = Path(output) if output else base.with_suffix(suffix)
    declared = _input_specs(imported)
    examples = _examples(declared)
    writer = imported.backend.save_converted
    failures = []
    for attempt in ("all", "batch", "none"):
        specs = _free(declared, attempt)
        try:
            writer(imported, specs, examples, path, dynamic=attempt != "none")
            break
        except Exception as error:
            if attempt == "none":
                raise
            failures.append(
                f"{type(error).__name__}: {str(error).splitlines()[0][:160]}" if str(error) else type(error).__name__
            )
    fixed = [
        f"{name}[{axis}]={size}"
        for (name, _, was), (_, _, now), x in zip(declared, specs, examples)
        for axis, (d, e, size) in enumerate(zip(was, now, x.shape))
        if isinstance(d, str) and not isinstance(e, str)
    ]
    note = ""
    if fixed:
        note = (
            f"fixed at the example's size: {', '.join(fixed)}; the {to} tracer could not keep them "
            f"symbolic ({failures[-1]})"
        )
    dynamic = any(isinstance(d, str) for _, _, shape in specs for d in shape[:1])
    return Converted(path, to, dynamic, specs, time.perf_counter() - start, note)


def _input_specs(imported: ImportedModel) -> list[tuple[str, str, tuple]]:
    """``(name, dtype, shape)`` per graph input: a dimension is its size where fixed, else its
    name in the graph (``dim_param``), or ``<input>_<axis>`` where the graph names none."""
    by_name = {i.name: i for i in imported.proto.graph.input}
    specs = []
    for name in imported.input_names:
        kind = by_name[name].type.tensor_type
        shape = tuple(
            d.dim_value if d.HasField("dim_value") else (d.dim_param or f"{name}_{axis}")
            for axis, d in enumerate(kind.shape.dim)
        )
        specs.append((name, onnx_dtype(kind.elem_type), shape))
    return specs


def _free(specs: list[tuple[str, str, tuple]], which: str) -> list[tuple[str, str, tuple]]:
    """``specs`` with the symbolic dims kept (``"all"``), only the batch (``"batch"``: axis 0)
    or none (``"none"``); a fixed dim is its example size."""
    sizes = _sizes(specs)
    kept = []
    for name, dtype, shape in specs:
        kept.append(
            (
                name,
                dtype,
                tuple(
                    d
                    if isinstance(d, str) and (which == "all" or (which == "batch" and axis == 0))
                    else (sizes[d] if isinstance(d, str) else d)
                    for axis, d in enumerate(shape)
                ),
            )
        )
    return kept


def _sizes(specs: list[tuple[str, str, tuple]]) -> dict[str, int]:
    """One example size per symbolic name, distinct (2, 3, 5, 7...): a tracer that saw two dims
    of one size could take them to be equal."""
    primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37]
    names = list(dict.fromkeys(d for _, _, shape in specs for d in shape if isinstance(d, str)))
    return {name: primes[i % len(primes)] for i, name in enumerate(names)}


def _examples(specs: list[tuple[str, str, tuple]]) -> list[np.ndarray]:
    sizes = _sizes(specs)
    return [_example(dtype, tuple(sizes[d] if isinstance(d, str) else d for d in shape)) for _, dtype, shape in specs]


def _example(dtype: str, concrete: tuple) -> np.ndarray:
    if dtype.startswith(("int", "uint")):
        return np.ones(concrete, dtype=dtype)
    if dtype == "bool":
        return np.ones(concrete, dtype=bool)
    return np.random.default_rng(0).normal(size=concrete).astype(dtype)


def __getattr__(name: str) -> Any:
    if name == "FORMATS":  # the table of formats(), kept by its old name (it loads the backends)
        return formats()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
