"""NumPy arrays: always on cpu:0; DLPack in through ``np.from_dlpack``."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from xdevice._device import Device


class Placement:
    def owns(self, x: Any) -> str | None:
        return "array" if isinstance(x, np.ndarray) else None

    def device_of(self, x: Any) -> Device:
        return Device("cpu", 0)

    def to_device(self, x: Any, device: Device) -> Any:
        return x  # find() has already refused anything but cpu:0

    def default_device(self, device: Device) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def from_dlpack(self, x: Any) -> Any:
        return x if isinstance(x, np.ndarray) else np.from_dlpack(x)

    def data_pointer(self, x: Any) -> int:
        return int(x.__array_interface__["data"][0])

    def to_numpy(self, x: Any) -> Any:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        return np.zeros(shape, dtype=dtype)

    def is_dense(self, x: Any) -> bool:
        return bool(x.flags.c_contiguous)

    def dense(self, x: Any) -> Any:
        return np.ascontiguousarray(x)
