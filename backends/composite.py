"""Composite ops, written once over the primitives; a backend may override one with a fused native.

Normalisation, softmax, attention, recurrent cells, losses... Each is checked against the
numpy reference on every backend, overrides included.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from xdevice.backends.primitives import Array, Primitives

__all__ = ["CompositeOps", "float32_inside", "masked_score", "HALF_DTYPES"]

#: half-precision dtypes, which composites widen to float32 inside (``float32_inside``)
HALF_DTYPES = ("float16", "bfloat16")


def float32_inside(composite: Callable) -> Callable:
    """Run a composite in float32 when its first input is half precision, and cast the
    results back: normalisation statistics and softmax sums overflow or lose most of their
    digits in float16 (PyTorch's fused kernels upcast the same way)."""

    @functools.wraps(composite)
    def run(self, x, *args, **kwargs):
        half = self.dtype(x)
        if half not in HALF_DTYPES:
            return composite(self, x, *args, **kwargs)
        wide = lambda v: self.cast(v, "float32") if _is_half_array(self, v) else v
        out = composite(self, wide(x), *[wide(a) for a in args], **kwargs)
        if isinstance(out, tuple):
            return tuple(self.cast(o, half) for o in out)
        return self.cast(out, half)

    return run


def _is_half_array(ops: Any, value: Any) -> bool:
    return value is not None and not isinstance(value, (int, float, bool)) and ops.dtype(value) in HALF_DTYPES


def masked_score(dtype: str) -> float:
    """The score a masked attention position gets: finite, so a fully masked row stays
    finite and attends uniformly; float16 cannot hold -1e9."""
    return -6e4 if dtype == "float16" else -1e9


class CompositeOps(Primitives):
    """The composites of the op set: written once here over the primitives."""

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

    def write_slots(self, x: Array, update: Array, start: Any, axis: int) -> Array:
        """``x`` with ``update`` written at ``start .. start + n - 1`` along ``axis`` (``n``:
        ``update``'s size there; ``start + n`` within ``x``): a key/value cache's write.
        ``start`` may be an array (a compiled step's argument). Here a select over every slot;
        backends override it with their in-place-style update (torch's ``index_copy``, JAX's
        ``dynamic_update_slice``), which reads and writes ``x`` once."""
        length, n = self.shape(x)[axis], self.shape(update)[axis]
        offset = self.subtract(self.arange(length), self.cast(start, "int32"))
        inside = self.logical_and(self.greater_equal(offset, 0), self.less(offset, n))
        along = [1] * len(self.shape(x))
        along[axis] = length
        if n != 1:  # slot s takes update[s - start]
            update = self.take(update, self.clip(offset, 0, n - 1), axis=axis)
        return self.where(self.reshape(inside, tuple(along)), update, x)

    def checkpoint(self, fn: Callable[..., Any], *args: Array) -> Any:
        """``fn(*args)``, with ``fn``'s activations recomputed in the backward pass instead of
        kept (gradient checkpointing, "remat"): less memory for one more forward of ``fn``.

        ``fn`` is a pure function of arrays returning an array or a tuple of them. Pass the
        arrays to differentiate (the weights ``fn`` uses included) as ``args``: TensorFlow's
        ``recompute_grad`` gives gradients to those alone. Arrays without a gradient (masks,
        rotations) may be closed over. By default, and on numpy, a plain call.
        """
        return fn(*args)

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


def _count(shape: tuple[int, ...], axis: int | Sequence[int] | None) -> int:
    if axis is None:
        return math.prod(shape)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return math.prod(shape[a] for a in axes)
