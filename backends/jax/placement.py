"""JAX arrays: ``jax.device_put`` moves, ``jax.default_device`` is the context."""

from __future__ import annotations

import contextlib
import functools
import sys
import types
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from xdevice._device import Device
from xdevice._errors import ConversionError, message
from xdevice.backends._dtypes import is_numpy_bfloat16


class Placement:
    #: JAX puts new arrays on GPU 0 when there is one: code that means another device
    #: (the CPU) enters :meth:`default_device` for it, even cpu:0 (DESIGN.md, say the device)
    defaults_to_gpu: ClassVar[bool] = True
    native_device: Callable[[Device], jax.Device]  # devices.py's, in the assembled backend
    device_from_native: Callable[[jax.Device], Device]

    def owns(self, x: Any) -> str | None:
        if isinstance(x, jax.Array):
            return "array"
        if isinstance(x, jax.Device):
            return "device"
        if isinstance(x, _FUNCTIONS) or _is_module(x) or _is_pair(x):
            return "model"  # JAX is the framework whose models are functions (and modules that are pytrees)
        return None

    def device_of(self, x: Any) -> Device:
        held = list(x.devices())
        if len(held) != 1:
            raise ConversionError(
                message(
                    "This JAX array is sharded over several devices",
                    expected="a single-device array",
                    received=sorted(str(self.device_from_native(d)) for d in held),
                    fix="read x.sharding, or take one shard: x.addressable_shards[0].data",
                )
            )
        return self.device_from_native(held[0])

    def to_device(self, x: Any, device: Device) -> Any:
        return jax.device_put(x, self.native_device(device))

    def default_device(self, device: Device) -> contextlib.AbstractContextManager[Any]:
        return jax.default_device(self.native_device(device))

    def from_dlpack(self, x: Any) -> Any:
        if is_numpy_bfloat16(x):  # numpy cannot export bfloat16 through DLPack
            return jnp.asarray(x)
        return jnp.from_dlpack(x)

    def dlpack_export(self, x: Any, stream: int | None, max_version: tuple[int, int] | None) -> Any:
        """``x``'s DLPack capsule for a consumer that reads on ``stream``: JAX makes that
        stream wait for the array; a consumer with no stream (TensorFlow) gets it once ready."""
        if stream is None:
            x.block_until_ready()
        return x.__dlpack__(stream=stream, max_version=max_version)

    def data_pointer(self, x: Any) -> int:
        return int(x.unsafe_buffer_pointer())

    def is_dense(self, x: Any) -> bool:
        # An array JAX took from a strided DLPack buffer without a copy (a transposed NumPy
        # view, 64-byte aligned) keeps that buffer's layout and exports its strides: a consumer
        # that takes only row-major buffers (TensorFlow) refuses it. Its layout says so.
        layout = getattr(getattr(x, "format", None), "layout", None)
        order = getattr(layout, "major_to_minor", None)
        return order is None or tuple(order) == tuple(range(len(order)))

    def dense(self, x: Any) -> Any:
        return x if self.is_dense(x) else jnp.array(x, copy=True)  # a copy has the default layout

    def to_numpy(self, x: Any) -> Any:
        return np.asarray(x)

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        from xdevice.backends.jax.ops import jax_dtype  # maps 64-bit names when x64 is off

        return jnp.zeros(shape, dtype=jax_dtype(dtype))


#: plain Python functions (and their bound or partial forms) and jitted ones are JAX models
_FUNCTIONS = (types.FunctionType, types.MethodType, functools.partial, jax.stages.Wrapped)


def _is_module(x: Any) -> bool:
    """A Flax NNX module or an equinox module: callable models that hold their own weights."""
    nnx, eqx = sys.modules.get("flax.nnx"), sys.modules.get("equinox")
    return (nnx is not None and isinstance(x, nnx.Module)) or (eqx is not None and isinstance(x, eqx.Module))


def _is_pair(x: Any) -> bool:
    """An ``(apply_fn, params)`` pair: a callable and any pytree holding JAX or numpy arrays (a
    dict, a Flax NNX ``State``, Linen's variables, an equinox module) and no other framework's."""
    if not (isinstance(x, tuple) and len(x) == 2 and callable(x[0])):
        return False
    leaves = jax.tree_util.tree_leaves(x[1])
    ours = [leaf for leaf in leaves if isinstance(leaf, (jax.Array, np.ndarray, np.generic))]
    foreign = [leaf for leaf in leaves if type(leaf).__module__.split(".")[0] in ("torch", "tensorflow")]
    return bool(ours) and not foreign
