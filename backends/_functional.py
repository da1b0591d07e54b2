"""Zoo models outside ``Model``: the functional ``(apply_fn, params)`` form for JAX and
numpy, and the forward pass every native module shares."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Functional", "functional_to_native", "functional_from_native", "forward"]


def forward(apply: Callable[..., Any], ops: Any, weights: dict[str, Any], x: Any, training: bool
            ) -> tuple[Any, dict[str, Any]]:
    """A zoo model's output and its updated buffers ({} in inference), for native modules."""
    if not training:
        return apply(ops, weights, x, train=False), {}
    return apply(ops, weights, x, train=True)


class Functional:
    """``apply_fn(params, x, train=False)``: a zoo model's pure function over one backend's ops.

    It carries the model's name and spec so ``from_native`` can rebuild the model.
    """

    def __init__(self, backend: str, name: str, spec: dict, apply: Callable[..., Any], ops: Any):
        self.backend, self.model_name, self.spec = backend, name, spec
        self._apply, self._ops = apply, ops

    def __call__(self, params: dict[str, Any], x: Any, train: bool = False) -> Any:
        return self._apply(self._ops, params, self._ops.asarray(x), train=train)

    def __repr__(self) -> str:
        return f"<{self.backend} apply_fn of zoo model {self.model_name!r}>"


def functional_to_native(backend: Any, name, spec, apply, params, trainable) -> tuple[Functional, dict]:
    return Functional(backend.name, name, spec, apply, backend.ops), dict(params)


def functional_from_native(backend: Any, native: Any):
    if not (isinstance(native, tuple) and len(native) == 2 and isinstance(native[0], Functional)):
        return None
    apply_fn, params = native
    if apply_fn.backend != backend.name:
        return None
    arrays = {key: backend.ops.to_numpy(value) for key, value in params.items()}
    device = backend.device_of(next(iter(params.values())))
    return apply_fn.model_name, apply_fn.spec, arrays, device
