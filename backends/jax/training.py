"""JAX models in the trainer: an ``(apply, params)`` pair as a program, ``params`` any nested
dict of arrays; training hands back a new pair. The trainer loads this module through the
registry; the backend never imports it.
"""

from __future__ import annotations

from typing import Any

import jax

from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice.backends.training import Program

__all__ = ["PairProgram", "program"]


class PairProgram(Program):
    def __init__(self, backend: Any, apply: Any, params: dict, device: Device | None):
        flat = _flatten(params)
        first = next(iter(jax.tree_util.tree_leaves(params)))  # numpy leaves: JAX's default device
        where = device or find(
            first.devices().pop() if hasattr(first, "devices") else jax.local_devices()[0], backend="jax"
        )
        super().__init__(
            "jax", where, {k: backend.to_device(backend.ops.asarray(v), where) for k, v in flat.items()}, {}
        )
        self.apply, self.nested = apply, _is_nested(params)

    def run(self, params, buffers, x, train):
        return self.apply(_unflatten(params) if self.nested else params, x), buffers

    def result(self) -> Any:
        return self.apply, _unflatten(self.params) if self.nested else dict(self.params)


def program(backend: Any, model: Any, device: Device | None) -> Program:
    """The program of an ``(apply, params)`` pair, ``params`` a (nested) dict of arrays."""
    if not (isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], dict)):
        raise ConfigurationError(
            message(
                "A JAX model trains as an (apply, params) pair",
                received=type(model).__qualname__,
                expected="(apply, params) with params a dict (nested dicts allowed) of arrays",
                fix="pass (apply_fn, params): the trainer hands back a new pair",
            )
        )
    return PairProgram(backend, model[0], model[1], device)


def _is_nested(params: dict) -> bool:
    return any(isinstance(v, dict) for v in params.values())


def _flatten(tree: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def _unflatten(flat: dict) -> dict:
    tree: dict = {}
    for name, value in flat.items():
        *path, leaf = name.split("/")
        node = tree
        for part in path:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree
