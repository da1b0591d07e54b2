"""``xdevice convert``: an ONNX model saved in a framework's own format, loadable without xdevice.

- ``torch``: a ``torch.export.ExportedProgram`` file (``.pt2``): ``torch.export.load(path).module()(x)``.
- ``tensorflow``: a SavedModel directory: ``loaded = tf.saved_model.load(path); loaded.serve(x)``
  (keep ``loaded``: the weights live as long as it does).
- ``jax``: a serialized ``jax.export.Exported`` (``.jax``):
  ``jax.export.deserialize(bytearray(open(path, "rb").read())).call(x)``.

The model is imported (``from_onnx``) on that framework and traced once by its backend
(``Backend.save_converted``, in the backend's ``export.py``); the saved program holds only that
framework's ops and the weights. Every symbolic dimension of the graph's inputs stays symbolic
where the framework's tracer can keep them; where it cannot, ``convert_model`` raises naming the
node, and ``fixed=`` fixes those dimensions at the sizes you choose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Mapping
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
    one size, across inputs); ``dynamic_batch`` says whether axis 0 stayed free; ``note``
    names the dimensions fixed on request (``fixed=``)."""

    path: Path
    framework: str
    dynamic_batch: bool
    inputs: list[tuple[str, str, tuple]]
    seconds: float
    note: str = ""


def convert_model(
    model: Any, to: str, output: str | os.PathLike | None = None, *, fixed: Mapping[str, int] | None = None
) -> Converted:
    """Write the ONNX ``model`` (path, bytes or ModelProto) in framework ``to``'s own format.

    Every dimension the graph leaves symbolic stays symbolic in the saved program (named dims
    shared across inputs bind to one size). Where the framework's tracer cannot keep one, the
    conversion raises ``ConversionError`` naming the node and the dimensions; ``fixed={"seq":
    128}`` then fixes those dimensions at a size of your choice. ``output`` gets the format's
    suffix (``.pt2``, ``.savedmodel``, ``.jax``) when it has another or none.
    """
    suffix = _registry.backend(to).saved_format if to in _registry.backends(all=True) else None
    if suffix is None:
        raise ConversionError(message("Unknown target format", received=to, choices=list(formats())))
    start = time.perf_counter()
    imported = from_onnx(model, backend=to)
    base = Path(model).with_suffix("") if isinstance(model, (str, os.PathLike)) else Path("model")
    path = Path(output) if output else base.with_suffix(suffix)
    if path.suffix != suffix:  # torch.export.save warns of any other; a folder name may hold dots
        path = path.with_name(path.name + suffix)
    declared = _input_specs(imported)
    specs = _fixed(declared, dict(fixed or {}))
    try:
        imported.backend.save_converted(imported, specs, _examples(specs), path, dynamic=_symbolic(specs))
    except Exception as error:
        if not _symbolic(specs):
            raise
        raise _cannot_keep(to, specs, error) from error
    note = ""
    if fixed:
        note = "fixed on request: " + ", ".join(f"{name}={size}" for name, size in fixed.items())
    dynamic = any(isinstance(d, str) for _, _, shape in specs for d in shape[:1])
    return Converted(path, to, dynamic, specs, time.perf_counter() - start, note)


def _symbolic(specs: list[tuple[str, str, tuple]]) -> bool:
    return any(isinstance(d, str) for _, _, shape in specs for d in shape)


def _fixed(specs: list[tuple[str, str, tuple]], fixed: dict[str, int]) -> list[tuple[str, str, tuple]]:
    """``specs`` with the symbolic dimensions named in ``fixed`` at the sizes given."""
    names = {d for _, _, shape in specs for d in shape if isinstance(d, str)}
    unknown = sorted(set(fixed) - names)
    wrong = {name: size for name, size in fixed.items() if not isinstance(size, int) or size < 1}
    if unknown or wrong:
        raise ConversionError(
            message(
                "fixed= names symbolic dimensions of the model's inputs, each with a size >= 1",
                received=f"unknown {unknown}" if unknown else f"sizes {wrong}",
                choices=sorted(names),
            )
        )
    return [
        (name, dtype, tuple(fixed.get(d, d) if isinstance(d, str) else d for d in shape))
        for name, dtype, shape in specs
    ]


def _cannot_keep(to: str, specs: list[tuple[str, str, tuple]], error: BaseException) -> ConversionError:
    """The error for a tracer that could not keep the symbolic dimensions: the node it was
    running (the interpreter notes it on the error), the dimensions, and the two ways on."""
    names = list(dict.fromkeys(d for _, _, shape in specs for d in shape if isinstance(d, str)))
    node = next((n for n in getattr(error, "__notes__", ()) if n.startswith("while running")), "")
    text = str(error).strip().splitlines()
    cause = f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__
    likely = [name for name in names if name != "batch"] or names  # a batch is rarely what a node needs
    sizes = ", ".join(f"{name!r}: <size>" for name in likely)
    return ConversionError(
        message(
            f"The {to} tracer cannot keep the symbolic dimensions {names} of this model"
            + (f" ({node})" if node else ""),
            received=cause,
            fix=f"fix the dimension that node needs at a size: convert_model(..., fixed={{{sizes}}}) "
            f"(xdevice convert --fixed {likely[0]}=<size>), or convert to another framework",
        )
    )


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
