"""The op set's primitives: the abstract methods every backend's ``ops.py`` implements.

Their conventions (dtype names, broadcasting, layouts) are in ``opset.py``'s docstring;
``Ops`` there adds the ops written once over these.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["Primitives", "Array"]

#: an array of the backend's own type (``torch.Tensor``, ``jax.Array``, ``tf.Tensor``, ``ndarray``)
Array = Any


class Primitives(abc.ABC):
    """The primitives of one backend's op set: every abstract method here."""

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
