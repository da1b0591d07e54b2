"""ONNX export from JAX: jax2onnx traces a function of the inputs, weights closed over.

The model is an ``(apply_fn, params)`` pair or a plain function of arrays; the params become
initializers. A dynamic batch is a JAX symbolic dimension named ``batch``, shared by every
input. Zoo models trace over :class:`ExportOps`, which computes the same functions as the
JAX op set in forms that jax2onnx 0.17 lowers correctly (see each method); a user's own
function is traced as written.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from xdevice._device import Device
from xdevice.backends._export import as_function, exporter_failed, identifier, record_output_names
from xdevice.backends._model_io import Inputs, call_with, flat_outputs, output_names
from xdevice.backends._shapes import as_tuple, pool_padding
from xdevice.backends.jax.ops import JaxOps, _lowest

__all__ = ["Export", "ExportOps"]


class ExportOps(JaxOps):
    """The JAX op set, with two ops reformulated for jax2onnx (same results)."""

    def take(self, x: Any, indices: Any, axis: int = 0) -> Any:
        # mode="wrap" computes indices % n with an integer lax.rem, whose jax2onnx lowering
        # fails on a symbolic batch. Wrapping negatives once and gathering is the op's contract
        # (numpy's take: -n <= index < n).
        if isinstance(indices, (int, np.integer)):
            return super().take(x, indices, axis)
        indices = jnp.asarray(indices)
        size = np.shape(x)[axis]
        return jnp.take(x, jnp.where(indices < 0, indices + size, indices), axis=axis, mode="clip")

    def max_pool(
        self, x: Any, window: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False
    ) -> Any:
        # jax2onnx lowers a reduce_window over (N, C, *spatial) to an ONNX MaxPool of rank
        # len(spatial) + 2, which ONNX Runtime cannot run beyond 3 spatial axes. Folding N and C
        # into one axis keeps the pool at len(spatial) + 1.
        shape = np.shape(x)
        dims = len(shape) - 2
        window, dilation = as_tuple(window, dims), as_tuple(dilation, dims)
        stride = as_tuple(stride or window, dims)
        pads = pool_padding(padding, shape[2:], window, stride, dilation, ceil_mode)
        folded = jnp.reshape(x, (-1, *shape[2:]))
        y = lax.reduce_window(
            folded,
            _lowest(x.dtype),
            lax.max,
            (1, *window),
            (1, *stride),
            ((0, 0), *pads),
            window_dilation=(1, *dilation),
        )
        return jnp.reshape(y, (-1, shape[1], *np.shape(y)[1:]))


_EXPORT_OPS = ExportOps()


class Export:
    ops: ClassVar[JaxOps]  # the assembled backend's
    device_of: Callable[[Any], Device]  # placement.py's, in the assembled backend
    default_device: Callable[[Device], AbstractContextManager[Any]]

    def export_onnx(self, target: Any, example_inputs: tuple[Any, ...], opset: int, axes: list[dict[int, str]]) -> Any:
        from jax2onnx import to_onnx

        inputs = example_inputs if isinstance(example_inputs, Inputs) else Inputs.of(example_inputs)
        function = as_function(_for_export(target))
        double = any(np.dtype(x.dtype) == np.float64 for x in inputs)
        names: list[str] = []

        def flat(*xs):
            y = call_with(function, inputs, xs, keywords=False)
            names[:] = output_names(y)
            return tuple(flat_outputs(y))

        bounds: list[str] = []
        while True:
            scope = jax.export.SymbolicScope(bounds)  # one symbol per name, shared by every input
            specs = [
                jax.ShapeDtypeStruct(
                    jax.export.symbolic_shape(
                        ", ".join(found.get(a, str(size)) for a, size in enumerate(x.shape)), scope=scope
                    )
                    if found
                    else x.shape,
                    x.dtype,
                )
                for x, found in zip(inputs, axes)
            ]
            try:
                with warnings.catch_warnings():  # jax2onnx's own deprecation notices
                    warnings.simplefilter("ignore", DeprecationWarning)
                    warnings.simplefilter("ignore", FutureWarning)
                    model = to_onnx(flat, specs, opset=opset, enable_double_precision=double)
                break
            except Exception as error:  # jax2onnx raises many types; each is reported the same way
                found = _bound(str(error))  # a sequence bounded by a table: say so, as save_converted does
                if found is not None and found not in bounds and len(bounds) <= 8:
                    bounds.append(found)
                    continue
                raise exporter_failed(
                    "jax2onnx",
                    error,
                    "a JAX primitive without a jax2onnx lowering: rewrite that "
                    "part with other jax.numpy / lax ops, or try another opset",
                ) from error
        record_output_names(model, names)
        return model

    def save_converted(
        self, imported: Any, specs: list[tuple[str, str, tuple]], examples: list[Any], path: os.PathLike, dynamic: bool
    ) -> None:
        def serve(*inputs):
            outputs = imported.apply(imported.params, *inputs)
            return outputs[0] if len(outputs) == 1 else outputs

        bounds: list[str] = []
        while True:
            scope = jax.export.SymbolicScope(bounds)  # one scope: a name means one size across inputs
            args = []
            for (_, _dtype, shape), example in zip(specs, examples):
                dims = example.shape
                if dynamic and any(isinstance(d, str) for d in shape):
                    dims = jax.export.symbolic_shape(
                        ", ".join(identifier(d) if isinstance(d, str) else str(d) for d in shape), scope=scope
                    )
                args.append(jax.ShapeDtypeStruct(dims, example.dtype))
            try:
                exported = jax.export.export(jax.jit(serve))(*args)
                break
            except Exception as error:
                # a table of n rows sliced to a symbolic length gives min(n, length) rows, which
                # JAX cannot equate with length: the graph only works for length <= n, so say
                # so (torch.export infers the same bound itself)
                found = _bound(str(error))
                if found is None or found in bounds or len(bounds) > 8:
                    raise
                bounds.append(found)
        Path(path).write_bytes(exported.serialize())

    def one_example(self, target: Any, inputs: tuple[Any, ...]) -> Any:
        """``jax.vmap`` of ``target`` when it takes one example: its shapes do not trace with
        axis 0 a symbolic ``batch`` (an equinox ``MLP(in_size=12)`` on a ``(12,)`` vector
        contracts that axis with its weights), but do with a symbolic batch added in front."""
        inputs = inputs if isinstance(inputs, Inputs) else Inputs.of(inputs)
        function = as_function(_for_export(target))
        if not all(np.ndim(x) for x in inputs):
            return None

        def traces(fn: Any, added: bool) -> bool:
            (batch,) = jax.export.symbolic_shape("batch")
            specs = [jax.ShapeDtypeStruct((batch, *(x.shape if added else x.shape[1:])), x.dtype) for x in inputs]
            try:
                jax.eval_shape(lambda *xs: call_with(fn, inputs, xs, keywords=False), *specs)
            except Exception:  # noqa: BLE001 - any failure to trace (a shape error, a size it needs) is an answer
                return False
            return True

        if traces(function, added=False):
            return None
        batched = jax.vmap(function)
        return batched if traces(batched, added=True) else None

    def native_outputs(self, target: Any, inputs: tuple[Any, ...]) -> list[Any]:
        inputs = inputs if isinstance(inputs, Inputs) else Inputs.of(inputs)
        with self.default_device(self.reference_device(target)):  # not GPU 0 for weights on the CPU
            y = call_with(as_function(target), inputs, list(inputs), keywords=False)
            return [self.ops.to_numpy(leaf) for leaf in flat_outputs(y)]

    def reference_device(self, target: Any) -> Device:
        """Where ``native_outputs`` computes: the device of ``target``'s first single-device
        array (a pair's params, an equinox or Flax NNX module's), cpu:0 when it holds none."""
        for leaf in jax.tree_util.tree_leaves(target):
            if isinstance(leaf, jax.Array) and len(leaf.devices()) == 1:
                return self.device_of(leaf)
        return Device("cpu", 0)


def _for_export(target: Any) -> Any:
    """A zoo model's pair with its function over :class:`ExportOps` (a zoo ``apply_fn`` can be
    computed ``over`` other ops); anything else as is."""
    if isinstance(target, tuple) and len(target) == 2 and hasattr(target[0], "over"):
        apply_fn, params = target
        return apply_fn.over(_EXPORT_OPS), params
    return target


def _bound(error: str) -> str | None:
    """``"seq <= 64"`` from a shape error that mentions ``min(64, seq)``, else None."""
    found = re.search(r"min\((\d+), ([A-Za-z_]\w*)\)", error) or re.search(r"min\(([A-Za-z_]\w*), (\d+)\)", error)
    if found is None:
        return None
    number, name = found.groups() if found.group(1).isdigit() else found.groups()[::-1]
    return f"{name} <= {number}"
