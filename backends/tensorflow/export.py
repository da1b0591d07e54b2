"""ONNX export from TensorFlow: the model wrapped in a ``tf.function``, converted by tf2onnx.

Whatever the model is (a Keras 3 model, a ``tf.Module``, a ``tf.function``, any callable of
tensors), it is called inside a new ``tf.function`` whose input signature has a ``None``
batch, and ``tf2onnx.convert.from_function`` converts that. (``from_keras`` breaks on
Keras 3 ``Sequential`` models; a function works for all of them.) Keras models are called
with ``training=False``.

One handler is added: ``tf.nn.gelu`` computes with ``Erfc``, which tf2onnx 1.17 passes
through as an op ONNX does not have; it becomes ``1 - Erf(x)`` (``Erf`` is in every opset
tf2onnx writes).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import tensorflow as tf

from xdevice._device import Device, device
from xdevice._errors import ConversionError, message
from xdevice.backends._export import exporter_failed, record_output_names
from xdevice.backends._model_io import Inputs, call_with, flat_outputs, output_names

if TYPE_CHECKING:
    from xdevice.backends.tensorflow.ops import TensorflowOps

__all__ = ["Export"]


class Export:
    ops: ClassVar[TensorflowOps]  # the assembled backend's
    native_device: Callable[[Device], str]  # devices.py's, in the assembled backend

    def export_onnx(self, target: Any, example_inputs: tuple[Any, ...], opset: int, axes: list[dict[int, str]]) -> Any:
        import tf2onnx

        inputs = example_inputs if isinstance(example_inputs, Inputs) else Inputs.of(example_inputs)
        call = _inference_call(target, inputs)
        signature = [
            tf.TensorSpec(
                [None if a in found else size for a, size in enumerate(x.shape)],
                tf.as_dtype(x.dtype),
                name=_spec_name(name),
            )
            for name, x, found in zip(inputs.names, inputs, axes)
        ]
        names: list[str] = []

        def flat(*xs):
            y = call(*xs)
            names[:] = output_names(y)
            return flat_outputs(y)

        function = tf.function(flat, input_signature=signature)
        try:
            with warnings.catch_warnings():  # tf2onnx's use of deprecated TF and numpy APIs
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", FutureWarning)
                model, _ = tf2onnx.convert.from_function(
                    function, input_signature=signature, opset=opset, custom_op_handlers={"Erfc": (_erfc, [])}
                )
        except Exception as error:  # tf2onnx raises many types; each is reported the same way
            raise exporter_failed(
                "tf2onnx",
                error,
                "the model must trace under tf.function with a None batch "
                "(no Python int of the batch size); or try another opset",
            ) from error
        _fold_captures(model, function.get_concrete_function(), len(signature))
        record_output_names(model, names)
        return model

    def save_converted(
        self, imported: Any, specs: list[tuple[str, str, tuple]], examples: list[Any], path: os.PathLike, dynamic: bool
    ) -> None:
        module = tf.Module()
        module.weights = {name: tf.Variable(value, trainable=False) for name, value in imported.params.items()}
        signature = [
            tf.TensorSpec(
                [None if isinstance(d, str) else size for d, size in zip(shape, x.shape)], tf.as_dtype(dtype), name=name
            )
            for (name, dtype, shape), x in zip(specs, examples)
        ]

        @tf.function(input_signature=signature, autograph=False)  # tf ops only; errors reach us unwrapped
        def serve(*inputs):
            with tf.control_dependencies(_same_sizes(specs, inputs)):
                outputs = imported.apply(dict(module.weights), *(tf.identity(x) for x in inputs))
            return outputs[0] if len(outputs) == 1 else outputs

        serve.get_concrete_function()  # trace now: a refusal of the dynamic batch surfaces here
        module.serve = serve
        tf.saved_model.save(module, str(path), signatures={"serving_default": serve})

    def native_outputs(self, target: Any, inputs: tuple[Any, ...]) -> list[Any]:
        call = _inference_call(target, inputs if isinstance(inputs, Inputs) else Inputs.of(inputs))
        # TensorFlow runs ops on GPU 0 when there is one, CPU variables or not: say the device
        with tf.device(self.native_device(self.reference_device(target))):
            return [self.ops.to_numpy(y) for y in flat_outputs(call(*(tf.convert_to_tensor(x) for x in inputs)))]

    def reference_device(self, target: Any) -> Device:
        """Where ``native_outputs`` computes: the device of ``target``'s first variable (a
        ``tf.Module``'s, a Keras model's), cpu:0 for a model without any (a ``tf.function``,
        a function of tensors)."""
        for variable in getattr(target, "variables", None) or ():
            # a Keras variable holds a tf.Variable as its value (a tf.Variable's value is a method)
            native = variable if isinstance(variable, tf.Variable) else getattr(variable, "value", None)
            if isinstance(native, tf.Variable) and native.device:
                return device(native.device)
        return Device("cpu", 0)


def _same_sizes(specs: list[tuple[str, str, tuple]], inputs: tuple) -> list[Any]:
    """Run-time checks that the dimensions sharing a name have one size across inputs (a
    signature of ``None`` dims cannot say so; torch.export and jax.export check it themselves)."""
    first: dict[str, tuple[str, Any]] = {}
    checks = []
    for (name, _, shape), x in zip(specs, inputs):
        for axis, d in enumerate(shape):
            if not isinstance(d, str):
                continue
            size = tf.shape(x)[axis]
            if d not in first:
                first[d] = (f"{name}[{axis}]", size)
                continue
            where, expected = first[d]
            checks.append(
                tf.debugging.assert_equal(
                    size,
                    expected,
                    message=(f"dimension {d} has one size across inputs: {name}[{axis}] differs from {where}"),
                )
            )
    return checks


def _inference_call(target: Any, inputs: Inputs) -> Callable[..., Any]:
    """``target`` as a function of the flat input tensors, in inference mode: named inputs
    rebuilt into the dict (nested as given) a Keras model with dict inputs takes."""
    keras = sys.modules.get("keras")
    if keras is not None and isinstance(target, keras.Layer):
        if keras.backend.backend() != "tensorflow":
            raise ConversionError(
                message(
                    "This Keras model runs on another backend than TensorFlow",
                    expected="Keras with KERAS_BACKEND=tensorflow",
                    received=keras.backend.backend(),
                    fix="export it with that framework's exporter, or set KERAS_BACKEND=tensorflow",
                )
            )
        if inputs.named:
            return lambda *xs: target(inputs.rebuild(xs), training=False)
        # a multi-input Keras model takes its inputs as one list
        return lambda *xs: target(inputs.rebuild(xs)[0] if len(xs) == 1 else list(inputs.rebuild(xs)), training=False)
    if not callable(target):
        raise ConversionError(
            message(
                "Cannot export this object from TensorFlow",
                expected="a Keras model, a tf.Module with __call__, a tf.function or a function of tensors",
                received=type(target).__qualname__,
            )
        )
    return lambda *xs: call_with(target, inputs, xs, keywords=False)


def _spec_name(name: str) -> str:
    """A TensorSpec name from an input's name (TF allows letters, digits, ``_ . / -``)."""
    return re.sub(r"[^A-Za-z0-9_./-]", "_", name) or "input"


def _fold_captures(model: Any, concrete: Any, count: int) -> None:
    """Constants the traced function captured (a Keras Normalization layer's mean and
    variance, say), which tf2onnx writes as graph inputs, folded back into initializers."""
    from onnx import numpy_helper

    captured = {
        placeholder.name: value
        for placeholder, value in zip(concrete.graph.inputs[count:], concrete.captured_inputs)
        if value.dtype != tf.resource
    }
    extra = [v for v in model.graph.input if v.name in captured]
    for value in extra:
        model.graph.input.remove(value)
        model.graph.initializer.append(numpy_helper.from_array(np.asarray(captured[value.name]), value.name))


def _erfc(ctx: Any, node: Any, name: str, args: Any) -> None:
    """tf2onnx handler: ``Erfc(x)`` as ``1 - Erf(x)``."""
    from tf2onnx import utils

    node.type = "Erf"
    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.output[0]))
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype=dtype))
    complement = ctx.insert_new_node_on_output("Sub", node.output[0], name=utils.make_name(name))
    ctx.replace_inputs(complement, [one.output[0], node.output[0]])
