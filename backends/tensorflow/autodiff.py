"""TensorFlow autodiff: ``tf.GradientTape`` for gradients, ``tf.function`` to compile."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
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

    def jit(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        return Compiled(fn)

    def capture(self, fn: Callable[..., Any], *example_args: Any) -> Callable[..., Any]:
        # a function of tensors whose Python runs once, while traced (an imported graph's
        # interpreter): traced as written, without autograph. Converting it gains nothing, and
        # autograph's cache of converted functions once handed the interpreter's call of
        # ops.asarray another function's conversion (tests/converters/test_plan.py, after the
        # conformance suite had traced CumProd)
        return Compiled(fn, autograph=False)


class Compiled:
    """``fn`` under ``tf.function``, called the quick way. Each kind of call (how the arguments
    nest, their tensors' shapes and dtypes, their Python values) is traced once into a function
    of the flat list of tensors, and later calls of that kind hand their tensors straight to it:
    no matching of every argument against the traces, which costs a training step's ~20 tensors
    about a millisecond a call. Calls made inside another trace, and arguments or results it
    cannot take apart (variables, composite tensors, other objects), go through ``tf.function``
    itself: the same results, only slower.

    >>> import tensorflow as tf
    >>> double = Compiled(lambda tree, k: {name: v * k for name, v in tree.items()})
    >>> [double({"a": tf.constant(float(i))}, 2)["a"].numpy().item() for i in range(3)]
    [0.0, 2.0, 4.0]
    >>> double.traces  # once for every call with a scalar float32 under "a" and k=2
    1
    """

    def __init__(self, fn: Callable[..., Any], autograph: bool = True):
        # traces fn; called as it is when the quick way cannot be taken
        self.function = tf.function(fn, autograph=autograph)
        self.autograph = autograph
        self.traces = 0  # kinds of call traced the quick way
        self._calls: dict[Any, tuple[Any, Any] | None] = {}  # kind -> (flat function, result's layout)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not tf.executing_eagerly():  # inside another trace, which inlines tf.function's
            return self.function(*args, **kwargs)
        tensors: list[Any] = []
        try:
            kind = _layout((args, kwargs), tensors, arguments=True)
        except _CannotTakeApart:
            return self.function(*args, **kwargs)
        if kind not in self._calls:
            self._calls[kind] = self._trace(kind, tensors)
        traced = self._calls[kind]
        if traced is None:
            return self.function(*args, **kwargs)
        concrete, layout = traced
        # _call_flat (what ConcreteFunction.__call__ ends in, gradient tapes included) skips
        # binding the arguments to the traced signature, a Python check on each of them
        call_flat = getattr(concrete, "_call_flat", None)
        outputs = call_flat(tensors, concrete.captured_inputs) if call_flat else concrete(*tensors)
        return _rebuild(layout, iter(outputs))

    def _trace(self, kind: Any, tensors: list[Any]) -> tuple[Any, Any] | None:
        """``fn`` traced for calls of ``kind`` as a function of their flat tensors, and the
        layout of its result; None when the result cannot be taken apart."""
        layouts: list[Any] = []

        def flat(*inputs: Any) -> list[Any]:
            args, kwargs = _rebuild(kind, iter(inputs))
            outputs: list[Any] = []
            try:
                layouts.append(_layout(self.function.python_function(*args, **kwargs), outputs, arguments=False))
            except _CannotTakeApart:
                layouts.append(None)
            return outputs

        specs = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
        concrete = tf.function(flat, autograph=self.autograph).get_concrete_function(*specs)
        self.traces += 1
        return None if layouts[-1] is None else (concrete, layouts[-1])


class _CannotTakeApart(Exception):
    """A value :func:`_layout` does not know how to take apart."""


_PYTHON = (bool, int, float, str, type(None))  # values a trace keeps as constants, as tf.function does


def _layout(tree: Any, tensors: list[Any], arguments: bool) -> Any:
    """The layout of ``tree`` (nested dicts, lists and tuples), hashable: its nesting, each
    tensor's dtype and shape (appended to ``tensors``) and each Python value. ``arguments``:
    numpy arrays and scalars are tensors too (in a result they cannot be taken apart)."""
    kind = type(tree)
    if kind is dict:
        return (dict, tuple((key, _layout(value, tensors, arguments)) for key, value in tree.items()))
    if kind is tuple or kind is list:
        return (kind, tuple(_layout(value, tensors, arguments) for value in tree))
    if arguments and isinstance(tree, (np.ndarray, np.generic)):
        tree = tf.convert_to_tensor(tree)
    if isinstance(tree, tf.Tensor):
        tensors.append(tree)
        return (tf.Tensor, tree.dtype, tuple(tree.shape))
    if kind in _PYTHON:
        return (kind, tree)
    raise _CannotTakeApart(kind)


def _rebuild(layout: Any, tensors: Any) -> Any:
    """The tree that ``layout`` describes, its tensors taken in turn from the iterator ``tensors``."""
    kind, rest = layout[0], layout[1:]
    if kind is dict:
        return {key: _rebuild(value, tensors) for key, value in rest[0]}
    if kind is tuple or kind is list:
        return kind(_rebuild(value, tensors) for value in rest[0])
    if kind is tf.Tensor:
        return next(tensors)
    return rest[0]
