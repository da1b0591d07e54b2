"""JAX autodiff: ``jax.value_and_grad`` differentiates, ``jax.jit`` compiles."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


class Autodiff:
    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        # a flat dict is a pytree: the gradient comes back under the same names
        return jax.value_and_grad(fn, has_aux=has_aux)(params, *args)

    def jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return jax.jit(fn)
