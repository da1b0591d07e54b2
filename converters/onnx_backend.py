"""``onnx.backend.base.Backend`` for each xdevice backend, so ONNX's own test suites run.

``onnx_backend("torch")`` is a Backend class: ``prepare(model, device)`` imports the
model with ``from_onnx`` and returns a rep whose ``run(inputs)`` gives numpy outputs.
"""

from __future__ import annotations

import functools
from typing import Any

from onnx.backend.base import Backend, BackendRep

from xdevice import _registry
from xdevice.converters.importer.interpreter import numpy_of
from xdevice.converters.importer.model import ImportedModel

__all__ = ["onnx_backend"]


class _Rep(BackendRep):
    def __init__(self, model: ImportedModel):
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            inputs = [inputs[name] for name in self.model.input_names]
        elif not isinstance(inputs, (list, tuple)):
            inputs = [inputs]
        outputs = self.model.apply(self.model.params, *inputs)
        ops = self.model.backend.ops
        return tuple(numpy_of(o, ops) for o in outputs)


@functools.cache
def onnx_backend(name: str) -> type[Backend]:
    """The ``onnx.backend.base.Backend`` class that runs models on xdevice backend ``name``."""
    _registry.backend(name)  # an unknown or missing backend fails here, with the pip line

    class XDeviceOnnxBackend(Backend):
        backend_name = name

        @classmethod
        def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> _Rep:
            super().prepare(model, device, **kwargs)
            return _Rep(ImportedModel(model, name, device))

        @classmethod
        def run_model(cls, model, inputs, device: str = "CPU", **kwargs: Any):
            return cls.prepare(model, device, **kwargs).run(inputs)

        @classmethod
        def supports_device(cls, device: str) -> bool:
            from xdevice._discovery import devices

            return device.upper() == "CPU" or (device.upper() == "CUDA" and bool(devices(kind="gpu", backend=name)))

    XDeviceOnnxBackend.__name__ = XDeviceOnnxBackend.__qualname__ = f"{name.capitalize()}OnnxBackend"
    return XDeviceOnnxBackend
