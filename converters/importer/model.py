"""``from_onnx``: an ONNX model bound to a backend and a device, with its weights as parameters."""

from __future__ import annotations

from typing import Any

import numpy as np

from xdevice import _registry
from xdevice._discovery import find
from xdevice._errors import ConversionError, UnsupportedOp, message
from xdevice.converters.importer.interpreter import Context, Graph, is_static, run_graph, unsupported
from xdevice.converters.load import load_model

__all__ = ["ImportedModel", "from_onnx"]

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def _numeric_static(value: Any) -> bool:
    """A static (numpy) output the backend can hold: string tensors stay numpy."""
    return is_static(value) and value is not None and np.asarray(value).dtype.kind not in "OSU"


def from_onnx(model: Any, backend: str = "numpy", device: Any = "cpu", *, check: bool = True) -> ImportedModel:
    """An ONNX model (path, bytes or ModelProto) as a function on ``backend``.

    Every op the model uses must have a handler: all missing ones are listed in one
    ``UnsupportedOp`` before anything runs.

    >>> model = from_onnx("model.onnx", backend="jax")  # doctest: +SKIP
    >>> outputs = model(x)                               # doctest: +SKIP
    """
    return ImportedModel(load_model(model, check=check), backend, device)


class ImportedModel:
    """An ONNX graph as a function of one backend.

    Attributes:
        params: the float initializers, as the backend's arrays on ``device`` (trainable).
        input_names, output_names: the graph's inputs (initializers excluded) and outputs.
        opset: the default-domain opset the model was written for.
    """

    def __init__(self, proto, backend: str, device: Any):
        self.proto = proto
        opsets = {("" if imp.domain == "ai.onnx" else imp.domain): imp.version for imp in proto.opset_import}
        self.opset = opsets.get("")
        self.graph = Graph(proto.graph, opsets)
        missing = unsupported(self.graph)
        if missing:
            raise UnsupportedOp(message(
                f"{len(missing)} ONNX op(s) in this model have no handler", received="; ".join(missing),
                fix="these ops cannot be imported yet; `xdevice conformance` shows what is covered"))
        self.backend = _registry.backend(backend)
        self.device = find(device, backend=backend)
        self.params = {name: self._place(value) for name, value in self.graph.initializers.items()
                       if value.dtype.name in _FLOATS}
        self.input_names = list(self.graph.inputs)
        self.output_names = list(self.graph.outputs)

    def apply(self, params: dict[str, Any], *inputs: Any) -> tuple[Any, ...]:
        """The graph's outputs for ``inputs`` with the float initializers taken from
        ``params`` (a pure function of both: differentiate or compile it natively)."""
        if len(inputs) != len(self.input_names):
            raise ConversionError(message(
                "Wrong number of inputs", expected=f"{len(self.input_names)}: {', '.join(self.input_names)}",
                received=len(inputs)))
        ctx = Context(self.backend)
        values = {**params, **{name: self._input(x) for name, x in zip(self.input_names, inputs)}}
        with self.backend.default_device(self.device):
            outputs = run_graph(self.graph, ctx, values)
            return tuple(ctx.array(o) if _numeric_static(o) else o for o in outputs)

    def __call__(self, *inputs: Any) -> Any:
        """The outputs for ``inputs``: one array, or a tuple when the graph has several."""
        outputs = self.apply(self.params, *inputs)
        return outputs[0] if len(outputs) == 1 else outputs

    def _place(self, value: np.ndarray) -> Any:
        return self.backend.to_device(self.backend.ops.asarray(value), self.device)

    def _input(self, x: Any) -> Any:
        if isinstance(x, (list, tuple)) or x is None:  # sequences and empty optionals pass as they are
            return x
        if isinstance(x, np.ndarray) and x.dtype.kind in "OSU":
            return x  # strings stay numpy: only handlers that understand them read them
        return self.backend.ops.asarray(x) if isinstance(x, (np.ndarray, np.generic, int, float)) else x

    def __repr__(self) -> str:
        return (f"<ImportedModel opset {self.opset} on {self.backend.name} {self.device}: "
                f"inputs {self.input_names} -> outputs {self.output_names}>")
