"""TensorFlow models in the trainer: a Keras model or ``tf.Module`` as a program. The
trainer loads this module through the registry; the backend never imports it.

The model's ``trainable_variables`` are the params, assigned after each step; it is called
with ``training=`` when it takes it. TensorFlow places a variable once, when it is made, so
a model whose variables are elsewhere than the device asked for is refused.
"""

from __future__ import annotations

import inspect
from typing import Any

import tensorflow as tf

from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice.backends.training import Program

__all__ = ["ModuleProgram", "program"]


class ModuleProgram(Program):
    def __init__(self, module: Any, device: Device | None):
        variables = _tf_variables(module)
        if not variables:
            raise ConfigurationError(
                message(
                    "The TensorFlow model has no trainable variables",
                    fix="build it first (call it once on an example batch)",
                )
            )
        where = find(variables[0].device or "cpu", backend="tensorflow")
        if device is not None and device != where:  # TF places a variable when it is made, once
            raise ConfigurationError(
                message(
                    "The TensorFlow model's variables are not on the device asked for",
                    expected=str(device),
                    received=str(where),
                    fix=f"build the model under tf.device('{device}'), or leave device= out",
                )
            )
        params = {_variable_name(v, i): v for i, v in enumerate(variables)}
        super().__init__("tensorflow", where, params, {})
        self.module, self.variables = module, variables
        self.takes_training = "training" in inspect.signature(module.__call__).parameters or hasattr(
            module, "compute_output_shape"
        )  # a Keras layer or model

    def run(self, params, buffers, x, train):
        out = self.module(x, training=train) if self.takes_training else self.module(x)
        return out, buffers

    def write_back(self) -> None:
        for name, variable in zip(self.params, self.variables):
            if self.params[name] is not variable:
                variable.assign(self.params[name])
        self.params = dict(zip(self.params, self.variables))

    def set_precision(self, precision: str) -> None:
        if precision in ("bfloat16", "float16"):
            raise ConfigurationError(
                message(
                    f"{precision} for a Keras/tf.Module model is set when the model is built",
                    received=f"precision={precision!r}",
                    fix=f"build it under keras.mixed_precision.set_global_policy('mixed_{precision}') and pass "
                    "precision='float32', or train a zoo model",
                )
            )
        super().set_precision(precision)

    def result(self) -> Any:
        return self.module


def program(backend: Any, model: Any, device: Device | None) -> Program:
    """The program of a Keras model or ``tf.Module`` (already built on its device)."""
    return ModuleProgram(model, device)


def _tf_variables(module: Any) -> list:
    """The ``tf.Variable`` behind each trainable variable (Keras 3 wraps them in its own)."""
    return [v if isinstance(v, tf.Variable) else getattr(v, "value", v) for v in module.trainable_variables]


def _variable_name(variable: Any, index: int) -> str:
    """``<position>:<short name>`` (``001:bias``): where the variable sits among the model's
    trainable variables, not the layer names Keras generated (``sequential_1/dense_2/``
    for the same model built twice in one process), so a checkpoint loads into its twin."""
    name = getattr(variable, "path", None) or variable.name
    return f"{index:03d}:{name.split(':')[0].split('/')[-1]}"  # short names repeat across layers; the index does not
