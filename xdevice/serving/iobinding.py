"""Framework arrays that already live on the session's GPU, bound to ONNX Runtime in place.

A torch, JAX or TensorFlow array on the GPU a session runs on is handed to ONNX Runtime by
its device pointer (``IOBinding.bind_input(name, "cuda", index, dtype, shape, pointer)``),
never copied to the host and back. The pointer, the device and a dense layout come from the
backend contract (``data_pointer``, ``device_of``, ``dense``), so this module imports no
framework, and works on any ONNX Runtime build (no DLPack support needed in ORT).

Decisions:
- Only arrays on the session's own device are bound in place; an array on another device,
  a ``bool`` array (ORT's bool and the frameworks' differ across DLPack) and strings go
  through the host, as before.
- ORT reads no strides: a non-dense array is made dense first (a copy on the device).
- The producing framework may still be writing the array on its own CUDA stream, which ORT
  knows nothing of: after binding, ``synchronize_inputs()`` waits for the device (ORT's CUDA
  provider synchronises the whole device) before the run reads it.
- The bound array must outlive the run: :func:`bind_in_place` returns it for the caller to
  hold until the run returns.
- Memory no framework owns (a client's CUDA shared-memory region, opened from its IPC handle)
  comes as a :class:`DevicePointer`: its address, device, dtype and shape, bound the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from xdevice import _registry
from xdevice._device import Device
from xdevice._tensors import backend_of

__all__ = ["DevicePointer", "binds_in_place", "bind_in_place", "ort_device"]

_THROUGH_HOST = ("bool", "string", "bfloat16")  # dtypes ORT's binding cannot take from a pointer here


@dataclasses.dataclass(frozen=True)
class DevicePointer:
    """A dense tensor on a GPU known only by its address (a registered CUDA shared-memory
    region), not owned by any framework: bound to ONNX Runtime by ``pointer``. It has the
    ``dtype``, ``shape`` and ``ndim`` the session's input checks read.

    >>> DevicePointer(0x7F0000000000, Device("gpu", 0), "float32", (2, 4)).nbytes
    32
    """

    pointer: int
    device: Device
    dtype: str  # numpy dtype name
    shape: tuple[int, ...]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        import numpy as np

        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def binds_in_place(array_device: Device | None, session_device: Device, dtype: str) -> bool:
    """Whether an input of numpy dtype name ``dtype`` held on ``array_device`` (None: a host
    array with no framework device, e.g. numpy) is bound to the session by its device pointer.
    Pure: tested with made-up devices.

    >>> binds_in_place(Device("gpu", 0), Device("gpu", 0), "float32")
    True
    >>> binds_in_place(Device("gpu", 1), Device("gpu", 0), "float32")  # another GPU: via the host
    False
    """
    return (
        session_device.kind == "gpu"
        and array_device is not None
        and array_device == session_device
        and dtype not in _THROUGH_HOST
    )


def ort_device(device: Device) -> tuple[str, int]:
    """ONNX Runtime's ``(device_type, device_id)`` for an xdevice device.

    >>> ort_device(Device("gpu", 1))
    ('cuda', 1)
    """
    return ("cuda", device.index) if device.kind == "gpu" else ("cpu", 0)


def bind_in_place(binding: Any, name: str, value: Any, device: Device, dtype: str) -> Any:
    """Bind the framework array ``value`` (on ``device``, of numpy dtype name ``dtype``), or a
    :class:`DevicePointer`, as input ``name`` of ``binding`` by its data pointer; returns what
    was bound, which
    the caller keeps alive until the run returns. Call ``binding.synchronize_inputs()`` after
    the last input is bound.
    """
    import numpy as np

    if isinstance(value, DevicePointer):
        device_type, device_id = ort_device(value.device)
        binding.bind_input(name, device_type, device_id, np.dtype(value.dtype), list(value.shape), value.pointer)
        return value
    engine = _registry.backend(backend_of(value))
    dense = engine.dense(value)
    device_type, device_id = ort_device(device)
    binding.bind_input(
        name, device_type, device_id, np.dtype(dtype), [int(d) for d in dense.shape], engine.data_pointer(dense)
    )
    return dense
