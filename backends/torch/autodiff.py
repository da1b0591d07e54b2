"""Gradients through torch autograd; ``jit`` is the identity because torch runs eagerly."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from xdevice._errors import XDeviceError, message
from xdevice.backends._model_io import map_leaves

if TYPE_CHECKING:
    from xdevice.backends.torch.ops import TorchOps


class Autodiff:
    ops: ClassVar[TorchOps]  # the assembled backend's

    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        # fresh leaves: the caller's tensors keep their own requires_grad and .grad untouched
        leaves = {name: self.ops.asarray(value).detach() for name, value in params.items()}
        for leaf in leaves.values():
            leaf.requires_grad_(leaf.is_floating_point() or leaf.is_complex())  # ints get zeros
        with torch.enable_grad():  # a caller's no_grad must not silence the gradient
            out = fn(leaves, *args)
        out, aux = out if has_aux else (out, None)
        value, grads = self._grad(out, leaves)
        return ((value, detached(aux)) if has_aux else value), grads

    def _grad(self, out: Any, leaves: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        if not isinstance(out, torch.Tensor) or not out.requires_grad:  # params not used at all
            return out, {name: torch.zeros_like(leaf) for name, leaf in leaves.items()}
        if out.numel() != 1:
            raise XDeviceError(message("value_and_grad needs a scalar", received=f"shape {tuple(out.shape)}"))
        wanted = [name for name, leaf in leaves.items() if leaf.requires_grad]
        grads = dict(zip(wanted, torch.autograd.grad(out, [leaves[n] for n in wanted], allow_unused=True)))
        return out.detach(), {
            name: torch.zeros_like(leaf) if grads.get(name) is None else grads[name] for name, leaf in leaves.items()
        }

    def jit(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        return fn

    def capture(self, fn: Callable[..., Any], *example_args: Any) -> Callable[..., Any]:
        from torch.fx.experimental.proxy_tensor import make_fx

        leaves = torch.utils._pytree.tree_leaves(example_args)
        if not all(isinstance(leaf, torch.Tensor) for leaf in leaves):  # a constant would be baked in
            raise XDeviceError(
                message(
                    "Only tensors can be arguments of a captured torch program",
                    received=sorted({type(leaf).__name__ for leaf in leaves}),
                )
            )
        return make_fx(fn, tracing_mode="fake")(*example_args)  # fake tensors: no data read, none baked


def detached(tree: Any) -> Any:
    """``tree`` (dicts, lists, tuples) with every tensor in it detached from the graph."""
    return map_leaves(lambda value: value.detach() if isinstance(value, torch.Tensor) else value, tree)
