"""JAX arrays: ``jax.device_put`` moves, ``jax.default_device`` is the context."""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xdevice._device import Device, device
from xdevice._errors import ConversionError, message
from xdevice.backends._common import is_numpy_bfloat16


class Placement:
    def is_array(self, x: Any) -> bool:
        return isinstance(x, jax.Array)

    def device_of(self, x: Any) -> Device:
        held = list(x.devices())
        if len(held) != 1:
            raise ConversionError(message(
                "This JAX array is sharded over several devices", expected="a single-device array",
                received=sorted(str(device(d)) for d in held),
                fix="read x.sharding, or take one shard: x.addressable_shards[0].data"))
        return device(held[0])

    def to_device(self, x: Any, device: Device) -> Any:
        return jax.device_put(x, self.native_device(device))

    def default_device(self, device: Device) -> contextlib.AbstractContextManager[Any]:
        return jax.default_device(self.native_device(device))

    def from_dlpack(self, x: Any) -> Any:
        if is_numpy_bfloat16(x):  # numpy cannot export bfloat16 through DLPack
            return jnp.asarray(x)
        return jnp.from_dlpack(x)

    def data_pointer(self, x: Any) -> int:
        return int(x.unsafe_buffer_pointer())

    def to_numpy(self, x: Any) -> Any:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        from xdevice.backends.jax.ops import jax_dtype  # maps 64-bit names when x64 is off

        return jnp.zeros(shape, dtype=jax_dtype(dtype))
