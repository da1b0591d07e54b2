"""JAX autodiff: ``jax.value_and_grad`` differentiates, ``jax.jit`` compiles.

``jit(fn, donate=(0, 1))`` donates those arguments' buffers to the outputs (``donate_argnums``):
XLA writes the new values over the old ones instead of holding both, and the arrays passed
in are deleted after the call. A trainer donates params and optimizer state on a GPU or TPU,
where it halves what the step holds (``Trainer``'s ``donating``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax


class Autodiff:
    donates = True  # jit(fn, donate=argnums) gives those arguments' buffers to the outputs

    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        # a flat dict is a pytree: the gradient comes back under the same names
        return jax.value_and_grad(fn, has_aux=has_aux)(params, *args)

    def jit(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        return jax.jit(fn, donate_argnums=donate)

    def own_copies(self, arrays: dict[str, Any]) -> dict[str, Any]:
        """Copies of ``arrays`` (same devices, same sharding) that a donating step may delete,
        leaving the originals, which may be a user's, as they are."""
        return {k: v.copy() if isinstance(v, jax.Array) else v for k, v in arrays.items()}
