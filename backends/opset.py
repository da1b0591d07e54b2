"""The neutral op set: what every backend's ``ops.py`` implements, and the ops built on it.

Reference models and the ONNX importer are written once against this namespace; each
backend supplies the primitives in its ``ops.py``. Composite ops (softmax, layer norm,
attention, recurrent cells, random numbers...) are written here once over the primitives;
a backend may override one with a fused native version for speed, and the op tests hold
every override to the numpy reference.

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
- Random numbers come from explicit keys and a counter-based hash written once here in
  integer ops, so one key gives the same bits on every backend.
- Differentiation stays native (torch autograd, ``jax.grad``, ``tf.GradientTape``; the numpy
  backend records a tape); everything here works under ``jax.jit`` and ``tf.function``.
"""

from __future__ import annotations

import abc
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "Ops",
    "Array",
    "DTYPES",
    "NARROW_DTYPES",
    "UNARY",
    "BINARY",
    "COMPARISONS",
    "masked_score",
    "float32_inside",
    "numpy_dtype",
]

Array = Any
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
NARROW_DTYPES = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int4", "uint4")


def numpy_dtype(name: str) -> Any:
    """numpy's dtype for a dtype name of ``DTYPES`` or ``NARROW_DTYPES`` (bfloat16, float8 and
    int4 come from ml_dtypes). Imports numpy when called."""
    import numpy as np

    if name == "bfloat16" or name in NARROW_DTYPES:
        from xdevice.backends._common import ml_dtype

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


_HALF = ("float16", "bfloat16")


def float32_inside(composite: Callable) -> Callable:
    """Run a composite in float32 when its first input is half precision, and cast the
    results back: normalisation statistics and softmax sums overflow or lose most of their
    digits in float16 (PyTorch's fused kernels upcast the same way)."""

    @functools.wraps(composite)
    def run(self, x, *args, **kwargs):
        half = self.dtype(x)
        if half not in _HALF:
            return composite(self, x, *args, **kwargs)
        wide = lambda v: self.cast(v, "float32") if _is_half_array(self, v) else v
        out = composite(self, wide(x), *[wide(a) for a in args], **kwargs)
        if isinstance(out, tuple):
            return tuple(self.cast(o, half) for o in out)
        return self.cast(out, half)

    return run


def _is_half_array(ops: Any, value: Any) -> bool:
    return value is not None and not isinstance(value, (int, float, bool)) and ops.dtype(value) in _HALF


def _in_dtype(ops: Any, lr: Any, dtype: str) -> Any:
    """A learning rate for parameters of ``dtype``: a number as it is, a scalar array (a
    schedule's rate inside a compiled step) cast to that dtype."""
    return lr if isinstance(lr, (int, float)) else ops.cast(lr, dtype)


def masked_score(dtype: str) -> float:
    """The score a masked attention position gets: finite, so a fully masked row stays
    finite and attends uniformly; float16 cannot hold -1e9."""
    return -6e4 if dtype == "float16" else -1e9


class Ops(abc.ABC):
    """The op namespace of one backend. Subclasses implement every abstract method."""

    #: the backend's name ("torch", ...)
    name: str

    # -- arrays ---------------------------------------------------------------------------

    @abc.abstractmethod
    def asarray(self, x: Any, dtype: str | None = None) -> Array:
        """An array of this backend from a numpy array, a Python number/list, or its own
        array (returned as is when the dtype already matches), on the default device."""

    @abc.abstractmethod
    def to_numpy(self, x: Array) -> Any:
        """A numpy copy of ``x`` (detached from any gradient tape)."""

    @abc.abstractmethod
    def shape(self, x: Array) -> tuple[int, ...]:
        """The shape of ``x``: Python ints for dimensions known while tracing. A dimension
        only known at run time (a dynamic batch being exported) comes back as the
        framework's dynamic scalar: a ``torch.export`` SymInt, a JAX symbolic dimension, a
        TensorFlow scalar tensor (``tf.shape(x)[i]``). Such a value may size new arrays and
        reshapes; models keep it out of Python control flow."""

    @abc.abstractmethod
    def dtype(self, x: Array) -> str:
        """The dtype name of ``x`` (one of ``DTYPES``)."""

    @abc.abstractmethod
    def cast(self, x: Array, dtype: str) -> Array:
        """``x`` converted to ``dtype`` (floats to ints truncate toward zero)."""

    @abc.abstractmethod
    def zeros(self, shape: Sequence[int], dtype: str = "float32") -> Array: ...

    @abc.abstractmethod
    def ones(self, shape: Sequence[int], dtype: str = "float32") -> Array: ...

    @abc.abstractmethod
    def full(self, shape: Sequence[int], value: float, dtype: str = "float32") -> Array: ...

    @abc.abstractmethod
    def arange(self, start: int, stop: int | None = None, step: int = 1, dtype: str = "int32") -> Array:
        """``start, start+step, ...`` below ``stop`` (numpy's ``arange``)."""

    # -- elementwise primitives (the UNARY, BINARY and COMPARISONS tables) ------------------

    @abc.abstractmethod
    def negative(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def abs(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def sign(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def exp(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def log(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def sqrt(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def sin(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def cos(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def tan(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def tanh(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def sigmoid(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def erf(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def floor(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def ceil(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def round(self, x: Array) -> Array:
        """Round half to even, as numpy does."""

    @abc.abstractmethod
    def relu(self, x: Array) -> Array:
        """``max(x, 0)``; its gradient at 0 is 0."""

    @abc.abstractmethod
    def logical_not(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def isnan(self, x: Array) -> Array: ...
    @abc.abstractmethod
    def isinf(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def stop_gradient(self, x: Array) -> Array:
        """``x`` with no gradient flowing back through it (the value is unchanged)."""

    @abc.abstractmethod
    def gelu(self, x: Array, approximate: bool = False) -> Array:
        """GELU; ``approximate=True`` is the tanh form."""

    @abc.abstractmethod
    def add(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def subtract(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def multiply(self, x: Array, y: Array) -> Array: ...

    @abc.abstractmethod
    def divide(self, x: Array, y: Array) -> Array:
        """True division (ints divide to floats, as numpy)."""

    @abc.abstractmethod
    def power(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def maximum(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def minimum(self, x: Array, y: Array) -> Array: ...

    @abc.abstractmethod
    def mod(self, x: Array, y: Array) -> Array:
        """Remainder with the sign of the divisor (Python's and numpy's ``%``)."""

    @abc.abstractmethod
    def floor_divide(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def logical_and(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def logical_or(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def logical_xor(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def bitwise_and(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def bitwise_or(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def bitwise_xor(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def left_shift(self, x: Array, y: Array) -> Array: ...

    @abc.abstractmethod
    def right_shift(self, x: Array, y: Array) -> Array:
        """Shift right; for unsigned and non-negative values a logical shift."""

    @abc.abstractmethod
    def equal(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def not_equal(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def less(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def less_equal(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def greater(self, x: Array, y: Array) -> Array: ...
    @abc.abstractmethod
    def greater_equal(self, x: Array, y: Array) -> Array: ...

    @abc.abstractmethod
    def where(self, condition: Array, x: Array, y: Array) -> Array:
        """``x`` where ``condition`` holds, else ``y`` (all three broadcast)."""

    # -- linear algebra -------------------------------------------------------------------

    @abc.abstractmethod
    def matmul(self, a: Array, b: Array) -> Array:
        """numpy's ``matmul``: batched over leading dims, which broadcast."""

    @abc.abstractmethod
    def einsum(self, equation: str, *operands: Array) -> Array:
        """numpy's ``einsum`` (explicit ``->`` form)."""

    # -- reductions -----------------------------------------------------------------------

    @abc.abstractmethod
    def sum(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array: ...
    @abc.abstractmethod
    def mean(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array: ...

    @abc.abstractmethod
    def max(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        """The maximum; on ties the gradient may go to any one maximal element or split."""

    @abc.abstractmethod
    def min(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array: ...
    @abc.abstractmethod
    def prod(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array: ...

    @abc.abstractmethod
    def argmax(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        """Index of the first maximum along ``axis``, as int64 (int32 on JAX without x64)."""

    @abc.abstractmethod
    def argmin(self, x: Array, axis: int, keepdims: bool = False) -> Array: ...

    @abc.abstractmethod
    def cumsum(self, x: Array, axis: int) -> Array: ...

    # -- shape ----------------------------------------------------------------------------

    @abc.abstractmethod
    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        """numpy's ``reshape``; one entry may be -1."""

    @abc.abstractmethod
    def transpose(self, x: Array, axes: Sequence[int] | None = None) -> Array:
        """Permute axes (reverse them when ``axes`` is None)."""

    @abc.abstractmethod
    def expand_dims(self, x: Array, axis: int) -> Array: ...

    @abc.abstractmethod
    def squeeze(self, x: Array, axis: int | Sequence[int] | None = None) -> Array: ...

    @abc.abstractmethod
    def broadcast_to(self, x: Array, shape: Sequence[int]) -> Array: ...

    @abc.abstractmethod
    def concat(self, xs: Sequence[Array], axis: int = 0) -> Array: ...

    @abc.abstractmethod
    def stack(self, xs: Sequence[Array], axis: int = 0) -> Array: ...

    @abc.abstractmethod
    def split(self, x: Array, sections: int | Sequence[int], axis: int = 0) -> list[Array]:
        """``sections`` equal parts, or parts of the listed sizes (not indices)."""

    @abc.abstractmethod
    def slice(
        self,
        x: Array,
        starts: Sequence[int],
        stops: Sequence[int],
        axes: Sequence[int] | None = None,
        steps: Sequence[int] | None = None,
    ) -> Array:
        """``x[start:stop:step]`` on each listed axis (all axes in order when None); ends
        are clamped as in Python slicing, and negative ends count from the end."""

    @abc.abstractmethod
    def take(self, x: Array, indices: Array | int, axis: int = 0) -> Array:
        """numpy's ``take``: gather along ``axis`` (an int index drops the axis)."""

    @abc.abstractmethod
    def take_along_axis(self, x: Array, indices: Array, axis: int) -> Array:
        """numpy's ``take_along_axis`` (ONNX ``GatherElements``)."""

    @abc.abstractmethod
    def pad(self, x: Array, pad_width: Sequence[tuple[int, int]], mode: str = "constant", value: float = 0) -> Array:
        """``(before, after)`` for every axis; mode ``constant``, ``reflect`` or ``edge``."""

    @abc.abstractmethod
    def flip(self, x: Array, axis: int | Sequence[int]) -> Array: ...

    @abc.abstractmethod
    def tile(self, x: Array, reps: Sequence[int]) -> Array: ...

    # -- neural-network primitives ----------------------------------------------------------

    @abc.abstractmethod
    def conv(
        self,
        x: Array,
        w: Array,
        b: Array | None = None,
        stride: int | Sequence[int] = 1,
        padding: Any = 0,
        dilation: int | Sequence[int] = 1,
        groups: int = 1,
    ) -> Array:
        """Cross-correlation over 1-3 spatial dims, channels first.

        ``x`` is ``(N, C, *spatial)``, ``w`` is ``(O, C/groups, *kernel)``, ``b`` is ``(O,)``.
        ``padding``: an int or one int per spatial dim (both sides), one ``(before, after)``
        pair per spatial dim, ``"valid"``, or ``"same"`` (the extra pixel after, as ONNX
        ``SAME_UPPER`` and TensorFlow do).
        """

    @abc.abstractmethod
    def max_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
    ) -> Array:
        """Max over windows, channels first; padding counts as -inf. ``stride`` defaults
        to ``window``; ``padding`` as in ``conv``."""

    @abc.abstractmethod
    def avg_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        count_include_pad: bool = False,
        ceil_mode: bool = False,
    ) -> Array:
        """Mean over windows, channels first; padding is excluded from the count unless
        ``count_include_pad``."""

    # -- more primitives: inverse trig, sorting, scattering (the ONNX importer needs them) ---

    @abc.abstractmethod
    def asin(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def acos(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def atan(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def sinh(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def cosh(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def asinh(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def acosh(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def atanh(self, x: Array) -> Array: ...

    @abc.abstractmethod
    def bitwise_not(self, x: Array) -> Array:
        """Bitwise complement of integers; logical not of booleans."""

    @abc.abstractmethod
    def fmod(self, x: Array, y: Array) -> Array:
        """Remainder with the sign of the dividend (C's ``fmod``, numpy's ``fmod``)."""

    @abc.abstractmethod
    def cumprod(self, x: Array, axis: int) -> Array: ...

    @abc.abstractmethod
    def sort(self, x: Array, axis: int = -1, descending: bool = False) -> tuple[Array, Array]:
        """``(values, indices)`` sorted along ``axis``; stable, so equal values keep their
        order (the lower index first, ascending or descending); indices are int64 (int32
        on JAX without x64). NaN sorts last ascending and first descending."""

    @abc.abstractmethod
    def scatter(self, x: Array, indices: Array, updates: Array, axis: int = 0, reduction: str = "none") -> Array:
        """ONNX ``ScatterElements``: a copy of ``x`` where, for every position of
        ``indices`` (the shape of ``updates``), the element ``indices[...]`` along ``axis``
        takes ``updates[...]`` (``reduction="none"``; with duplicate indices the last write
        wins) or is combined with it (``"add"``, ``"mul"``, ``"max"``, ``"min"``).
        Negative indices count from the end."""

    def scatter_last_wins(self, x: Array, index: Array, updates: Array, axis: int) -> Array:
        """``scatter`` with ``reduction="none"`` for a backend whose own kernel leaves the
        winner among duplicate indices open: each element of ``x`` finds the last (row-major)
        update aimed at it with a scatter-max of positions, a result no order can change,
        and takes it by a gather, so only the winner gets a gradient. ``index`` holds no
        negative values and ``updates`` has its shape and ``x``'s dtype."""
        count = math.prod(self.shape(index))
        if not count:
            return x
        position = self.reshape(self.arange(count, dtype="int32"), self.shape(index))
        winner = self.scatter(self.full(self.shape(x), -1, "int32"), index, position, axis, "max")
        taken = self.take(self.reshape(updates, (-1,)), self.maximum(winner, self.zeros((), "int32")))
        return self.where(self.greater_equal(winner, self.zeros((), "int32")), taken, x)

    @abc.abstractmethod
    def det(self, x: Array) -> Array:
        """Determinant over the last two axes."""

    # -- composites: written once here; a backend may override with a fused native ---------

    def square(self, x: Array) -> Array:
        return self.multiply(x, x)

    def reciprocal(self, x: Array) -> Array:
        return self.divide(1.0, x)

    def rsqrt(self, x: Array) -> Array:
        return self.reciprocal(self.sqrt(x))

    def softplus(self, x: Array) -> Array:
        """``log(1 + exp(x))``, computed without overflow."""
        return self.add(self.relu(x), self.log(self.add(1.0, self.exp(self.negative(self.abs(x))))))

    def clip(self, x: Array, low: float | None = None, high: float | None = None) -> Array:
        if low is not None:
            x = self.maximum(x, low)
        if high is not None:
            x = self.minimum(x, high)
        return x

    def var(
        self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False, correction: int = 0
    ) -> Array:
        """Variance; ``correction=1`` for the unbiased estimate."""
        centred = self.subtract(x, self.mean(x, axis=axis, keepdims=True))
        total = self.sum(self.square(centred), axis=axis, keepdims=keepdims)
        count = _count(self.shape(x), axis)
        return self.divide(total, float(count - correction))

    @float32_inside
    def logsumexp(self, x: Array, axis: int = -1, keepdims: bool = False) -> Array:
        top = self.stop_gradient(self.max(x, axis=axis, keepdims=True))
        out = self.add(self.log(self.sum(self.exp(self.subtract(x, top)), axis=axis, keepdims=True)), top)
        return out if keepdims else self.squeeze(out, axis=axis)

    @float32_inside
    def softmax(self, x: Array, axis: int = -1) -> Array:
        shifted = self.exp(self.subtract(x, self.stop_gradient(self.max(x, axis=axis, keepdims=True))))
        return self.divide(shifted, self.sum(shifted, axis=axis, keepdims=True))

    @float32_inside
    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        return self.subtract(x, self.logsumexp(x, axis=axis, keepdims=True))

    def flatten(self, x: Array, start_axis: int = 1) -> Array:
        # -1 goes in the batch slot and the flattened size is static, so a batch only known
        # at run time never enters the target shape
        shape = self.shape(x)
        start = start_axis % len(shape) if start_axis < 0 else start_axis
        if start == 0:
            return self.reshape(x, (-1,))
        return self.reshape(x, (-1, *shape[1:start], math.prod(shape[start:])))

    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        """``x @ w + b`` with ``w`` of shape ``(in, out)``."""
        y = self.matmul(x, w)
        return y if b is None else self.add(y, b)

    @float32_inside
    def layer_norm(
        self, x: Array, scale: Array | None, offset: Array | None, axis: int = -1, eps: float = 1e-5
    ) -> Array:
        """Normalise over the trailing axes from ``axis`` on; scale and offset those axes."""
        axes = tuple(range(axis % len(self.shape(x)), len(self.shape(x))))
        mean = self.mean(x, axis=axes, keepdims=True)
        y = self.multiply(self.subtract(x, mean), self.rsqrt(self.add(self.var(x, axis=axes, keepdims=True), eps)))
        if scale is not None:
            y = self.multiply(y, scale)
        return y if offset is None else self.add(y, offset)

    @float32_inside
    def batch_norm(self, x: Array, scale: Array, offset: Array, mean: Array, var: Array, eps: float = 1e-5) -> Array:
        """Inference batch norm over channel axis 1 with running statistics."""
        shape = (1, -1) + (1,) * (len(self.shape(x)) - 2)
        factor = self.multiply(scale, self.rsqrt(self.add(var, eps)))
        shift = self.subtract(offset, self.multiply(mean, factor))
        return self.add(self.multiply(x, self.reshape(factor, shape)), self.reshape(shift, shape))

    @float32_inside
    def batch_norm_train(self, x: Array, scale: Array, offset: Array, eps: float = 1e-5) -> tuple[Array, Array, Array]:
        """Training batch norm over channel axis 1: ``(y, batch_mean, batch_var)``, where the
        variance is the biased one used to normalise (PyTorch updates its running variance
        with the unbiased one: multiply by ``n / (n - 1)``)."""
        axes = (0, *range(2, len(self.shape(x))))
        mean = self.mean(x, axis=axes)
        var = self.var(x, axis=axes)
        return self.batch_norm(x, scale, offset, mean, var, eps), mean, var

    def attention(self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None) -> Array:
        """Scaled dot-product attention over ``(..., L, D)`` inputs.

        ``mask`` is boolean, broadcastable to ``(..., Lq, Lk)``, True where a query may
        attend. A fully masked row attends uniformly rather than producing NaN.
        """
        scale = 1.0 / math.sqrt(self.shape(q)[-1]) if scale is None else scale
        scores = self.multiply(self.matmul(q, self.swap_last(k)), scale)
        if mask is not None:
            scores = self.where(mask, scores, masked_score(self.dtype(scores)))
        return self.matmul(self.softmax(scores, axis=-1), v)

    # -- optimizer updates over many tensors (xdevice.training.optimizers): PyTorch's rules ----

    def sgd_update(
        self,
        params: list[Array],
        grads: list[Array],
        buffers: list[Array] | None,
        *,
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        inplace: bool = False,
    ) -> tuple[list[Array], list[Array] | None]:
        """One step of ``torch.optim.SGD`` over every tensor: ``(params, momentum buffers)``.

        ``buffers`` are the momentum buffers (None without momentum). With ``inplace`` a backend
        may write the results into ``params`` and ``buffers`` and return those: the caller
        promises to keep no old values (the trainer does); the math is the same either way.
        """
        new_params, new_buffers = [], []
        for i, (param, grad) in enumerate(zip(params, grads)):
            grad = self.cast(grad, self.dtype(param))
            rate = _in_dtype(self, lr, self.dtype(param))
            if weight_decay:
                grad = self.add(grad, self.multiply(param, weight_decay))
            if momentum:
                buffer = self.add(self.multiply(buffers[i], momentum), grad)
                new_buffers.append(buffer)
                grad = self.add(grad, self.multiply(buffer, momentum)) if nesterov else buffer
            new_params.append(self.subtract(param, self.multiply(grad, rate)))
        return new_params, new_buffers if momentum else None

    def clip_by_global_norm(self, grads: list[Array], max_norm: float) -> list[Array]:
        """``grads`` scaled by ``min(1, max_norm / (norm + 1e-6))``, ``norm`` the L2 norm of them
        all together: ``torch.nn.utils.clip_grad_norm_``'s rule."""
        if not grads:
            return grads
        squares = [self.sum(self.square(self.cast(g, "float32") if self.dtype(g) in _HALF else g)) for g in grads]
        total = self.sqrt(functools.reduce(self.add, squares))
        scale = self.minimum(self.divide(max_norm, self.add(total, 1e-6)), 1.0)
        return [self.multiply(g, self.cast(scale, self.dtype(g))) for g in grads]  # one scale, any dtype

    def clip_by_value(self, grads: list[Array], limit: float) -> list[Array]:
        """Each gradient element clamped to ``[-limit, limit]``: ``clip_grad_value_``'s rule."""
        return [self.clip(g, -limit, limit) for g in grads]

    def adam_update(
        self,
        params: list[Array],
        grads: list[Array],
        m: list[Array],
        v: list[Array],
        step: Array,
        *,
        lr: float,
        beta1: float,
        beta2: float,
        eps: float,
        weight_decay: float = 0.0,
        decoupled: bool = False,
        inplace: bool = False,
    ) -> tuple[list[Array], list[Array], list[Array]]:
        """One step of ``torch.optim.Adam`` (``decoupled``: ``AdamW``) over every tensor, at
        ``step`` (counted from 1): ``(params, m, v)``. Bias corrections are computed once per
        step and dtype. ``inplace`` as in :meth:`sgd_update`."""
        corrections: dict[str, tuple[Array, Array]] = {}
        new_params, new_m, new_v = [], [], []
        for param, grad, m_i, v_i in zip(params, grads, m, v):
            dtype = self.dtype(param)
            if dtype not in corrections:
                t, one = self.cast(step, dtype), self.asarray(1.0, dtype)
                corrections[dtype] = (
                    self.subtract(one, self.power(self.asarray(beta1, dtype), t)),
                    self.subtract(one, self.power(self.asarray(beta2, dtype), t)),
                )
            correction1, correction2 = corrections[dtype]
            grad = self.cast(grad, dtype)
            rate = _in_dtype(self, lr, dtype)
            if weight_decay and decoupled:
                param = self.multiply(
                    param,
                    1 - lr * weight_decay
                    if isinstance(lr, (int, float))
                    else self.subtract(1.0, self.multiply(rate, weight_decay)),
                )
            elif weight_decay:
                grad = self.add(grad, self.multiply(param, weight_decay))
            m_i = self.add(self.multiply(m_i, beta1), self.multiply(grad, 1 - beta1))
            v_i = self.add(self.multiply(v_i, beta2), self.multiply(self.square(grad), 1 - beta2))
            # PyTorch's order of operations: lr / c1 * m / (sqrt(v) / sqrt(c2) + eps)
            denominator = self.add(self.divide(self.sqrt(v_i), self.sqrt(correction2)), eps)
            change = self.multiply(self.divide(self.asarray(rate, dtype), correction1), self.divide(m_i, denominator))
            new_params.append(self.subtract(param, change))
            new_m.append(m_i)
            new_v.append(v_i)
        return new_params, new_m, new_v

    def swap_last(self, x: Array) -> Array:
        """``x`` with its last two axes swapped."""
        rank = len(self.shape(x))
        return self.transpose(x, (*range(rank - 2), rank - 1, rank - 2))

    def lstm_cell(self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array) -> tuple[Array, Array]:
        """One LSTM step; gates ``i, f, g, o``; returns ``(h, c)``."""
        gates = self.add(self.add(self.matmul(x, w_ih), self.matmul(h, w_hh)), b)
        i, f, g, o = self.split(gates, 4, axis=-1)
        c = self.add(self.multiply(self.sigmoid(f), c), self.multiply(self.sigmoid(i), self.tanh(g)))
        return self.multiply(self.sigmoid(o), self.tanh(c)), c

    def lstm(self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array) -> tuple[Array, Array, Array]:
        """An LSTM over ``x`` of shape ``(N, T, in)``: returns ``(outputs (N, T, H), h, c)``."""
        steps = self.shape(x)[1]
        inputs = self.add(self.matmul(x, w_ih), b)  # one big matmul for every step's input part
        outputs = []
        for t in range(steps):
            gates = self.add(self.take(inputs, t, axis=1), self.matmul(h, w_hh))
            i, f, g, o = self.split(gates, 4, axis=-1)
            c = self.add(self.multiply(self.sigmoid(f), c), self.multiply(self.sigmoid(i), self.tanh(g)))
            h = self.multiply(self.sigmoid(o), self.tanh(c))
            outputs.append(h)
        return self.stack(outputs, axis=1), h, c

    def gru_cell(self, x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array) -> Array:
        """One GRU step with PyTorch's equations (gates ``r, z, n``); returns ``h``."""
        xr, xz, xn = self.split(self.add(self.matmul(x, w_ih), b_ih), 3, axis=-1)
        hr, hz, hn = self.split(self.add(self.matmul(h, w_hh), b_hh), 3, axis=-1)
        r = self.sigmoid(self.add(xr, hr))
        z = self.sigmoid(self.add(xz, hz))
        n = self.tanh(self.add(xn, self.multiply(r, hn)))
        return self.add(self.multiply(self.subtract(1.0, z), n), self.multiply(z, h))

    def gru(self, x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array) -> tuple[Array, Array]:
        """A GRU over ``x`` of shape ``(N, T, in)``: returns ``(outputs (N, T, H), h)``."""
        outputs = []
        for t in range(self.shape(x)[1]):
            h = self.gru_cell(self.take(x, t, axis=1), h, w_ih, w_hh, b_ih, b_hh)
            outputs.append(h)
        return self.stack(outputs, axis=1), h

    def one_hot(self, indices: Array, depth: int, dtype: str = "float32") -> Array:
        classes = self.arange(depth, dtype=self.dtype(indices))
        return self.cast(self.equal(self.expand_dims(indices, -1), classes), dtype)

    def cross_entropy(self, logits: Array, labels: Array) -> Array:
        """Mean negative log-likelihood of integer ``labels`` under ``logits`` (N, classes)."""
        picked = self.take_along_axis(
            self.log_softmax(logits, axis=-1), self.expand_dims(self.cast(labels, "int32"), -1), axis=-1
        )
        return self.negative(self.mean(picked))

    # -- control flow: a Python loop and branch here; compiling backends override with their own

    def while_loop(
        self,
        condition: Callable[[tuple, tuple], Array],
        body: Callable[[tuple, tuple], tuple],
        state: tuple,
        operands: tuple = (),
    ) -> tuple:
        """``state = body(state, operands)`` while ``condition(state, operands)`` (a scalar
        bool) holds; the framework's own loop (``lax.while_loop``, ``tf.while_loop``, torch's
        ``while_loop`` operator) where a backend compiles, so a condition known only at run
        time works under compilation. ``body`` keeps every state array's shape and dtype;
        ``operands`` are the arrays both functions read from outside (torch traces nothing
        else)."""
        while bool(self.to_numpy(condition(state, operands))):
            state = tuple(body(state, operands))
        return tuple(state)

    def cond(
        self, predicate: Array, then: Callable[..., tuple], otherwise: Callable[..., tuple], operands: tuple = ()
    ) -> tuple:
        """``then(*operands)`` if the scalar ``predicate`` holds, else ``otherwise(*operands)``:
        the framework's own branch (``lax.cond``, ``tf.cond``, torch's ``cond`` operator)
        where a backend compiles; both branches then return arrays of the same shapes and
        dtypes."""
        return tuple(then(*operands) if bool(self.to_numpy(predicate)) else otherwise(*operands))

    # -- random numbers: a counter-based hash in 32-bit integer ops, the same on every backend

    def random_key(self, seed: int) -> Array:
        """A key: two 32-bit words as an integer array of shape (2,)."""
        return self.asarray([seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF], dtype=self.key_dtype)

    def split_key(self, key: Array, count: int = 2) -> list[Array]:
        """``count`` new independent keys derived from ``key``."""
        bits = self.random_bits(key, (count, 2))
        return [self.take(bits, i, axis=0) for i in range(count)]

    #: the integer dtype that holds 32-bit words (uint32 where the backend has full support)
    key_dtype = "int64"

    def random_bits(self, key: Array, shape: Sequence[int]) -> Array:
        """Uniform 32-bit words (in ``key_dtype``) of ``shape``: a hash of (key, position)."""
        count = math.prod(shape)
        counter = self.arange(count, dtype=self.key_dtype)
        k0, k1 = self.take(key, 0), self.take(key, 1)
        x = self._hash(self.bitwise_xor(self._hash(self.bitwise_xor(counter, k0)), k1))
        return self.reshape(x, tuple(shape))

    def _hash(self, x: Array) -> Array:
        # "lowbias32" (Chris Wellons): xorshift-multiply rounds; masked to 32 bits so that
        # int64 backends compute exactly what uint32 ones do.
        mask = 0xFFFFFFFF
        x = self.bitwise_xor(x, self.right_shift(x, 16))
        x = self.bitwise_and(self.multiply(x, 0x7FEB352D), mask)
        x = self.bitwise_xor(x, self.right_shift(x, 15))
        x = self.bitwise_and(self.multiply(x, 0x846CA68B), mask)
        return self.bitwise_xor(x, self.right_shift(x, 16))

    def uniform(
        self, key: Array, shape: Sequence[int], low: float = 0.0, high: float = 1.0, dtype: str = "float32"
    ) -> Array:
        """Uniform floats in ``[low, high)``, 24 random bits each."""
        bits = self.right_shift(self.random_bits(key, shape), 8)
        unit = self.multiply(self.cast(bits, "float32"), 2.0**-24)
        return self.cast(self.add(self.multiply(unit, high - low), low), dtype)

    def normal(self, key: Array, shape: Sequence[int], dtype: str = "float32") -> Array:
        """Standard normal floats (Box-Muller over two uniform draws)."""
        first, second = self.split_key(key, 2)
        u1 = self.subtract(1.0, self.uniform(first, shape))  # in (0, 1]: log is finite
        u2 = self.uniform(second, shape)
        radius = self.sqrt(self.multiply(-2.0, self.log(u1)))
        return self.cast(self.multiply(radius, self.cos(self.multiply(2 * math.pi, u2))), dtype)

    def dropout(self, key: Array, x: Array, rate: float) -> Array:
        """Zero each element with probability ``rate``; scale the rest by ``1/(1-rate)``."""
        if rate == 0:
            return x
        keep = self.greater_equal(self.uniform(key, self.shape(x)), rate)
        return self.where(keep, self.multiply(x, 1.0 / (1.0 - rate)), 0.0)


def _count(shape: tuple[int, ...], axis: int | Sequence[int] | None) -> int:
    if axis is None:
        return math.prod(shape)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return math.prod(shape[a] for a in axes)
