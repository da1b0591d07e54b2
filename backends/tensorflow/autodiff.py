"""TensorFlow autodiff: ``tf.GradientTape`` for gradients, ``tf.function`` to compile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from xdevice._errors import XDeviceError, message


class Autodiff:
    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        params = {
            name: value if isinstance(value, tf.Variable) else tf.convert_to_tensor(value)
            for name, value in params.items()
        }
        with tf.GradientTape() as tape:
            # tensors need watching, and so do variables that are not trainable; integers
            # have no gradient (and TensorFlow logs a warning for each one watched)
            tape.watch([value for value in params.values() if value.dtype.is_floating])
            out = fn(params, *args)
            out, aux = out if has_aux else (out, None)
            out = tf.convert_to_tensor(out)
        if out.shape.num_elements() != 1:  # the tape would silently sum a non-scalar
            raise XDeviceError(message("value_and_grad needs a scalar", received=f"shape {out.shape}"))
        grads = tape.gradient(out, params, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        # gathers give IndexedSlices; callers get dense gradients shaped like their params
        grads = {name: tf.convert_to_tensor(grad) for name, grad in grads.items()}
        return ((out, aux) if has_aux else out), grads

    def jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return tf.function(fn)
