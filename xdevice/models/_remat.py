"""``remat``: a zoo model's block run so that training recomputes its activations in the backward pass.

A real-scale model (``bert``, ``gpt2``, ``llama``, ``vit``, ``resnet50``) built with
``remat=True`` runs each block, in training, through the op set's ``checkpoint``: the
backward pass keeps the blocks' inputs and recomputes what is inside one block at a time
(``torch.utils.checkpoint``, ``jax.checkpoint``, ``tf.recompute_grad``), for about one more
forward pass of compute. The outputs and the math are the same; inference and generation never
recompute.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["block"]


def block(ops: Any, fn: Callable[[Any, dict[str, Any]], Any], h: Any, params: dict[str, Any], prefix: str, remat: bool):
    """``fn(h, params)``, one block of a model; with ``remat``, through ``ops.checkpoint``, with
    the parameters named ``prefix...`` as its arguments (the arrays TensorFlow's
    ``recompute_grad`` differentiates; ``fn`` may close over arrays without a gradient)."""
    if not remat:
        return fn(h, params)
    names = [key for key in params if key.startswith(prefix)]

    def pure(h: Any, *values: Any) -> Any:
        return fn(h, dict(zip(names, values)))

    return ops.checkpoint(pure, h, *(params[key] for key in names))
