"""A zoo model as a ``tf.Module``: one ``tf.Variable`` per canonical name."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from xdevice._device import device


class ZooModule(tf.Module):
    """A zoo model as a TensorFlow module; buffers are non-trainable variables.

    ``module(x, training=True)`` normalises with batch statistics and assigns the new running
    statistics to the buffer variables, as a Keras ``BatchNormalization`` layer does.

    The inputs a text model takes besides ``x`` (its definition's ``INPUTS``) are keyword
    arguments, ``module(x, attention_mask=mask)``, or come with ``x`` in one dict, as a Keras
    model takes named inputs: ``module({"x": x, "attention_mask": mask})``. They are passed on
    to ``forward`` only when given (a ``forward`` that takes them is the one export builds).
    """

    def __init__(self, name: str, spec: dict, forward, params: dict[str, Any], trainable: list[str]):
        super().__init__(name=name)
        self.model_name, self.spec = name, spec
        self._zoo_forward = forward
        self.weights = {key: _variable(key, value, key in trainable) for key, value in params.items()}

    def __call__(self, x: Any, training: bool = False, **inputs: Any) -> Any:
        if isinstance(x, dict):
            inputs = {**x, **inputs}
            x = inputs.pop("x")
        y, updates = self._zoo_forward(dict(self.weights), x, training, **inputs)
        for key, value in updates.items():
            self.weights[key].assign(value)
        return y


class Native:
    def to_native(self, name: str, spec: dict, forward, params: dict[str, Any], trainable: list[str]) -> Any:
        return ZooModule(name, spec, forward, params, trainable)

    def from_native(self, native: Any):
        if not isinstance(native, ZooModule):
            return None
        arrays = {key: variable.numpy() for key, variable in native.weights.items()}
        return native.model_name, native.spec, arrays, device(next(iter(native.weights.values())).device)


def _variable(key: str, value: Any, trainable: bool) -> tf.Variable:
    """A variable on the device ``value`` is on (the zoo model's), not TensorFlow's default
    device, which is GPU 0 wherever there is one."""
    where = getattr(value, "device", "")
    if not where:  # host data: TensorFlow's placement
        return tf.Variable(value, trainable=trainable, name=key)
    with tf.device(where):
        return tf.Variable(value, trainable=trainable, name=key)
