"""JAX models in the trainer: an ``(apply, params)`` pair (``params`` any pytree of arrays), a
Flax NNX module or an equinox module, each handed back in the form it came in. The trainer loads
this module through the registry; the backend never imports it (nor Flax, nor equinox: a module
of theirs exists only once they are imported).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import jax

from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice.backends.training import Program

__all__ = ["ModuleProgram", "PairProgram", "output_shape", "program", "takes_host_batches"]


class _Tree:
    """A pytree as a flat dict of named leaves (``"hidden/w"``, ``"layers/0/kernel"``) and back."""

    def __init__(self, tree: Any, keep: Any = lambda leaf: True):
        paths, self.treedef = jax.tree_util.tree_flatten_with_path(tree)
        self.names = [_name(path) for path, _ in paths]
        if len(set(self.names)) != len(self.names):  # keys that hold "/" themselves
            self.names = [jax.tree_util.keystr(path) for path, _ in paths]
        self.leaves = [leaf for _, leaf in paths]
        self.kept = [keep(leaf) for leaf in self.leaves]  # the rest is held fixed (an RNG key)

    def flat(self) -> dict:
        return {n: leaf for n, leaf, k in zip(self.names, self.leaves, self.kept) if k}

    def rebuild(self, flat: dict) -> Any:
        return self.treedef.unflatten(
            [flat[n] if k else leaf for n, leaf, k in zip(self.names, self.leaves, self.kept)]
        )


def _name(path: tuple) -> str:
    parts = [str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", key)))) for key in path]
    if len(parts) > 1 and parts[-1] == "value":  # an NNX variable's array
        parts.pop()
    return "/".join(parts)


class _JaxProgram(Program):
    def __init__(self, backend: Any, params: dict, buffers: dict, device: Device | None):
        held = [leaf.devices().pop() for leaf in [*params.values(), *buffers.values()] if hasattr(leaf, "devices")]
        where = device or find(held[0] if held else jax.local_devices()[0], backend="jax")  # numpy: the default

        def placed(arrays: dict) -> dict:
            return {k: backend.to_device(backend.ops.asarray(v), where) for k, v in arrays.items()}

        super().__init__("jax", where, placed(params), placed(buffers))


class PairProgram(_JaxProgram):
    def __init__(self, backend: Any, apply: Any, params: Any, device: Device | None):
        self.apply, self.tree = apply, _Tree(params)
        super().__init__(backend, self.tree.flat(), {}, device)

    def run(self, params, buffers, x, train):
        return self.apply(self.tree.rebuild(params), x), buffers

    def result(self) -> Any:
        return self.apply, self.tree.rebuild(self.params)


class ModuleProgram(_JaxProgram):
    """A Flax NNX module (its ``nnx.Param`` variables trained, the others carried as buffers,
    updated in place) or an equinox module (its inexact arrays trained; a new module back)."""

    def __init__(self, backend: Any, module: Any, device: Device | None):
        self.module = module
        self.nnx = _is_nnx(module)
        if self.nnx:
            from flax import nnx

            self.graph, params, rest = nnx.split(module, nnx.Param, ...)
            self.rest = _Tree(rest, keep=lambda leaf: not _is_key(leaf))
            buffers = self.rest.flat()
        else:
            import equinox as eqx

            params, self.static = eqx.partition(module, eqx.is_inexact_array)
            buffers = {}
        self.tree = _Tree(params)
        super().__init__(backend, self.tree.flat(), buffers, device)

    def _built(self, params: dict, buffers: dict) -> Any:
        if self.nnx:
            from flax import nnx

            return nnx.merge(self.graph, self.tree.rebuild(params), self.rest.rebuild(buffers))
        import equinox as eqx

        return eqx.combine(self.tree.rebuild(params), self.static)

    def run(self, params, buffers, x, train):
        module = self._built(params, buffers)
        if not self.nnx:
            return module(x), buffers
        from flax import nnx

        module.train() if train else module.eval()  # Dropout, BatchNorm: a fresh module's flags
        out = module(x)
        _, _, rest = nnx.split(module, nnx.Param, ...)  # BatchNorm's statistics, RNG counts
        return out, _Tree(rest, keep=lambda leaf: not _is_key(leaf)).flat()

    def write_back(self) -> None:
        if self.nnx:
            from flax import nnx

            nnx.update(self.module, self.tree.rebuild(self.params), self.rest.rebuild(self.buffers))

    def result(self) -> Any:
        if self.nnx:
            self.write_back()
            return self.module
        return self._built(self.params, self.buffers)


def program(backend: Any, model: Any, device: Device | None) -> Program:
    """The program of an ``(apply, params)`` pair (``params`` any pytree of arrays: a nested
    dict, an NNX ``State``, an ``eqx.partition``-ed module), a Flax NNX module or an equinox
    module."""
    if _is_nnx(model) or _is_eqx(model):
        return ModuleProgram(backend, model, device)
    if not (
        isinstance(model, tuple) and len(model) == 2 and callable(model[0]) and jax.tree_util.tree_leaves(model[1])
    ):
        raise ConfigurationError(
            message(
                "A JAX model trains as an (apply, params) pair, a Flax NNX module or an equinox module",
                received=type(model).__qualname__,
                expected="(apply, params) with params a pytree of arrays (a dict, nested dicts, an NNX State)",
                fix="pass (apply_fn, params) or the nnx.Module / eqx.Module itself: it comes back in that form",
            )
        )
    return PairProgram(backend, model[0], model[1], device)


def takes_host_batches(backend: Any, device: Device) -> bool:
    """Whether the trainer hands its compiled step on ``device`` the numpy batches as they are.

    ``jax.jit`` moves numpy arguments to where the step runs itself, in its C++ dispatch, for
    less than ``jnp.asarray`` and ``device_put`` of each first (``benchmarks/fit_overhead.py``
    times ``fit`` against a hand-written jitted loop). Only on JAX's default device, and only
    a CPU: there a step runs where numpy arguments land even when no parameter is committed
    to a device, and there is no copy to run ahead of the step (a GPU's batches keep being
    placed, by the prefetcher's thread).
    """
    native = backend.native_device(device)
    return native.platform == "cpu" and jax.config.jax_default_device is None and native == jax.devices()[0]


def output_shape(backend: Any, fn: Callable[..., Any], *args: Any) -> tuple[int, ...]:
    """The shape of the array ``fn(*args)`` returns, from ``jax.eval_shape``: ``fn`` traced on
    the arguments' shapes and dtypes, nothing computed, no array made (a sharded or split
    argument counts as the global array it is, in every process, with no exchange).

    >>> import jax.numpy as jnp
    >>> output_shape(None, lambda w, x: x @ w, jnp.ones((4, 3)), jnp.ones((2, 4)))
    (2, 3)
    """
    return tuple(int(n) for n in jax.eval_shape(fn, *args).shape)


def _is_nnx(model: Any) -> bool:
    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(model, nnx.Module)


def _is_eqx(model: Any) -> bool:
    eqx = sys.modules.get("equinox")
    return eqx is not None and isinstance(model, eqx.Module)


def _is_key(leaf: Any) -> bool:
    """A typed PRNG key (an NNX ``RngKey``): not an array the trainer can move or save."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
