"""``to_native`` / ``from_native``: a zoo model as the framework's own object, and back.

- ``"torch"``: a ``torch.nn.Module`` whose weights are registered parameters and buffers
  under the canonical names (``state_dict()`` keys equal the zoo names), so any torch
  optimizer trains it; ``module.train()`` / ``.eval()`` choose batch statistics.
- ``"tensorflow"``: a ``tf.Module`` holding one ``tf.Variable`` per name (buffers are
  non-trainable variables); ``module(x, training=True)`` updates them.
- ``"jax"`` (and ``"numpy"``): ``(apply_fn, params)``, ``params`` a flat dict pytree and
  ``apply_fn(params, x, train=False)`` pure, as JAX code expects. A backend whose
  ``Backend.to_native`` makes no module gets this form.

``from_native`` reads the weights back, exactly, into a :class:`Model` on that framework.
"""

from __future__ import annotations

import functools
from typing import Any

from xdevice import _registry
from xdevice._errors import ConversionError, message
from xdevice.models._fit import check_input, takes_tokens
from xdevice.models._functional import Functional, native_forward
from xdevice.models._model import Model, _place

__all__ = ["to_native", "from_native"]


def to_native(model: Model, backend: str | None = None) -> Any:
    """``model`` as ``backend``'s own trainable object (see the module docstring).

    >>> from xdevice import models
    >>> apply_fn, params = to_native(models.build("mlp", hidden=[8]), "numpy")
    >>> apply_fn(params, models.build("mlp", hidden=[8]).example_input(3)).shape
    (3, 10)
    """
    name = backend or model.backend
    placed = model if name == model.backend else model.to(name)
    target = _registry.backend(name)
    takes_tokens(placed.name)  # resolved here, not first inside a forward that torch.compile traces
    inputs = functools.partial(_check_input, name=placed.name, spec=placed.spec, backend=name, ops=target.ops)
    forward = native_forward(placed.apply, target.ops, inputs)
    module = target.to_native(placed.name, placed.spec, forward, placed.params, placed.trainable)
    if module is not None:
        return module
    return Functional(name, placed.name, placed.spec, placed.apply, target.ops), dict(placed.params)


def from_native(native: Any) -> Model:
    """The :class:`Model` inside an object ``to_native`` made (possibly trained since).

    Raises:
        ConversionError: ``native`` was not made by ``to_native``.
    """
    if isinstance(native, tuple) and len(native) == 2 and isinstance(native[0], Functional):
        apply_fn, params = native
        backend = _registry.backend(apply_fn.backend)
        arrays = {key: backend.ops.to_numpy(value) for key, value in params.items()}
        return _place(
            apply_fn.model_name,
            apply_fn.spec,
            arrays,
            backend.name,
            backend.device_of(next(iter(params.values()))),
            None,
        )
    found = _registry.owner(native)
    made = found[0].from_native(native) if found is not None and found[1] == "model" else None
    if found is None or made is None:
        raise ConversionError(
            message(
                "Not a model made by xdevice.models.to_native",
                expected="a module or (apply_fn, params) pair from to_native",
                received=type(native).__qualname__,
                fix="wrap your weights with xdevice.models.build(...) and to_native(...) first",
            )
        )
    name, spec, arrays, device = made
    return _place(name, spec, arrays, found[0].name, device, None)


def _check_input(x: Any, weights: str, *, name: str, spec: dict, backend: str, ops: Any) -> None:
    check_input(x, name, spec, backend, ops, weights)
