"""A zoo model outside ``Model``: the functional ``(apply_fn, params)`` form, and the
forward pass that every backend's native module runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from xdevice.models._fit import check_input

__all__ = ["Functional", "native_forward"]


def native_forward(
    apply: Callable[..., Any], ops: Any, inputs: Callable[[Any, str], None] | None = None
) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """``forward(weights, x, training, **inputs) -> (output, updated buffers)`` ({} in
    inference): the zoo model ``apply`` over ``ops``, as ``Backend.to_native`` receives it;
    ``inputs`` are the keyword inputs the definition names besides ``x`` (``attention_mask``).
    ``inputs(x, weights' dtype)`` checks ``x`` first, so a torch module or a ``tf.Module``
    from ``to_native`` refuses what a ``Model`` refuses, in the same words."""

    def forward(weights: dict[str, Any], x: Any, training: bool, **extra: Any) -> tuple[Any, dict[str, Any]]:
        if inputs is not None and weights:
            inputs(x, ops.dtype(next(iter(weights.values()))))
        x = ops.asarray(x)  # numpy too, as a Model call takes it
        extra = {key: ops.asarray(value) for key, value in extra.items()}
        if not training:
            return apply(ops, weights, x, train=False, **extra), {}
        return apply(ops, weights, x, train=True, **extra)

    return forward


class Functional:
    """``apply_fn(params, x, train=False, **inputs)``: a zoo model's pure function over one
    backend's ops. ``x`` may be the dict ``{"x": x, **inputs}`` (how an exporter passes named
    inputs to a function).

    It carries the model's name and spec so ``from_native`` can rebuild the model, and names
    its backend (``__xdevice_backend__``), so the pair it makes is that backend's model.
    """

    def __init__(self, backend: str, name: str, spec: dict, apply: Callable[..., Any], ops: Any):
        self.backend, self.model_name, self.spec = backend, name, spec
        self._apply, self._ops = apply, ops

    @property
    def __xdevice_backend__(self) -> str:
        return self.backend

    def over(self, ops: Any) -> Functional:
        """The same function computed with another implementation of the op set (an
        exporter's, say)."""
        return Functional(self.backend, self.model_name, self.spec, self._apply, ops)

    def __call__(self, params: dict[str, Any], x: Any, train: bool = False, **inputs: Any) -> Any:
        if isinstance(x, dict):
            inputs = {**x, **inputs}
            x = inputs.pop("x")
        if params:  # checked as a Model call checks it (under jax.jit, once per trace)
            weights = self._ops.dtype(next(iter(params.values())))
            check_input(x, self.model_name, self.spec, self.backend, self._ops, weights)
        extra = {key: self._ops.asarray(value) for key, value in inputs.items()}
        return self._apply(self._ops, params, self._ops.asarray(x), train=train, **extra)

    def __repr__(self) -> str:
        return f"<{self.backend} apply_fn of zoo model {self.model_name!r}>"
