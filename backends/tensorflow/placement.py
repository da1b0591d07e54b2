"""TensorFlow tensors: ``tf.device`` is the context, ``tf.identity`` under it moves.

TensorFlow has no public data-pointer API; the pointer is read from a DLPack capsule.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import tensorflow as tf

from xdevice._device import Device, device
from xdevice.backends._dlpack import dlpack_data_pointer
from xdevice.backends._dtypes import is_numpy_bfloat16


class Placement:
    #: TensorFlow puts new arrays on GPU 0 when there is one: code that means another device
    #: (the CPU) enters :meth:`default_device` for it, even cpu:0 (DESIGN.md, say the device)
    defaults_to_gpu: ClassVar[bool] = True
    native_device: Callable[[Device], str]  # devices.py's, in the assembled backend

    def owns(self, x: Any) -> str | None:
        if isinstance(x, (tf.Tensor, tf.Variable)):
            return "array"
        if isinstance(x, (tf.Module, tf.types.experimental.PolymorphicFunction)) or _is_keras_layer(x):
            return "model"
        return "device" if isinstance(x, (tf.config.LogicalDevice, tf.config.PhysicalDevice)) else None

    def device_of(self, x: Any) -> Device:
        return device(x.device)

    def to_device(self, x: Any, device: Device) -> Any:
        if self.device_of(x) == device:
            return x
        with tf.device(self.native_device(device)):
            return tf.identity(x)

    def default_device(self, device: Device) -> contextlib.AbstractContextManager[Any]:
        return tf.device(self.native_device(device))

    def from_dlpack(self, x: Any) -> Any:
        if is_numpy_bfloat16(x):  # numpy cannot export bfloat16 through DLPack
            return tf.convert_to_tensor(x)
        return tf.experimental.dlpack.from_dlpack(x.__dlpack__())

    def dlpack_export(self, x: Any, stream: int | None, max_version: tuple[int, int] | None) -> Any:
        """``x``'s DLPack capsule for any consumer. TensorFlow refuses a consumer's stream
        (``__dlpack__(stream=...)`` raises, so torch's ``from_dlpack`` fails on it) and has
        no stream to offer, so on a GPU its queued work is finished first and the stream is
        dropped: the consumer then reads a buffer that is complete."""
        if self.device_of(x).kind == "gpu":
            tf.test.experimental.sync_devices()
        return x.__dlpack__()

    def data_pointer(self, x: Any) -> int:
        return dlpack_data_pointer(tf.experimental.dlpack.to_dlpack(x))

    def to_numpy(self, x: Any) -> Any:
        return x.numpy()

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> Any:
        return tf.zeros(shape, dtype=dtype)


def _is_keras_layer(x: Any) -> bool:
    """A Keras layer or model on Keras' TensorFlow backend (Keras 3 layers are not tf.Modules)."""
    keras = sys.modules.get("keras")
    return keras is not None and isinstance(x, keras.Layer) and keras.config.backend() == "tensorflow"
