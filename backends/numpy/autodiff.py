"""Reverse-mode autodiff for the numpy reference: a tape over the op set's primitives.

numpy has no autodiff, yet parity compares every framework's gradients against numpy. So
the numpy backend's ops are *taped*: when an input is a :class:`Var`, the op records how to
send a gradient back to it (one vector-Jacobian rule per primitive, in ``RULES``).
Composite ops (softmax, layer norm, attention, LSTM...) are written over primitives in
``composite.py``, so they differentiate with no rule of their own. Ops on plain arrays run
untaped. The rules themselves are checked against finite differences in the tests.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from xdevice._errors import XDeviceError, message
from xdevice.backends._model_io import map_leaves
from xdevice.backends._shapes import as_tuple, conv_padding, pool_counts, pool_padding, slice_index, windows
from xdevice.backends.numpy.ops import NumpyOps

__all__ = ["Var", "TapedOps", "Autodiff", "RULES", "kink_margin"]


class Var:
    """A value on the tape: ``value`` plus how to pass a gradient to the ops' inputs."""

    __slots__ = ("value", "inputs", "backward")
    __array_ufunc__ = None  # numpy defers ``ndarray + Var`` to Var.__radd__

    def __init__(self, value: np.ndarray, inputs: tuple = (), backward: Callable | None = None):
        self.value = value
        self.inputs = inputs  # the op's positional args as given (Vars where differentiable)
        self.backward = backward  # g -> one gradient (or None) per input, lists for list inputs

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    ndim = property(lambda self: self.value.ndim)

    def __repr__(self) -> str:
        return f"Var({self.value!r})"

    # Python operators, so model code may write x @ w + b on every backend
    def __add__(self, other):
        return _OPS.add(self, other)

    def __radd__(self, other):
        return _OPS.add(other, self)

    def __sub__(self, other):
        return _OPS.subtract(self, other)

    def __rsub__(self, other):
        return _OPS.subtract(other, self)

    def __mul__(self, other):
        return _OPS.multiply(self, other)

    def __rmul__(self, other):
        return _OPS.multiply(other, self)

    def __truediv__(self, other):
        return _OPS.divide(self, other)

    def __rtruediv__(self, other):
        return _OPS.divide(other, self)

    def __matmul__(self, other):
        return _OPS.matmul(self, other)

    def __rmatmul__(self, other):
        return _OPS.matmul(other, self)

    def __pow__(self, other):
        return _OPS.power(self, other)

    def __neg__(self):
        return _OPS.negative(self)


def _raw(x: Any) -> Any:
    if isinstance(x, Var):
        return x.value
    if isinstance(x, (list, tuple)) and any(isinstance(v, Var) for v in x):
        return [_raw(v) for v in x]
    return x


def _has_var(args: tuple) -> bool:
    return any(
        isinstance(a, Var) or (isinstance(a, (list, tuple)) and any(isinstance(v, Var) for v in a)) for a in args
    )


def _taped(name: str, rule: Callable | None) -> Callable:
    forward = getattr(NumpyOps, name)
    signature = inspect.signature(forward)

    def op(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.args[1:]
        raw = tuple(_raw(a) for a in given)
        out = forward(self, *raw, **bound.kwargs)
        if rule is None or not _has_var(given):
            return out
        return Var(out, given, lambda g: rule(g, out, *raw, **bound.kwargs))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = forward.__doc__
    op.__signature__ = signature  # type: ignore[attr-defined]  # read by inspect.signature; not in typeshed
    return op


# -- vector-Jacobian rules: rule(g, out, *inputs) -> one gradient per input -----------------


def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    g = np.asarray(g)
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for axis, size in enumerate(shape):
        if size == 1 and g.shape[axis] != 1:
            g = g.sum(axis=axis, keepdims=True)
    return g


def _shape(x: Any) -> tuple:
    return np.shape(x)


def _binary(dx: Callable, dy: Callable) -> Callable:
    return lambda g, out, x, y: (_unbroadcast(dx(g, out, x, y), _shape(x)), _unbroadcast(dy(g, out, x, y), _shape(y)))


def _expand(g: np.ndarray, shape: tuple, axis, keepdims: bool) -> np.ndarray:
    if axis is None:
        return np.broadcast_to(g, shape)
    if not keepdims:
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        g = np.expand_dims(g, tuple(a % len(shape) for a in axes))
    return np.broadcast_to(g, shape)


def _reduce_count(shape: tuple, axis) -> int:
    if axis is None:
        return math.prod(shape)
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    return math.prod(shape[a] for a in axes)


def _extreme(g, out, x, axis=None, keepdims=False):
    """Gradient of max/min: shared evenly among tied extremes (as torch, JAX and TF do)."""
    hit = (x == _expand(out, x.shape, axis, keepdims)).astype(x.dtype)
    ties = _expand(np.sum(hit, axis=axis, keepdims=keepdims), x.shape, axis, keepdims)
    return (hit * _expand(g, x.shape, axis, keepdims) / ties,)


def _matmul(g, out, a, b):
    # promote vectors to matrices (as matmul does), differentiate, then drop the added axes
    a2 = a[None, :] if a.ndim == 1 else a
    b2 = b[:, None] if b.ndim == 1 else b
    g2 = np.asarray(g)
    if b.ndim == 1:
        g2 = g2[..., None]
    if a.ndim == 1:
        g2 = g2[..., None, :]
    ga = g2 @ np.swapaxes(b2, -1, -2)
    gb = np.swapaxes(a2, -1, -2) @ g2
    ga = ga[..., 0, :] if a.ndim == 1 else ga
    gb = gb[..., :, 0] if b.ndim == 1 else gb
    return _unbroadcast(ga, a.shape), _unbroadcast(gb, b.shape)


def _expand_ellipsis(equation: str, operands) -> tuple[list[str], str]:
    inputs, _, output = equation.replace(" ", "").partition("->")
    specs = inputs.split(",")
    used = set(equation)
    spare = iter(c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used)
    width = max((np.ndim(op) - len(s.replace("...", "")) for s, op in zip(specs, operands) if "..." in s), default=0)
    fill = "".join(next(spare) for _ in range(width))
    specs = [
        s.replace("...", fill[width - (np.ndim(op) - len(s.replace("...", ""))) :]) for s, op in zip(specs, operands)
    ]
    return specs, output.replace("...", fill)


def _einsum(g, out, equation, *operands):
    specs, output = _expand_ellipsis(equation, operands)
    grads: list = [None]
    for i, (spec, operand) in enumerate(zip(specs, operands)):
        if len(set(spec)) != len(spec):
            raise XDeviceError(message("The numpy tape cannot differentiate einsum diagonals", received=equation))
        others = [(s, o) for j, (s, o) in enumerate(zip(specs, operands)) if j != i]
        present = set(output).union(*[set(s) for s, _ in others]) if others else set(output)
        missing = "".join(c for c in spec if c not in present)
        terms = [output] + [s for s, _ in others]
        arrays = [g] + [o for _, o in others]
        if missing:  # letters summed away in the forward pass: broadcast g over them
            terms.append(missing)
            arrays.append(np.ones([operand.shape[spec.index(c)] for c in missing], dtype=g.dtype))
        grad = np.einsum(",".join(terms) + "->" + spec, *arrays, optimize=True)
        grads.append(_unbroadcast(grad, np.shape(operand)))
    return tuple(grads)


def _concat(g, out, xs, axis=0):
    sizes = [np.shape(x)[axis] for x in xs]
    return (np.split(g, np.cumsum(sizes)[:-1], axis=axis),)


def _stack(g, out, xs, axis=0):
    return ([np.take(g, i, axis=axis) for i in range(len(xs))],)


def _slice(g, out, x, starts, stops, axes=None, steps=None):
    grad = np.zeros(np.shape(x), dtype=g.dtype)
    grad[slice_index(np.ndim(x), starts, stops, axes, steps)] = g
    return (grad,)


def _take(g, out, x, indices, axis=0):
    grad = np.zeros(np.shape(x), dtype=g.dtype)
    index = np.asarray(indices)
    moved = np.moveaxis(grad, axis, 0)
    g_moved = (
        np.moveaxis(g, axis, 0)
        if index.ndim == 1
        else np.moveaxis(
            g.reshape(g.shape[: axis % grad.ndim] + index.shape + g.shape[axis % grad.ndim + index.ndim :]),
            tuple(range(axis % grad.ndim, axis % grad.ndim + index.ndim)),
            tuple(range(index.ndim)),
        )
    )
    np.add.at(moved, index % np.shape(x)[axis] if index.size else index, g_moved)
    return (grad, None)


def _take_along_axis(g, out, x, indices, axis):
    shape = np.shape(x)
    grad = np.zeros(shape, dtype=g.dtype)
    index = np.broadcast_to(np.asarray(indices).astype(np.int64) % shape[axis], g.shape)
    # indices and x broadcast against each other off the axis: map each output position
    # back to the x element it read (a size-1 dim of x is read at 0)
    grids = [np.broadcast_to(grid % size, g.shape) for grid, size in zip(np.indices(g.shape, sparse=True), shape)]
    grids[axis % len(shape)] = index
    np.add.at(grad, tuple(grids), g)
    return (grad, None)


def _pad(g, out, x, pad_width, mode="constant", value=0):
    shape = np.shape(x)
    for axis, (before, after) in enumerate(pad_width):
        size = shape[axis]
        source = np.arange(-before, size + after)
        if mode == "reflect":
            period = 2 * (size - 1) if size > 1 else 1
            source = np.abs((source + period) % period if size > 1 else source * 0)
            source = np.where(source >= size, period - source, source)
        elif mode == "edge":
            source = np.clip(source, 0, size - 1)
        keep = (source >= 0) & (source < size)
        moved = np.moveaxis(g, axis, 0)[keep]
        grad = np.zeros((size,) + moved.shape[1:], dtype=g.dtype)
        np.add.at(grad, source[keep], moved)
        g = np.moveaxis(grad, 0, axis)
    return (g,)


def _tile(g, out, x, reps):
    shape = np.shape(x)
    reps = (1,) * (len(shape) - len(reps)) + tuple(reps)
    shape = (1,) * (len(reps) - len(shape)) + tuple(shape)
    split = [d for pair in zip(reps, shape) for d in pair]
    grad = g.reshape(split).sum(axis=tuple(range(0, 2 * len(reps), 2)))
    return (grad.reshape(np.shape(x)),)


def _scatter_windows(cols: np.ndarray, padded_shape, window, stride, dilation) -> np.ndarray:
    """Adjoint of ``windows``: add each window's values back where they came from."""
    out = np.zeros(padded_shape, dtype=cols.dtype)
    dims = len(window)
    out_size = cols.shape[2 : 2 + dims]
    for offset in np.ndindex(*window):
        target = (slice(None), slice(None)) + tuple(
            slice(o * d, o * d + (n - 1) * s + 1, s) for o, d, n, s in zip(offset, dilation, out_size, stride)
        )
        out[target] += cols[(Ellipsis,) + offset]
    return out


def _conv(g, out, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    dims = w.ndim - 2
    stride, dilation = as_tuple(stride, dims), as_tuple(dilation, dims)
    pads = conv_padding(padding, x.shape[2:], w.shape[2:], stride, dilation)
    padded = np.pad(x, [(0, 0), (0, 0), *pads])
    cols = windows(padded, w.shape[2:], stride, dilation)
    n, c = x.shape[:2]
    out_shape = g.shape[2:]
    cols = cols.reshape(n, groups, c // groups, *out_shape, *w.shape[2:])
    gg = g.reshape(n, groups, w.shape[0] // groups, *out_shape)
    wg = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
    o, k = "defgh"[:dims], "uvw"[:dims]
    gw = np.einsum(f"ngo{o},ngc{o}{k}->goc{k}", gg, cols, optimize=True).reshape(w.shape)
    gcols = np.einsum(f"ngo{o},goc{k}->ngc{o}{k}", gg, wg, optimize=True).reshape(n, c, *out_shape, *w.shape[2:])
    gpadded = _scatter_windows(gcols, padded.shape, w.shape[2:], stride, dilation)
    gx = gpadded[(slice(None), slice(None)) + tuple(slice(p[0], p[0] + s) for p, s in zip(pads, x.shape[2:]))]
    gb = None if b is None else g.sum(axis=(0, *range(2, g.ndim)))
    return gx, gw, gb


def _max_pool(g, out, x, window, stride=None, padding=0, dilation=1, ceil_mode=False):
    dims = x.ndim - 2
    window = as_tuple(window, dims)
    stride = as_tuple(stride or window, dims)
    dilation = as_tuple(dilation, dims)
    pads = pool_padding(padding, x.shape[2:], window, stride, dilation, ceil_mode)
    padded = np.pad(x, [(0, 0), (0, 0), *pads], constant_values=-np.inf)
    cols = windows(padded, window, stride, dilation)
    flat = cols.reshape(*cols.shape[: 2 + dims], -1)
    first = np.argmax(flat, axis=-1)  # the first maximum takes the gradient, as in PyTorch
    chosen = np.zeros_like(flat)
    np.put_along_axis(chosen, first[..., None], g[..., None], axis=-1)
    gpadded = _scatter_windows(chosen.reshape(cols.shape), padded.shape, window, stride, dilation)
    return (gpadded[(slice(None), slice(None)) + tuple(slice(p[0], p[0] + s) for p, s in zip(pads, x.shape[2:]))],)


def _avg_pool(g, out, x, window, stride=None, padding=0, count_include_pad=False, ceil_mode=False):
    dims = x.ndim - 2
    window = as_tuple(window, dims)
    stride = as_tuple(stride or window, dims)
    pads = pool_padding(padding, x.shape[2:], window, stride, (1,) * dims, ceil_mode)
    counts = pool_counts(x.shape[2:], pads, window, stride, count_include_pad, padding)
    share = np.broadcast_to((g / counts)[(...,) + (None,) * dims], g.shape + window)
    padded_shape = (x.shape[0], x.shape[1], *(s + a + b for s, (a, b) in zip(x.shape[2:], pads)))
    gpadded = _scatter_windows(np.ascontiguousarray(share), padded_shape, window, stride, (1,) * dims)
    return (gpadded[(slice(None), slice(None)) + tuple(slice(p[0], p[0] + s) for p, s in zip(pads, x.shape[2:]))],)


def _gelu(g, out, x, approximate=False):
    if approximate:
        c = math.sqrt(2 / math.pi)
        inner = c * (x + 0.044715 * x**3)
        t = np.tanh(inner)
        return (g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x)),)
    cdf = 0.5 * (1 + _OPS.erf(x / math.sqrt(2)))
    pdf = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    return (g * (cdf + x * pdf),)


def _cumprod(g, out, x, axis):
    # d out_j / d x_i = prod_{k <= j, k != i} x_k for j >= i: recompute the products with
    # x_i set to 1, so zeros in x are fine (quadratic in the axis length: a reference)
    x, g = np.moveaxis(np.asarray(x), axis, -1), np.moveaxis(g, axis, -1)
    grad = np.empty_like(x)
    for i in range(x.shape[-1]):
        others = x.copy()
        others[..., i] = 1
        products = np.cumprod(others, axis=-1)
        grad[..., i] = np.sum((g * products)[..., i:], axis=-1)
    return (np.moveaxis(grad, -1, axis), None)


def _scatter(g, out, x, indices, updates, axis=0, reduction="none"):
    index = np.asarray(indices).astype(np.int64) % np.shape(x)[axis]
    grids = list(np.indices(index.shape, sparse=True))
    grids[axis % np.ndim(x)] = index
    target = tuple(np.broadcast_to(grid, index.shape) for grid in grids)
    if reduction == "none":
        gx = np.array(g, copy=True)
        gx[target] = 0  # overwritten elements do not reach the output
        # of duplicate writes to one element only the last lands, so only it gets a gradient
        flat = np.ravel_multi_index(target, np.shape(x)).ravel()
        last = np.zeros(flat.size, dtype=bool)
        last[flat.size - 1 - np.unique(flat[::-1], return_index=True)[1]] = True
        gu = np.where(last.reshape(index.shape), g[target], 0)
        return gx, None, _unbroadcast(gu, np.shape(updates))
    if reduction == "add":
        return g, None, _unbroadcast(g[target], np.shape(updates))
    raise XDeviceError(
        message("The numpy tape differentiates scatter with reduction none or add only", received=reduction)
    )


def _det(g, out, x):
    return (g[..., None, None] * out[..., None, None] * np.swapaxes(np.linalg.inv(x), -1, -2),)


def _inverse(axes) -> list[int]:
    return list(np.argsort(axes))


RULES: dict[str, Callable | None] = {
    "negative": lambda g, out, x: (-g,),
    "abs": lambda g, out, x: (g * np.sign(x),),
    "exp": lambda g, out, x: (g * out,),
    "log": lambda g, out, x: (g / x,),
    "sqrt": lambda g, out, x: (g * 0.5 / out,),
    "sin": lambda g, out, x: (g * np.cos(x),),
    "cos": lambda g, out, x: (-g * np.sin(x),),
    "tan": lambda g, out, x: (g * (1 + out * out),),
    "tanh": lambda g, out, x: (g * (1 - out * out),),
    "sigmoid": lambda g, out, x: (g * out * (1 - out),),
    "erf": lambda g, out, x: (g * 2 / math.sqrt(math.pi) * np.exp(-x * x),),
    "relu": lambda g, out, x: (g * (x > 0),),
    "asin": lambda g, out, x: (g / np.sqrt(1 - x * x),),
    "acos": lambda g, out, x: (-g / np.sqrt(1 - x * x),),
    "atan": lambda g, out, x: (g / (1 + x * x),),
    "sinh": lambda g, out, x: (g * np.cosh(x),),
    "cosh": lambda g, out, x: (g * np.sinh(x),),
    "asinh": lambda g, out, x: (g / np.sqrt(x * x + 1),),
    "acosh": lambda g, out, x: (g / np.sqrt(x * x - 1),),
    "atanh": lambda g, out, x: (g / (1 - x * x),),
    "fmod": _binary(lambda g, o, x, y: g, lambda g, o, x, y: -g * np.trunc(np.divide(x, y))),
    "cumprod": _cumprod,
    "scatter": _scatter,
    "det": _det,
    "gelu": _gelu,
    "add": _binary(lambda g, o, x, y: g, lambda g, o, x, y: g),
    "subtract": _binary(lambda g, o, x, y: g, lambda g, o, x, y: -g),
    "multiply": _binary(lambda g, o, x, y: g * y, lambda g, o, x, y: g * x),
    "divide": _binary(lambda g, o, x, y: g / y, lambda g, o, x, y: -g * x / (np.asarray(y) ** 2)),
    "power": _binary(
        lambda g, o, x, y: g * y * np.power(x, np.asarray(y) - 1),
        lambda g, o, x, y: g * o * np.log(np.where(np.asarray(x) > 0, x, 1)),
    ),
    "maximum": _binary(
        lambda g, o, x, y: g * ((x > y) + 0.5 * (x == y)), lambda g, o, x, y: g * ((y > x) + 0.5 * (x == y))
    ),
    "minimum": _binary(
        lambda g, o, x, y: g * ((x < y) + 0.5 * (x == y)), lambda g, o, x, y: g * ((y < x) + 0.5 * (x == y))
    ),
    "mod": _binary(lambda g, o, x, y: g, lambda g, o, x, y: -g * np.floor_divide(x, y)),
    "where": lambda g, out, c, x, y: (
        None,
        _unbroadcast(g * c, _shape(x)),
        _unbroadcast(g * ~np.asarray(c), _shape(y)),
    ),
    "matmul": _matmul,
    "einsum": _einsum,
    "sum": lambda g, out, x, axis=None, keepdims=False: (_expand(g, x.shape, axis, keepdims),),
    "mean": lambda g, out, x, axis=None, keepdims=False: (
        _expand(g, x.shape, axis, keepdims) / _reduce_count(x.shape, axis),
    ),
    "max": _extreme,
    "min": _extreme,
    "prod": lambda g, out, x, axis=None, keepdims=False: (_expand(g * out, x.shape, axis, keepdims) / x,),
    "cumsum": lambda g, out, x, axis: (np.flip(np.cumsum(np.flip(g, axis), axis), axis),),
    "cast": lambda g, out, x, dtype: ((g.astype(x.dtype) if np.asarray(x).dtype.kind == "f" else None), None),
    "reshape": lambda g, out, x, shape: (g.reshape(np.shape(x)), None),
    "transpose": lambda g, out, x, axes=None: (g.transpose(None if axes is None else _inverse(axes)), None),
    "expand_dims": lambda g, out, x, axis: (g.reshape(np.shape(x)), None),
    "squeeze": lambda g, out, x, axis=None: (g.reshape(np.shape(x)), None),
    "broadcast_to": lambda g, out, x, shape: (_unbroadcast(g, np.shape(x)), None),
    "concat": _concat,
    "stack": _stack,
    "slice": _slice,
    "take": _take,
    "take_along_axis": _take_along_axis,
    "pad": _pad,
    "flip": lambda g, out, x, axis: (np.flip(g, axis=axis if isinstance(axis, int) else tuple(axis)), None),
    "tile": _tile,
    "conv": _conv,
    "max_pool": _max_pool,
    "avg_pool": _avg_pool,
}
#: Primitives with no gradient (integer, boolean, rounding or index results).
NO_GRADIENT = (
    "sign",
    "floor",
    "ceil",
    "round",
    "logical_not",
    "isnan",
    "isinf",
    "stop_gradient",
    "floor_divide",
    "logical_and",
    "logical_or",
    "logical_xor",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "left_shift",
    "right_shift",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "argmax",
    "argmin",
    "bitwise_not",
)


# -- kinks: where a gradient jumps ------------------------------------------------------------
#
# relu and abs at 0, maximum/minimum and max pooling at ties: an input that close to a kink
# may land on the other side in another framework's float32 rounding, which changes the
# gradient by a discrete amount that no tolerance covers. The reference measures how close
# its inputs come, relative to their scale, so parity can pick inputs that stay clear.

_margins = threading.local()


@contextlib.contextmanager
def kink_margin() -> Iterator[list[float]]:
    """Collect, while active, each kinked op's closest approach to its kink (relative)."""
    previous = getattr(_margins, "found", None)
    _margins.found = []
    try:
        yield _margins.found
    finally:
        _margins.found = previous


def _note(distance: np.ndarray, scale: np.ndarray) -> None:
    found = getattr(_margins, "found", None)
    if found is not None and np.size(distance):
        found.append(float(np.min(distance)) / max(float(np.max(np.abs(scale))), np.finfo(np.float64).tiny))


def _kinked(name: str, distance: Callable) -> Callable:
    taped = getattr(TapedOps, name)

    def op(self, *args, **kwargs):
        raw = [_raw(a) for a in args]
        _note(*distance(*raw, **kwargs))
        return taped(self, *args, **kwargs)

    op.__name__ = op.__qualname__ = name
    op.__signature__ = getattr(taped, "__signature__", None)  # type: ignore[attr-defined]  # as above
    return op


def _top_two_gap(x, window, stride=None, padding=0, dilation=1, ceil_mode=False):
    dims = np.ndim(x) - 2
    window = as_tuple(window, dims)
    stride, dilation = as_tuple(stride or window, dims), as_tuple(dilation, dims)
    pads = pool_padding(padding, np.shape(x)[2:], window, stride, dilation, ceil_mode)
    cols = windows(np.pad(x, [(0, 0), (0, 0), *pads], constant_values=-np.inf), window, stride, dilation)
    flat = np.sort(cols.reshape(*cols.shape[: 2 + dims], -1), axis=-1)
    gap = flat[..., -1] - flat[..., -2] if flat.shape[-1] > 1 else np.full(flat.shape[:-1], np.inf)
    # an exact tie (ReLU zeros, say) is exact in every framework too: only near-ties can flip
    return np.where(np.isfinite(gap) & (gap > 0), gap, np.inf), np.where(np.isfinite(x), x, 0)


class TapedOps(NumpyOps):
    """The numpy op set, recording a tape whenever an input is a :class:`Var`."""

    def split(self, x, sections, axis=0):
        if not isinstance(x, Var):
            return super().split(x, sections, axis)
        size = x.shape[axis]
        sizes = [size // sections] * sections if isinstance(sections, int) else list(sections)
        bounds = np.cumsum([0, *sizes])
        return [self.slice(x, [int(a)], [int(b)], axes=[axis]) for a, b in zip(bounds[:-1], bounds[1:])]

    def sort(self, x, axis=-1, descending=False):
        if not isinstance(x, Var):
            return super().sort(x, axis, descending)
        _, order = super().sort(x.value, axis, descending)
        return self.take_along_axis(x, order, axis), order  # the gradient follows take_along_axis

    def shape(self, x):
        return tuple(int(d) for d in np.shape(_raw(x)))

    def dtype(self, x):
        return np.asarray(_raw(x)).dtype.name

    def to_numpy(self, x):
        return np.array(_raw(x), copy=True)

    def asarray(self, x, dtype=None):
        return x if isinstance(x, Var) and dtype in (None, x.dtype.name) else super().asarray(_raw(x), dtype)


for _name, _rule in RULES.items():
    setattr(TapedOps, _name, _taped(_name, _rule))
for _name in NO_GRADIENT:
    setattr(TapedOps, _name, _taped(_name, None))
_DISTANCES: dict[str, Callable[..., Any]] = {
    "relu": lambda x: (np.abs(x), x),
    "abs": lambda x: (np.abs(x), x),
    "maximum": lambda x, y: (np.abs(np.subtract(x, y)), np.broadcast_arrays(x, y)[0]),
    "minimum": lambda x, y: (np.abs(np.subtract(x, y)), np.broadcast_arrays(x, y)[0]),
    "max_pool": _top_two_gap,
}
for _name, _distance in _DISTANCES.items():
    setattr(TapedOps, _name, _kinked(_name, _distance))

_OPS = TapedOps()


class Autodiff:
    def value_and_grad(
        self, fn: Callable[..., Any], params: dict[str, Any], *args: Any, has_aux: bool = False
    ) -> tuple[Any, dict[str, Any]]:
        leaves = {name: Var(np.asarray(value)) for name, value in params.items()}
        out = fn(leaves, *args)
        out, aux = out if has_aux else (out, None)
        aux = map_leaves(_raw, aux)
        if not isinstance(out, Var):  # does not depend on params at all
            grads = {name: np.zeros_like(leaf.value) for name, leaf in leaves.items()}
            return ((out, aux) if has_aux else out), grads
        if out.value.size != 1:
            raise XDeviceError(message("value_and_grad needs a scalar", received=f"shape {out.shape}"))
        tape = _backward(out)
        grads = {name: tape.get(id(leaf), np.zeros_like(leaf.value)) for name, leaf in leaves.items()}
        return ((out.value, aux) if has_aux else out.value), grads

    def jit(self, fn: Callable[..., Any], donate: tuple[int, ...] = ()) -> Callable[..., Any]:
        return fn


def _backward(out: Var) -> dict[int, np.ndarray]:
    order, seen = [], set()
    stack = [(out, False)]
    while stack:  # iterative depth-first topological sort (deep LSTM tapes overflow recursion)
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for child in _vars_in(node.inputs):
            if id(child) not in seen:
                stack.append((child, False))
    grads = {id(out): np.ones_like(out.value)}
    for node in reversed(order):
        g = grads.get(id(node))
        if g is None or node.backward is None:
            continue
        for given, grad in zip(node.inputs, node.backward(g)):
            if isinstance(given, Var) and grad is not None:
                _accumulate(grads, given, grad)
            elif isinstance(given, (list, tuple)) and grad is not None:
                for item, item_grad in zip(given, grad):
                    if isinstance(item, Var) and item_grad is not None:
                        _accumulate(grads, item, item_grad)
    return grads


def _accumulate(grads: dict, var: Var, grad) -> None:
    grad = (
        np.asarray(grad, dtype=var.value.dtype).reshape(var.shape)
        if np.size(grad) == var.value.size
        else np.broadcast_to(grad, var.shape).astype(var.value.dtype)
    )
    grads[id(var)] = grads[id(var)] + grad if id(var) in grads else grad


def _vars_in(inputs: tuple) -> list[Var]:
    found = []
    for given in inputs:
        if isinstance(given, Var):
            found.append(given)
        elif isinstance(given, (list, tuple)):
            found.extend(v for v in given if isinstance(v, Var))
    return found
