"""The neutral op set: ``Ops``, the namespace every backend's ``ops.py`` subclasses.

Reference models and the ONNX importer are written once against this namespace. ``Ops`` is
assembled from one module per part, and a backend implements only the first:

- ``primitives.py``: the abstract primitives, which each backend supplies in its ``ops.py``;
- ``composite.py``: ops written once over the primitives (softmax, layer norm, attention,
  recurrent cells...); a backend may override one with a fused native version for speed,
  and the op tests hold every override to the numpy reference;
- ``optimizer_updates.py``: optimizer steps over many tensors (SGD, Adam, clipping);
- ``control_flow.py``: ``while_loop`` and ``cond``, which compiling backends override;
- ``random_numbers.py``: random numbers from explicit keys, the same bits on every backend.

Conventions (the same on every backend):
- Arrays are the backend's own (``torch.Tensor``, ``jax.Array``, ``tf.Tensor``, ``ndarray``).
- Dtypes are named by strings: ``float16 bfloat16 float32 float64 int8 int16 int32 int64
  uint8 uint32 bool``.
- Broadcasting and integer/float semantics follow numpy. ``axis`` may be negative.
  Either input of a two-input op, and the branches of ``where``, may be a Python number,
  which takes the other input's dtype (numpy's NEP 50 rule).
- Convolution and pooling take channels-first input (``NCHW``, or ``NCW``/``NCDHW``) and
  ``OIHW`` weights; a backend whose kernels want channels-last translates inside.
- Dense weights are ``(in, out)``: ``y = x @ w + b``.
- Recurrent weights are ``(in, G*H)`` and ``(H, G*H)`` with gates in PyTorch's order:
  LSTM ``i, f, g, o`` (one bias, the sum of PyTorch's two), GRU ``r, z, n`` (two biases,
  because ``b_hn`` sits inside the reset gate).
- Random numbers come from explicit keys and a counter-based hash written once (in
  ``random_numbers.py``) in integer ops, so one key gives the same bits on every backend.
- Differentiation stays native (torch autograd, ``jax.grad``, ``tf.GradientTape``; the numpy
  backend records a tape); everything here works under ``jax.jit`` and ``tf.function``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from xdevice.backends.composite import CompositeOps
from xdevice.backends.control_flow import ControlFlow
from xdevice.backends.optimizer_updates import OptimizerUpdates
from xdevice.backends.primitives import Array
from xdevice.backends.random_numbers import RandomNumbers

__all__ = [
    "Ops",
    "Array",
    "DTYPES",
    "NARROW_DTYPES",
    "UNARY",
    "BINARY",
    "COMPARISONS",
    "numpy_dtype",
]

DTYPES = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "bool",
)
#: Narrow float and int formats (from ml_dtypes) a backend may also support in ``cast``.
NARROW_DTYPES = (
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "int4",
    "uint4",
    "float4_e2m1fn",
    "float8_e8m0fnu",
    "int2",
    "uint2",
)


def numpy_dtype(name: str) -> Any:
    """numpy's dtype for a dtype name of ``DTYPES`` or ``NARROW_DTYPES`` (bfloat16, float8 and
    int4 come from ml_dtypes). Imports numpy when called."""
    import numpy as np

    if name == "bfloat16" or name in NARROW_DTYPES:
        from xdevice.backends._dtypes import ml_dtype

        return np.dtype(ml_dtype(name))
    return np.dtype(name)


#: One-input elementwise primitives (each ``name(x)``).
UNARY = (
    "negative",
    "abs",
    "sign",
    "exp",
    "log",
    "sqrt",
    "sin",
    "cos",
    "tan",
    "tanh",
    "sigmoid",
    "erf",
    "floor",
    "ceil",
    "round",
    "relu",
    "logical_not",
    "isnan",
    "isinf",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "asinh",
    "acosh",
    "atanh",
    "bitwise_not",
)
#: Two-input elementwise primitives with broadcasting (each ``name(x, y)``).
BINARY = (
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "maximum",
    "minimum",
    "mod",
    "fmod",
    "floor_divide",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "left_shift",
    "right_shift",
)
#: Comparisons, returning bool arrays (each ``name(x, y)``).
COMPARISONS = ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal")


class Ops(OptimizerUpdates, CompositeOps, ControlFlow, RandomNumbers):
    """The op namespace of one backend. Subclasses implement every abstract method (the
    primitives); everything else is written once in the parts it is assembled from."""

    @staticmethod
    def new_tensors_on(device: Any) -> contextlib.AbstractContextManager[None]:
        """Inside the block, the tensors the op set makes from nothing (``zeros``, ``arange``,
        an LSTM's first state, a causal mask) go to ``device``, the backend's native device
        (None: the framework's default). A no-op where arrays follow an outer placement scope
        (numpy, JAX, TensorFlow); torch's sets it, so a model on a GPU makes no tensor on the CPU."""
        return contextlib.nullcontext()

    def bitcast(self, x: Array, dtype: str) -> Array:
        """``x``'s bits read as ``dtype``, a type of the same width (ONNX's BitCast): float32
        1.0 is int32 1065353216. Backends override it with their native reinterpretation
        (numpy's and torch's ``view``); one that has none says so here."""
        from xdevice._errors import UnsupportedOp, message

        raise UnsupportedOp(
            message(
                f"The {getattr(self, 'name', type(self).__name__)} backend cannot reinterpret bits (bitcast)",
                received=f"a bitcast to {dtype}",
                fix="run the model on the numpy or torch backend",
            )
        )
