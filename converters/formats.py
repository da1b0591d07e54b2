"""``xdevice convert``: an ONNX model saved in a framework's own format, loadable without xdevice.

- ``torch``: a ``torch.export.ExportedProgram`` file (``.pt2``): ``torch.export.load(path).module()(x)``.
- ``tensorflow``: a SavedModel directory: ``loaded = tf.saved_model.load(path); loaded.serve(x)``
  (keep ``loaded``: the weights live as long as it does).
- ``jax``: a serialized ``jax.export.Exported`` (``.jax``):
  ``jax.export.deserialize(bytearray(open(path, "rb").read())).call(x)``.

The model is imported (``from_onnx``) on that framework and traced once; the saved program
holds only that framework's ops and the weights. The batch axis stays dynamic when the
model allows it; a graph that computes shapes from its input (Shape -> ... -> Reshape)
pins the batch to the example's size instead, and the result says so.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from xdevice._errors import ConversionError, message
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.model import ImportedModel, from_onnx

__all__ = ["Converted", "convert_model", "FORMATS"]

FORMATS = {"torch": ".pt2", "tensorflow": ".savedmodel", "jax": ".jax"}
_EXAMPLE_BATCH = 2


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
    if to not in FORMATS:
        raise ConversionError(message("Unknown target format", received=to, choices=list(FORMATS)))
    start = time.perf_counter()
    imported = from_onnx(model, backend=to)
    base = Path(model).with_suffix("") if isinstance(model, (str, os.PathLike)) else Path("model")
    path = Path(output) if output else base.with_suffix(FORMATS[to])
    specs = _input_specs(imported)
    examples = [_example(dtype, shape) for _, dtype, shape in specs]
    writer = {"torch": _torch, "tensorflow": _tensorflow, "jax": _jax}[to]
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


def _torch(imported, specs, examples, path: Path, dynamic: bool) -> None:
    import torch

    class Program(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.names = list(imported.params)
            for i, name in enumerate(self.names):
                self.register_buffer(f"w{i}", imported.params[name])

        def forward(self, *inputs):
            params = {name: getattr(self, f"w{i}") for i, name in enumerate(self.names)}
            outputs = imported.apply(params, *inputs)
            return outputs[0] if len(outputs) == 1 else outputs

    args = tuple(torch.as_tensor(x) for x in examples)
    shapes = None
    if dynamic:
        batch = torch.export.Dim("batch", min=1)
        # forward(*inputs) has one parameter, `inputs`: its spec is the tuple of per-input specs
        shapes = {"inputs": tuple({0: batch} if shape and shape[0] is None else None for _, _, shape in specs)}
    program = torch.export.export(Program(), args, dynamic_shapes=shapes)
    torch.export.save(program, str(path))


def _tensorflow(imported, specs, examples, path: Path, dynamic: bool) -> None:
    import tensorflow as tf

    module = tf.Module()
    module.weights = {name: tf.Variable(value, trainable=False) for name, value in imported.params.items()}
    signature = [tf.TensorSpec([None if (dynamic and d is None) else (d or _EXAMPLE_BATCH) for d in shape],
                               tf.as_dtype(dtype), name=name) for name, dtype, shape in specs]

    @tf.function(input_signature=signature)
    def serve(*inputs):
        outputs = imported.apply(dict(module.weights), *inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    serve.get_concrete_function()  # trace now: a refusal of the dynamic batch surfaces here
    module.serve = serve
    tf.saved_model.save(module, str(path), signatures={"serving_default": serve})


def _jax(imported, specs, examples, path: Path, dynamic: bool) -> None:
    import jax
    import jax.export

    def serve(*inputs):
        outputs = imported.apply(imported.params, *inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    scope = jax.export.SymbolicScope()
    args = []
    for (_, dtype, shape), example in zip(specs, examples):
        if dynamic and shape and shape[0] is None:
            dims = jax.export.symbolic_shape("b", scope=scope) + tuple(example.shape[1:])
        else:
            dims = example.shape
        args.append(jax.ShapeDtypeStruct(dims, example.dtype))
    exported = jax.export.export(jax.jit(serve))(*args)
    path.write_bytes(exported.serialize())
