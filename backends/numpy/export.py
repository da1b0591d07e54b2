"""ONNX export from numpy: there is none. numpy has no tracer, so it has no exporter.

``export_onnx`` says so and names the backends that have one; ``native_outputs`` still runs
a functional model, so an ONNX model can be checked against the numpy reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from xdevice._device import Device
from xdevice._errors import ConversionError, message
from xdevice.backends._export import as_function
from xdevice.backends._model_io import flat_outputs

if TYPE_CHECKING:
    from xdevice.backends.numpy.ops import NumpyOps

__all__ = ["Export"]


class Export:
    ops: ClassVar[NumpyOps]  # the assembled backend's

    def export_onnx(self, target: Any, example_inputs: tuple[Any, ...], opset: int, axes: list[dict[int, str]]) -> Any:
        from xdevice import _registry

        able = [name for name in _registry.backends() if name != "numpy"]
        raise ConversionError(
            message(
                "numpy has no ONNX exporter: export from a framework backend",
                expected="a model on a backend with an exporter",
                received="numpy",
                choices=able,
                fix=f"export(model, backend={able[0] if able else 'torch'!r}) moves a zoo model there first",
            )
        )

    def native_outputs(self, target: Any, inputs: tuple[Any, ...]) -> list[Any]:
        return [self.ops.to_numpy(y) for y in flat_outputs(as_function(target)(*inputs))]

    def reference_device(self, target: Any) -> Device:
        """Where ``native_outputs`` computes: numpy has only the CPU."""
        return Device("cpu", 0)
