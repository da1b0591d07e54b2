"""PyTorch's implementation of the op set: the primitives, and native fused composites.

The composites that dominate model time (softmax, normalisation, attention, dense layers,
recurrent layers, cross-entropy) are overridden with torch's own fused kernels, so models
written against the op set run as fast as hand-written torch; the op tests hold each one
to the numpy reference. Padding spellings and the pooling ``ceil_mode`` rule are resolved
by the reference's own helpers, so the two backends cannot drift apart.
"""

from __future__ import annotations

import builtins
import contextlib
import math
import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xdevice._errors import UnsupportedOp, message
from xdevice.backends._dtypes import ml_dtype
from xdevice.backends._shapes import as_tuple, conv_padding, pool_counts, pool_padding
from xdevice.backends.opset import DTYPES, NARROW_DTYPES, Array, Ops
from xdevice.backends.torch.placement import host_array

__all__ = ["TorchOps"]

# torch holds the float8 formats. Its int4/uint4/int2/uint2 are shell dtypes without kernels,
# one value to a byte: a tensor of them holds the bits of an int8/uint8 (``view``), and ``cast``
# goes through that byte. float4_e2m1fn is held the same way in torch's packed
# float4_e2m1fn_x2, one value (its low 4 bits) to a byte, as ml_dtypes holds it.
_NARROW_INT_BYTE = {torch.int4: torch.int8, torch.int2: torch.int8, torch.uint4: torch.uint8, torch.uint2: torch.uint8}
_FLOAT4 = torch.float4_e2m1fn_x2
_NARROW_INT_MASK = {torch.int4: 15, torch.uint4: 15, torch.int2: 3, torch.uint2: 3}
_DTYPES = {name: getattr(torch, name) for name in (*DTYPES, *(n for n in NARROW_DTYPES if n != "float4_e2m1fn"))} | {
    "float4_e2m1fn": _FLOAT4
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


class TorchOps(Ops):
    name = "torch"
    key_dtype = "int64"  # torch's uint32 lacks most arithmetic and bitwise kernels

    # -- arrays ---------------------------------------------------------------------------

    def asarray(self, x: Any, dtype: str | None = None) -> Array:
        want = _dtype(dtype) if dtype else None
        if isinstance(x, torch.Tensor):
            return x if dtype is None or x.dtype == want else self.cast(x, dtype)
        if isinstance(x, np.ndarray):
            if not x.flags.writeable:  # torch would share (and could write) read-only memory
                x = x.copy()
            if x.dtype.name == "bfloat16" or x.dtype.name in NARROW_DTYPES:
                # ml_dtypes' types: torch reads their bits through a signed int of their width
                bits = torch.as_tensor(x.view(f"i{x.dtype.itemsize}"), device=_new.device)
                return self.asarray(bits.view(_dtype(x.dtype.name)), dtype)
        if isinstance(x, torch.SymInt):  # a traced size: as_tensor would fix it at its example value
            return torch.scalar_tensor(x, dtype=want or torch.int64, device=_new.device)
        if self._tracing_control_flow and np.ndim(x) == 0:
            # a constant inside a traced loop or branch: an op, since torch.export's format
            # cannot hold a constant tensor inside one (weights arrive as operands)
            value = np.asarray(x)
            return torch.full((), value.item(), dtype=want or _dtype(value.dtype.name), device=_new.device)
        return torch.as_tensor(x, dtype=want, device=_new.device)

    def to_numpy(self, x: Array) -> Any:
        if isinstance(x, torch.Tensor) and (x.dtype in _NARROW_INT_BYTE or x.dtype == _FLOAT4):
            # ml_dtypes holds them one to a byte too, in the low bits
            return host_array(x.view(torch.uint8), copy=True).view(ml_dtype(_NAMES[x.dtype]))
        return host_array(x, copy=True) if isinstance(x, torch.Tensor) else np.array(x)

    def shape(self, x: Array) -> tuple[int, ...]:
        # tuple() keeps a torch.export SymInt symbolic; int() would pin the dim to its example
        return tuple(x.shape) if isinstance(x, torch.Tensor) else np.shape(x)

    def dtype(self, x: Array) -> str:
        return _NAMES.get(x.dtype) or str(x.dtype).removeprefix("torch.")

    def bitcast(self, x: Array, dtype: str) -> Array:
        return self.asarray(x).view(_dtype(dtype))

    def cast(self, x: Array, dtype: str) -> Array:
        x, want = self.asarray(x), _dtype(dtype)
        if x.dtype == want:
            return x
        if x.dtype in _NARROW_INT_BYTE:  # the shell dtypes have no kernels: read their byte
            x = _narrow_int_values(x)
        elif x.dtype == _FLOAT4:
            x = _float4_values(x)
        if want in _NARROW_INT_BYTE:  # C's cast keeps the low bits, as ml_dtypes does
            return (x.to(torch.int64) & _NARROW_INT_MASK[want]).to(torch.uint8).view(want)
        if want == _FLOAT4:
            return _float4_bits(x).view(_FLOAT4)
        return x.to(want)

    # Where a tensor made from nothing goes. The op set's zeros, ones, full, arange and
    # asarray (of host data) take no input to follow, so they make it on the device that
    # new_tensors_on names (a zoo module's forward names its weights' device), else on torch's
    # default device (a ``with torch.device(...)`` block, ``xdevice.on``). A scope of our own
    # rather than ``torch.device``'s: that one is a TorchFunctionMode, which taxes every torch
    # call inside it (a small zoo model's forward took 1.5x as long under it).

    @staticmethod
    @contextlib.contextmanager
    def new_tensors_on(device: torch.device | str | None):
        """Inside the block, the tensors this op set makes from nothing (``zeros``, ``ones``,
        ``full``, ``arange``, ``asarray`` of host data) are made on ``device``; ``None``
        means torch's default device again. The previous device comes back on leaving.

        >>> import torch
        >>> from xdevice.backends.torch.ops import TorchOps
        >>> with TorchOps.new_tensors_on("meta"):
        ...     TorchOps().zeros((2, 3)).device
        device(type='meta')
        """
        previous, _new.device = _new.device, None if device is None else torch.device(device)
        try:
            yield
        finally:
            _new.device = previous

    def zeros(self, shape: Sequence[int], dtype: str = "float32") -> Array:
        return torch.zeros(tuple(shape), dtype=_dtype(dtype), device=_new.device)

    def ones(self, shape: Sequence[int], dtype: str = "float32") -> Array:
        return torch.ones(tuple(shape), dtype=_dtype(dtype), device=_new.device)

    def full(self, shape: Sequence[int], value: float, dtype: str = "float32") -> Array:
        return torch.full(tuple(shape), value, dtype=_dtype(dtype), device=_new.device)

    def arange(self, start: int, stop: int | None = None, step: int = 1, dtype: str = "int32") -> Array:
        if stop is None:
            start, stop = 0, start
        return torch.arange(start, stop, step, dtype=_dtype(dtype), device=_new.device)

    # the shared ops that make a tensor to combine with an input make it on that input's device

    def one_hot(self, indices: Array, depth: int, dtype: str = "float32") -> Array:
        indices = self.asarray(indices)
        with self.new_tensors_on(indices.device):
            return super().one_hot(indices, depth, dtype)

    def random_bits(self, key: Array, shape: Sequence[int]) -> Array:
        key = self.asarray(key)
        with self.new_tensors_on(key.device):
            return super().random_bits(key, shape)

    # -- elementwise ----------------------------------------------------------------------

    def negative(self, x: Array) -> Array:
        return torch.neg(x)

    def abs(self, x: Array) -> Array:
        return torch.abs(x)

    def sign(self, x: Array) -> Array:
        return torch.sign(x)

    def exp(self, x: Array) -> Array:
        return torch.exp(x)

    def log(self, x: Array) -> Array:
        return torch.log(x)

    def sqrt(self, x: Array) -> Array:
        return torch.sqrt(x)

    def sin(self, x: Array) -> Array:
        return torch.sin(x)

    def cos(self, x: Array) -> Array:
        return torch.cos(x)

    def tan(self, x: Array) -> Array:
        return torch.tan(x)

    def tanh(self, x: Array) -> Array:
        return torch.tanh(x)

    def sigmoid(self, x: Array) -> Array:
        return torch.sigmoid(x)

    def erf(self, x: Array) -> Array:
        return torch.erf(x)

    def floor(self, x: Array) -> Array:
        return torch.floor(x)

    def ceil(self, x: Array) -> Array:
        return torch.ceil(x)

    def round(self, x: Array) -> Array:
        return torch.round(x)  # half to even, as numpy

    def asin(self, x: Array) -> Array:
        return torch.asin(x)

    def acos(self, x: Array) -> Array:
        return torch.acos(x)

    def atan(self, x: Array) -> Array:
        return torch.atan(x)

    def sinh(self, x: Array) -> Array:
        return torch.sinh(x)

    def cosh(self, x: Array) -> Array:
        return torch.cosh(x)

    def asinh(self, x: Array) -> Array:
        return torch.asinh(x)

    def acosh(self, x: Array) -> Array:
        return torch.acosh(x)

    def atanh(self, x: Array) -> Array:
        return torch.atanh(x)

    def bitwise_not(self, x: Array) -> Array:
        if x.dtype in _SIGNED_TWIN:  # no kernel for uint16/32/64; the complement is the same bits
            return torch.bitwise_not(x.view(_SIGNED_TWIN[x.dtype])).view(x.dtype)
        return torch.bitwise_not(x)  # logical not for bool

    def fmod(self, x: Array, y: Array) -> Array:
        if _unsigned(x, y):  # unsigned: fmod and mod agree
            return _unsigned_op("mod", x, y)
        x, y = _tensors(x, y)  # torch.fmod takes no number first
        if x.is_floating_point() or y.is_floating_point():
            return torch.fmod(x, y)
        # integer division by zero raises in torch's CPU kernel; numpy gives 0
        zero = y == 0
        return torch.where(zero, 0, torch.fmod(x, torch.where(zero, 1, y)))

    def cumprod(self, x: Array, axis: int) -> Array:
        return torch.cumprod(x, dim=axis)

    def sort(self, x: Array, axis: int = -1, descending: bool = False) -> tuple[Array, Array]:
        # stable=True keeps equal values (and NaNs, which torch puts where the reference
        # does: last ascending, first descending) in index order both ways
        return tuple(torch.sort(x, dim=axis, descending=descending, stable=True))

    def scatter(self, x: Array, indices: Array, updates: Array, axis: int = 0, reduction: str = "none") -> Array:
        index = torch.as_tensor(indices, device=x.device).long()
        index = torch.where(index < 0, index + x.shape[axis], index)
        updates = torch.broadcast_to(torch.as_tensor(updates, device=x.device), index.shape).to(x.dtype)
        if reduction in _SCATTER:
            return torch.scatter_reduce(x, axis, index, updates, _SCATTER[reduction], include_self=True)
        if reduction != "none":
            raise UnsupportedOp(message("Unknown scatter reduction", received=reduction, choices=["none", *_SCATTER]))
        return self.scatter_last_wins(x, index, updates, axis)

    def det(self, x: Array) -> Array:
        return torch.linalg.det(_floating(x))

    def relu(self, x: Array) -> Array:
        return torch.relu(x)

    def logical_not(self, x: Array) -> Array:
        return torch.logical_not(x)

    def isnan(self, x: Array) -> Array:
        return torch.isnan(x)

    def isinf(self, x: Array) -> Array:
        return torch.isinf(x)

    def stop_gradient(self, x: Array) -> Array:
        return x.detach() if isinstance(x, torch.Tensor) else x

    def gelu(self, x: Array, approximate: bool = False) -> Array:
        return F.gelu(x, approximate="tanh" if approximate else "none")

    # Python operators accept a number on either side (torch.sub(1.0, t) does not), and
    # torch treats such a number as weak, as numpy's NEP 50 does.
    def add(self, x: Array, y: Array) -> Array:
        return _unsigned_op("add", x, y) if _unsigned(x, y) else x + y

    def subtract(self, x: Array, y: Array) -> Array:
        return _unsigned_op("subtract", x, y) if _unsigned(x, y) else x - y

    def multiply(self, x: Array, y: Array) -> Array:
        return _unsigned_op("multiply", x, y) if _unsigned(x, y) else x * y

    def divide(self, x: Array, y: Array) -> Array:
        return x / y

    def power(self, x: Array, y: Array) -> Array:
        return x**y

    def maximum(self, x: Array, y: Array) -> Array:
        return _unsigned_op("maximum", x, y) if _unsigned(x, y) else torch.maximum(*_tensors(x, y))

    def minimum(self, x: Array, y: Array) -> Array:
        return _unsigned_op("minimum", x, y) if _unsigned(x, y) else torch.minimum(*_tensors(x, y))

    def mod(self, x: Array, y: Array) -> Array:
        return _unsigned_op("mod", x, y) if _unsigned(x, y) else x % y  # torch.remainder: the divisor's sign

    def floor_divide(self, x: Array, y: Array) -> Array:
        return _unsigned_op("floor_divide", x, y) if _unsigned(x, y) else x // y

    def logical_and(self, x: Array, y: Array) -> Array:
        return torch.logical_and(*_tensors(x, y))

    def logical_or(self, x: Array, y: Array) -> Array:
        return torch.logical_or(*_tensors(x, y))

    def logical_xor(self, x: Array, y: Array) -> Array:
        return torch.logical_xor(*_tensors(x, y))

    def bitwise_and(self, x: Array, y: Array) -> Array:
        return x & y

    def bitwise_or(self, x: Array, y: Array) -> Array:
        return x | y

    def bitwise_xor(self, x: Array, y: Array) -> Array:
        return x ^ y

    def left_shift(self, x: Array, y: Array) -> Array:
        return _unsigned_op("left_shift", x, y) if _unsigned(x, y) else x << y

    def right_shift(self, x: Array, y: Array) -> Array:
        return _unsigned_op("right_shift", x, y) if _unsigned(x, y) else x >> y

    def equal(self, x: Array, y: Array) -> Array:
        return x == y

    def not_equal(self, x: Array, y: Array) -> Array:
        return x != y

    def less(self, x: Array, y: Array) -> Array:
        return _unsigned_op("less", x, y) if _unsigned(x, y) else x < y

    def less_equal(self, x: Array, y: Array) -> Array:
        return _unsigned_op("less_equal", x, y) if _unsigned(x, y) else x <= y

    def greater(self, x: Array, y: Array) -> Array:
        return _unsigned_op("greater", x, y) if _unsigned(x, y) else x > y

    def greater_equal(self, x: Array, y: Array) -> Array:
        return _unsigned_op("greater_equal", x, y) if _unsigned(x, y) else x >= y

    def write_slots(self, x: Array, update: Array, start: Any, axis: int) -> Array:
        n = update.shape[axis]
        start = torch.as_tensor(start, device=x.device).to(torch.int64)
        return x.index_copy(axis, start + torch.arange(n, device=x.device), update.to(x.dtype))

    def where(self, condition: Array, x: Array, y: Array) -> Array:
        condition = self.asarray(condition)
        return torch.where(condition if condition.dtype == torch.bool else condition != 0, x, y)

    # torch.while_loop and torch.cond trace their functions with dynamo, which cannot follow
    # the ONNX interpreter; their operators themselves trace with torch.export's own tracer,
    # given every outside tensor as an operand (torch lifts nothing from closures)

    _tracing_control_flow = False

    def while_loop(self, condition, body, state: tuple, operands: tuple = ()) -> tuple:
        from torch._higher_order_ops.while_loop import while_loop_op

        count = len(state)
        with self._control_flow():
            return tuple(
                while_loop_op(
                    lambda *s: torch.reshape(condition(s[:count], s[count:]), ()).bool(),
                    lambda *s: tuple(body(s[:count], s[count:])),
                    tuple(state),
                    tuple(operands),
                )
            )

    def cond(self, predicate: Array, then, otherwise, operands: tuple = ()) -> tuple:
        from torch._higher_order_ops.cond import cond_op

        with self._control_flow():
            return tuple(
                cond_op(
                    torch.reshape(predicate, ()).bool(),
                    lambda *o: tuple(then(*o)),
                    lambda *o: tuple(otherwise(*o)),
                    tuple(operands),
                )
            )

    @contextlib.contextmanager
    def _control_flow(self):
        previous, self._tracing_control_flow = self._tracing_control_flow, True
        try:
            yield
        finally:
            self._tracing_control_flow = previous

    # -- linear algebra -------------------------------------------------------------------

    def matmul(self, a: Array, b: Array) -> Array:
        return torch.matmul(*_promoted(a, b))

    def einsum(self, equation: str, *operands: Array) -> Array:
        return torch.einsum(equation, *_promoted(*operands))

    # -- reductions -----------------------------------------------------------------------

    def sum(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return torch.sum(x, dim=_dims(axis), keepdim=keepdims)

    def mean(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return torch.mean(_floating(x), dim=_dims(axis), keepdim=keepdims)

    def max(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        # amax, not max: its gradient splits evenly between tied maxima, as the reference does
        return torch.amax(x, dim=_dims(axis, every=()), keepdim=keepdims)

    def min(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        return torch.amin(x, dim=_dims(axis, every=()), keepdim=keepdims)

    def prod(self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Array:
        if axis is None:
            out = torch.prod(x)
            return out.reshape((1,) * x.dim()) if keepdims else out
        # torch.prod reduces one axis at a time; go from the last so the others keep their place
        for a in sorted((d % x.dim() for d in np.atleast_1d(axis).tolist()), reverse=True):
            x = torch.prod(x, dim=a, keepdim=keepdims)
        return x

    def argmax(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return torch.argmax(x, dim=axis, keepdim=keepdims)

    def argmin(self, x: Array, axis: int, keepdims: bool = False) -> Array:
        return torch.argmin(x, dim=axis, keepdim=keepdims)

    def cumsum(self, x: Array, axis: int) -> Array:
        return torch.cumsum(x, dim=axis)

    # -- shape ----------------------------------------------------------------------------

    def reshape(self, x: Array, shape: Sequence[int]) -> Array:
        return torch.reshape(x, tuple(shape))

    def transpose(self, x: Array, axes: Sequence[int] | None = None) -> Array:
        return x.permute(tuple(range(x.dim() - 1, -1, -1)) if axes is None else tuple(axes))

    def expand_dims(self, x: Array, axis: int) -> Array:
        return torch.unsqueeze(x, axis)

    def squeeze(self, x: Array, axis: int | Sequence[int] | None = None) -> Array:
        return torch.squeeze(x) if axis is None else torch.squeeze(x, _axes(axis))

    def broadcast_to(self, x: Array, shape: Sequence[int]) -> Array:
        return torch.broadcast_to(x, tuple(shape))

    def concat(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return torch.cat(list(xs), dim=axis)

    def stack(self, xs: Sequence[Array], axis: int = 0) -> Array:
        return torch.stack(list(xs), dim=axis)

    def split(self, x: Array, sections: int | Sequence[int], axis: int = 0) -> list[Array]:
        sizes = x.shape[axis] // sections if isinstance(sections, int) else [int(s) for s in sections]
        return list(torch.split(x, sizes, dim=axis))

    def slice(
        self,
        x: Array,
        starts: Sequence[int],
        stops: Sequence[int],
        axes: Sequence[int] | None = None,
        steps: Sequence[int] | None = None,
    ) -> Array:
        index = [builtins.slice(None)] * x.dim()
        flipped = []  # torch slices only forward: take the same elements ascending, then flip
        axes = range(len(starts)) if axes is None else axes
        steps = [1] * len(starts) if steps is None else steps
        for axis, start, stop, step in zip(axes, starts, stops, steps):
            if step > 0:  # torch clamps forward bounds itself (symbolic ones too, under torch.export)
                index[axis] = builtins.slice(start, stop, step)
                continue
            picked = range(*builtins.slice(start, stop, step).indices(x.shape[axis]))
            if step < 0:
                index[axis] = builtins.slice(picked[-1], picked[0] + 1, -step) if picked else builtins.slice(0)
                flipped.append(axis)
        out = x[tuple(index)]
        return torch.flip(out, flipped) if flipped else out

    def take(self, x: Array, indices: Array | int, axis: int = 0) -> Array:
        if isinstance(indices, (int, np.integer)):
            return torch.select(x, axis, int(indices))
        # numpy's take, with negative indices wrapping, as index_select rather than advanced
        # indexing: the latter's backward accumulates with index_put_ across threads in no fixed
        # order (a seeded fit then differs run to run), index_select's index_add_ in index order
        indices = torch.as_tensor(indices, device=x.device)
        if indices.dtype not in (torch.int32, torch.int64):  # index_select takes only these
            indices = indices.long()
        axis %= x.dim()
        flat = torch.where(indices < 0, indices + x.shape[axis], indices).reshape(-1)
        picked = torch.index_select(x, axis, flat)
        return picked.reshape(*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :])

    def take_along_axis(self, x: Array, indices: Array, axis: int) -> Array:
        indices = torch.as_tensor(indices, device=x.device).long()  # gather wants int64
        return torch.take_along_dim(x, torch.where(indices < 0, indices + x.shape[axis], indices), dim=axis)

    def pad(self, x: Array, pad_width: Sequence[tuple[int, int]], mode: str = "constant", value: float = 0) -> Array:
        pad_width = [(before, after) for before, after in pad_width]
        if mode == "constant":
            return F.pad(x, _flat_pads(pad_width), value=value)
        if mode not in ("reflect", "edge"):
            raise UnsupportedOp(message("Unknown pad mode", received=mode, choices=["constant", "reflect", "edge"]))
        # F.pad's reflect/replicate only pad the trailing dims of batched inputs; gathering
        # source indices axis by axis works for any rank and any width (as numpy does)
        for axis, (before, after) in enumerate(pad_width):
            if before or after:
                x = torch.index_select(x, axis, _pad_source(x.shape[axis], before, after, mode, x.device))
        return x

    def flip(self, x: Array, axis: int | Sequence[int]) -> Array:
        return torch.flip(x, _axes(axis))

    def tile(self, x: Array, reps: Sequence[int]) -> Array:
        return torch.tile(x, tuple(reps))

    # -- neural network -------------------------------------------------------------------

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
        dims = w.dim() - 2
        pads = conv_padding(padding, x.shape[2:], w.shape[2:], stride, dilation)
        x, each_side = _symmetric(x, pads)
        return _CONV[dims](x, w, b, as_tuple(stride, dims), each_side, as_tuple(dilation, dims), groups)

    def max_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        dilation: int | Sequence[int] = 1,
        ceil_mode: bool = False,
    ) -> Array:
        dims = x.dim() - 2
        window, dilation = as_tuple(window, dims), as_tuple(dilation, dims)
        stride = as_tuple(stride or window, dims)
        pads = conv_padding(padding, x.shape[2:], window, stride, dilation)
        if _native_pool_pads(pads, window):  # torch's own ceil_mode rule is the reference's
            return _MAX_POOL[dims](x, window, stride, [p for p, _ in pads], dilation, ceil_mode)
        pads = pool_padding(padding, x.shape[2:], window, stride, dilation, ceil_mode)
        return _MAX_POOL[dims](F.pad(x, _flat_pads(pads), value=-math.inf), window, stride, 0, dilation)

    def avg_pool(
        self,
        x: Array,
        window: int | Sequence[int],
        stride: int | Sequence[int] | None = None,
        padding: Any = 0,
        count_include_pad: bool = False,
        ceil_mode: bool = False,
    ) -> Array:
        dims = x.dim() - 2
        window = as_tuple(window, dims)
        stride = as_tuple(stride or window, dims)
        ones = (1,) * dims
        pads = conv_padding(padding, x.shape[2:], window, stride, ones)
        if _native_pool_pads(pads, window):  # torch counts (declared padding only) as the reference
            return _AVG_POOL[dims](x, window, stride, [p for p, _ in pads], ceil_mode, count_include_pad)
        # padding torch cannot express: window sums over explicit zero padding, divided by
        # the reference's own counts
        pads = pool_padding(padding, x.shape[2:], window, stride, ones, ceil_mode)
        sums = _AVG_POOL[dims](F.pad(x, _flat_pads(pads)), window, stride, 0, False, True) * math.prod(window)
        counts = pool_counts(tuple(x.shape[2:]), pads, window, stride, count_include_pad, padding)
        return sums / torch.as_tensor(counts, dtype=x.dtype, device=x.device)

    # -- composites overridden with torch's fused kernels -------------------------------------

    def square(self, x: Array) -> Array:
        return torch.square(x)

    def sgd_update(self, params, grads, buffers, *, lr, momentum=0.0, nesterov=False, weight_decay=0.0, inplace=False):
        if not inplace:
            return super().sgd_update(
                params, grads, buffers, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay
            )
        # torch.optim.SGD's steps, each over every tensor at once, in place
        grads = _matching(grads, params)
        with torch.no_grad():
            if weight_decay:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
            if momentum:
                torch._foreach_mul_(buffers, momentum)
                torch._foreach_add_(buffers, grads)
                grads = torch._foreach_add(grads, buffers, alpha=momentum) if nesterov else buffers
            torch._foreach_add_(params, grads, alpha=-lr)
        return params, buffers if momentum else None

    def adam_update(
        self, params, grads, m, v, step, *, lr, beta1, beta2, eps, weight_decay=0.0, decoupled=False, inplace=False
    ):
        dtypes = {p.dtype for p in params}
        if not inplace or len(dtypes) != 1 or dtypes.pop() not in (torch.float32, torch.float64):
            return super().adam_update(
                params,
                grads,
                m,
                v,
                step,
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                eps=eps,
                weight_decay=weight_decay,
                decoupled=decoupled,
            )
        # the composite's steps, each over every tensor at once, in place; the bias corrections
        # are computed once, in the parameters' precision, as the composite computes them
        real = np.dtype(str(params[0].dtype).removeprefix("torch.")).type
        correction1 = real(1) - real(beta1) ** real(int(step))
        correction2 = real(1) - real(beta2) ** real(int(step))
        grads = _matching(grads, params)
        with torch.no_grad():
            if weight_decay and decoupled:
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            elif weight_decay:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
            torch._foreach_mul_(m, beta1)
            torch._foreach_add_(m, grads, alpha=1 - beta1)
            torch._foreach_mul_(v, beta2)
            torch._foreach_addcmul_(v, grads, grads, 1 - beta2)
            denominator = torch._foreach_sqrt(v)
            torch._foreach_div_(denominator, float(np.sqrt(correction2)))
            torch._foreach_add_(denominator, eps)
            torch._foreach_addcdiv_(params, m, denominator, -float(real(lr) / correction1))
        return params, m, v

    def reciprocal(self, x: Array) -> Array:
        return torch.reciprocal(x)

    def rsqrt(self, x: Array) -> Array:
        return torch.rsqrt(x)

    def softplus(self, x: Array) -> Array:
        return F.softplus(x)

    def clip(self, x: Array, low: float | None = None, high: float | None = None) -> Array:
        return x if low is None and high is None else torch.clamp(x, low, high)

    def var(
        self, x: Array, axis: int | Sequence[int] | None = None, keepdims: bool = False, correction: int = 0
    ) -> Array:
        return torch.var(_floating(x), dim=_dims(axis), correction=correction, keepdim=keepdims)

    def logsumexp(self, x: Array, axis: int = -1, keepdims: bool = False) -> Array:
        return torch.logsumexp(x, dim=axis, keepdim=keepdims)

    def softmax(self, x: Array, axis: int = -1) -> Array:
        return torch.softmax(x, dim=axis)

    def log_softmax(self, x: Array, axis: int = -1) -> Array:
        return torch.log_softmax(x, dim=axis)

    def linear(self, x: Array, w: Array, b: Array | None = None) -> Array:
        return F.linear(x, w.t(), b)  # F.linear wants (out, in); the transpose is a free view

    def layer_norm(
        self, x: Array, scale: Array | None, offset: Array | None, axis: int = -1, eps: float = 1e-5
    ) -> Array:
        normalised = x.shape[axis % x.dim() :]
        if any(p is not None and p.shape != normalised for p in (scale, offset)):
            return super().layer_norm(x, scale, offset, axis, eps)  # merely broadcastable affine
        # aten's fused affine sums the scale's and offset's gradients over rows in chunks set by
        # the thread count: applied outside, they are the same at any thread count (bitwise)
        y = F.layer_norm(x, normalised, None, None, eps)
        y = y if scale is None else y * scale
        return y if offset is None else y + offset

    def batch_norm(self, x: Array, scale: Array, offset: Array, mean: Array, var: Array, eps: float = 1e-5) -> Array:
        if mean.requires_grad or var.requires_grad:  # aten's kernel treats them as constants
            return super().batch_norm(x, scale, offset, mean, var, eps)
        return F.batch_norm(x, mean, var, scale, offset, training=False, eps=eps)

    def batch_norm_train(self, x: Array, scale: Array, offset: Array, eps: float = 1e-5) -> tuple[Array, Array, Array]:
        # One fused pass normalises (differentiating y through the statistics) and, with
        # momentum 1, leaves the exact batch mean and unbiased variance in the "running"
        # buffers; _BatchStats then gives those statistics their own gradient. (torch.var_mean
        # over N and the spatial axes would cost more than the normalisation itself.)
        mean, var = torch.zeros_like(scale), torch.ones_like(scale)
        y = F.batch_norm(x, mean, var, scale, offset, training=True, momentum=1.0, eps=eps)
        count = x.numel() // x.shape[1]
        return y, *_BatchStats.apply(x, mean, var * ((count - 1) / count))

    def attention(self, q: Array, k: Array, v: Array, mask: Array | None = None, scale: float | None = None) -> Array:
        if mask is not None:
            # The reference gives a fully masked row equal scores: it attends uniformly, with
            # no gradient to q or k (torch's kernels give zeros or NaN). A zero query row with
            # every key allowed is exactly that. On the CPU, seeing that no row is fully masked
            # costs nothing; on an accelerator it would stall, so the fix always runs there.
            # A trace (torch.export, torch.compile) cannot branch on data: it always fixes.
            mask = self.asarray(mask, "bool")
            attends = mask.any(dim=-1, keepdim=True)
            if mask.device.type != "cpu" or _traced(mask) or not bool(attends.all()):
                q, mask = torch.where(attends, q, 0.0), mask | ~attends
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def checkpoint(self, fn: Any, *args: Array) -> Any:
        if not torch.is_grad_enabled():  # nothing is kept for a backward pass: nothing to recompute
            return fn(*args)
        from torch.overrides import _get_current_function_mode_stack
        from torch.utils.checkpoint import checkpoint

        # The backward pass recomputes fn under the torch function modes of this forward that ask
        # for it (``recomputed``: tensor parallel's exchanges, backends/torch/replication.py), as
        # torch's checkpoint does for its own device mode, found the same way: the backward pass
        # runs outside them, and the recomputation would otherwise exchange what the forward did not.
        modes = [mode for mode in _get_current_function_mode_stack() if getattr(mode, "recomputed", False)]

        @contextlib.contextmanager
        def recomputing() -> Any:
            with contextlib.ExitStack() as stack:
                for mode in modes:
                    stack.enter_context(mode)
                yield

        def contexts() -> tuple[Any, Any]:  # (the forward's, the recomputation's)
            return contextlib.nullcontext(), recomputing()

        # non-reentrant: closures over tensors that need gradients get them, and torch asks it
        if not modes:
            return checkpoint(fn, *args, use_reentrant=False)
        return checkpoint(fn, *args, use_reentrant=False, context_fn=contexts)

    def lstm_cell(self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array) -> tuple[Array, Array]:
        if x.dim() != 2:  # torch's cell takes one batch axis
            return super().lstm_cell(x, h, c, w_ih, w_hh, b)
        return torch.lstm_cell(x, (h, c), w_ih.t(), w_hh.t(), b)

    def lstm(self, x: Array, h: Array, c: Array, w_ih: Array, w_hh: Array, b: Array) -> tuple[Array, Array, Array]:
        if not isinstance(x.shape[1], int):  # a symbolic time axis: aten's lstm would fix it

            def step(inputs, state, w_hh):
                i, f, g, o = (inputs + state[0] @ w_hh).chunk(4, dim=-1)
                c = torch.sigmoid(f) * state[1] + torch.sigmoid(i) * torch.tanh(g)
                return torch.sigmoid(o) * torch.tanh(c), c

            out, (h, c) = _scan_time(step, x @ w_ih + b, (h, c), (w_hh,))
            return out, h, c
        # torch's LSTM keeps two biases; ours is their sum, so the second is zero
        params = (w_ih.t(), w_hh.t(), b, torch.zeros_like(b))
        out, h, c = torch.lstm(x, (h[None], c[None]), params, *_rnn_flags())
        return out, h[0], c[0]

    def gru_cell(self, x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array) -> Array:
        if x.dim() != 2:
            return super().gru_cell(x, h, w_ih, w_hh, b_ih, b_hh)
        return torch.gru_cell(x, h, w_ih.t(), w_hh.t(), b_ih, b_hh)

    def gru(self, x: Array, h: Array, w_ih: Array, w_hh: Array, b_ih: Array, b_hh: Array) -> tuple[Array, Array]:
        if not isinstance(x.shape[1], int):  # a symbolic time axis: aten's gru would fix it

            def step(inputs, state, w_hh, b_hh):
                xr, xz, xn = inputs.chunk(3, dim=-1)
                hr, hz, hn = (state[0] @ w_hh + b_hh).chunk(3, dim=-1)
                r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
                return ((1 - z) * torch.tanh(xn + r * hn) + z * state[0],)

            out, (h,) = _scan_time(step, x @ w_ih + b_ih, (h,), (w_hh, b_hh))
            return out, h
        # torch's GRU has the reference's equations, b_hn inside the reset gate included
        params = (w_ih.t(), w_hh.t(), b_ih, b_hh)
        out, h = torch.gru(x, h[None], params, *_rnn_flags())
        return out, h[0]

    def cross_entropy(self, logits: Array, labels: Array) -> Array:
        return F.cross_entropy(logits, torch.as_tensor(labels, device=logits.device).long())


def _scan_time(step, projected: torch.Tensor, state: tuple, weights: tuple) -> tuple[torch.Tensor, tuple]:
    """``state = step(projected[:, t], state, *weights)`` over a time axis that torch.export
    keeps symbolic, as torch's scan operator (traced by export's own tracer, weights as
    operands): the stacked first state ``(N, T, H)`` and the last state."""
    from torch._higher_order_ops.scan import scan_op

    count = len(state)
    # the same tensor twice as initial state (the zoo LSTM's h and c are one zeros): scan's
    # carries may not alias each other, so the repeat is a copy
    state = tuple(s.clone() if any(s is seen for seen in state[:i]) else s for i, s in enumerate(state))

    def combine(*args):
        new = step(args[count], args[:count], *args[count + 1 :])
        return (*new, new[0].clone())

    out = scan_op(combine, tuple(state), (projected.transpose(0, 1),), tuple(weights))
    return out[count].transpose(0, 1), tuple(out[:count])


class _NewTensors(threading.local):
    """Per thread, the device ``TorchOps.new_tensors_on`` named (None: torch's default). A
    thread-local attribute, not a ContextVar: torch.compile traces an attribute read."""

    device: torch.device | None = None


_new = _NewTensors()

_SCATTER = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}
_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}
#: The signed type that holds every value of an unsigned one torch has few kernels for.
_WIDER_SIGNED = {torch.uint16: torch.int32, torch.uint32: torch.int64}
_INT_OPS = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "left_shift": operator.lshift,
    "right_shift": operator.rshift,
    "less": operator.lt,
    "less_equal": operator.le,
    "greater": operator.gt,
    "greater_equal": operator.ge,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "mod": operator.mod,
    "floor_divide": operator.floordiv,
}
_FLOAT4_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # float4_e2m1fn's magnitudes by code


def _unsigned(x: Any, y: Any) -> torch.dtype | None:
    """The dtype of ``x`` or ``y`` when it is uint16/32/64, whose arithmetic, comparison and
    shift kernels torch lacks ("add_stub not implemented for 'UInt16'"); else None."""
    for v in (x, y):
        if isinstance(v, torch.Tensor) and v.dtype in _SIGNED_TWIN:
            return v.dtype
    return None


def _unsigned_op(name: str, x: Any, y: Any) -> torch.Tensor:
    """``x <name> y`` for uint16/32/64 operands, computed in signed types and wrapped back:
    uint16 and uint32 in a wider signed type; uint64 on its int64 bits, where two's complement
    already gives add, subtract, multiply and left shift, and comparisons, division, modulo and
    right shift reread the bits as unsigned."""
    dtype = _unsigned(x, y)
    assert dtype is not None
    if dtype in _WIDER_SIGNED:
        a, b = (v.to(_WIDER_SIGNED[dtype]) if isinstance(v, torch.Tensor) else v for v in (x, y))
        out = _INT_OPS[name](*_tensors(a, b))
        return out if out.dtype == torch.bool else out.to(dtype)
    a, b = (_int64_bits(v, x, y) for v in (x, y))
    if name in ("add", "subtract", "multiply", "left_shift"):
        return _INT_OPS[name](a, b).view(dtype)
    if name in ("less", "less_equal", "greater", "greater_equal"):
        return _INT_OPS[name](a ^ _SIGN_BIT, b ^ _SIGN_BIT)  # flipping the sign bit orders them unsigned
    if name in ("maximum", "minimum"):
        first = (a ^ _SIGN_BIT > b ^ _SIGN_BIT) == (name == "maximum")
        return torch.where(first, a, b).view(dtype)
    if name == "right_shift":
        return _logical_right_shift(a, b).view(dtype)
    quotient = _unsigned_divide(a, b)
    return (quotient if name == "floor_divide" else a - quotient * b).view(dtype)


_SIGN_BIT = -(2**63)


def _int64_bits(v: Any, x: Any, y: Any) -> torch.Tensor:
    """A uint64 operand (a tensor, or a Python number) as int64 with the same 64 bits."""
    if isinstance(v, torch.Tensor):
        return v.view(torch.int64) if v.dtype == torch.uint64 else v.to(torch.int64)
    device = (x if isinstance(x, torch.Tensor) else y).device
    return torch.as_tensor(int(v) - 2**64 if int(v) >= 2**63 else int(v), dtype=torch.int64, device=device)


def _logical_right_shift(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """``a >> s`` filling with zeros, on int64 bits (torch shifts int64 arithmetically)."""
    shifted = (a >> s) & ((1 << (64 - s.clamp(min=1))) - 1)  # keeps the 64 - s low bits
    return torch.where(s == 0, a, shifted)


def _unsigned_divide(n: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """``n // d`` of uint64 values held as int64 bits, with signed operations (Hacker's
    Delight 9-3): halve ``n`` so it is non-negative, divide, double, and correct by one; a
    divisor of 2**63 or more goes at most once. Division by zero gives 0, as numpy's does."""
    n, d = torch.broadcast_tensors(n, d)
    big, zero = d < 0, d == 0
    safe = torch.where(big | zero, 1, d)
    quotient = ((_logical_right_shift(n, torch.ones_like(n)) // safe) << 1).where(~(big | zero), 0)
    remainder = n - quotient * safe
    quotient = quotient + (remainder ^ _SIGN_BIT >= safe ^ _SIGN_BIT).long()
    at_most_once = (n ^ _SIGN_BIT >= d ^ _SIGN_BIT).long()
    return torch.where(zero, 0, torch.where(big, at_most_once, quotient))


def _narrow_int_values(x: torch.Tensor) -> torch.Tensor:
    """The int8/uint8 values of int4/uint4/int2/uint2 held one to a byte in its low bits (the
    layout ml_dtypes uses: int4's -1 is the byte 0x0F), sign-extended for the signed ones."""
    mask = _NARROW_INT_MASK[x.dtype]
    low = x.view(torch.uint8).to(torch.int16) & mask
    if _NARROW_INT_BYTE[x.dtype] == torch.int8:
        low = torch.where(low > mask // 2, low - (mask + 1), low)
    return low.to(_NARROW_INT_BYTE[x.dtype])


def _float4_values(bits: torch.Tensor) -> torch.Tensor:
    """float32 values of float4_e2m1fn codes held one to a byte."""
    code = bits.view(torch.uint8).to(torch.int64) & 15
    grid = torch.tensor(_FLOAT4_GRID, device=bits.device)
    return torch.where(code >= 8, -grid[code & 7], grid[code & 7])


def _float4_bits(x: torch.Tensor) -> torch.Tensor:
    """float4_e2m1fn codes (uint8) of ``x``, rounded to nearest even and saturated to +-6 as
    ml_dtypes does (NaN becomes -0, as there)."""
    x = x.to(torch.float32)
    magnitude = x.abs().clamp(max=6.0)
    # the grid's spacing is 0.5 below 2, 1 below 4, then 2; round() ties to even, which on
    # this grid is the even code
    step = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    rounded = torch.where(x.isnan(), 0.0, torch.round(magnitude / step) * step)
    code = torch.bucketize(rounded, torch.tensor(_FLOAT4_GRID, device=x.device))
    negative = (x < 0) | torch.signbit(x) | x.isnan()
    return (code + torch.where(negative, 8, 0)).to(torch.uint8)


class _BatchStats(torch.autograd.Function):
    """A batch's per-channel mean and biased variance, already computed, with their exact
    gradient: ``d mean / dx = 1/n`` and ``d var / dx = 2 (x - mean) / n``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> tuple:
        ctx.save_for_backward(x, mean)  # x is saved by the normalisation anyway: no new memory
        return mean.clone(), var.clone()

    @staticmethod
    def backward(ctx: Any, grad_mean: torch.Tensor, grad_var: torch.Tensor) -> tuple:
        x, mean = ctx.saved_tensors
        shape = (1, -1) + (1,) * (x.dim() - 2)
        grad = grad_mean.reshape(shape) + 2 * grad_var.reshape(shape) * (x - mean.reshape(shape))
        return grad * (x.shape[1] / x.numel()), None, None


# -- helpers ----------------------------------------------------------------------------------


def _rnn_flags() -> tuple:
    """torch.lstm / torch.gru's ``has_biases, num_layers, dropout, train, bidirectional,
    batch_first`` for one batch-first layer; ``train`` makes cuDNN keep what its backward
    needs, so it is on exactly when a gradient may be taken."""
    return True, 1, 0.0, torch.is_grad_enabled(), False, True


def _dtype(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:  # int4/uint4 among them: say so, not a bare KeyError
        raise UnsupportedOp(
            message(
                "The torch backend has no such dtype",
                received=name,
                choices=list(_DTYPES),
                fix="hold int4/uint4 values in int8/uint8" if name in NARROW_DTYPES else None,
            )
        ) from None


def _axes(axis: int | Sequence[int]) -> int | tuple[int, ...]:
    return axis if isinstance(axis, int) else tuple(axis)


def _dims(axis: int | Sequence[int] | None, every: Any = None) -> Any:
    """A reduction's ``dim``: ``every`` (what the torch function takes for all axes) for None."""
    return every if axis is None else _axes(axis)


def _floating(x: torch.Tensor) -> torch.Tensor:
    """Integers as the default float (numpy's mean and var of ints are floats too)."""
    return x if x.is_floating_point() else x.to(torch.get_default_dtype())


def _kind(x: Any) -> int:
    """numpy's kind order for promotion: bool < integer < floating."""
    if isinstance(x, torch.Tensor):
        return 0 if x.dtype == torch.bool else 2 if x.is_floating_point() or x.is_complex() else 1
    return 0 if isinstance(x, bool) else 1 if isinstance(x, int) else 2


def _tensors(x: Any, y: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Both inputs as tensors for functions that want two. A Python number takes the other
    input's dtype unless it is of a higher kind (NEP 50), so float64 keeps full precision."""
    if not isinstance(x, torch.Tensor):
        return _scalar(x, y), y
    return x, y if isinstance(y, torch.Tensor) else _scalar(y, x)


def _scalar(value: Any, other: Any) -> torch.Tensor:
    if not isinstance(other, torch.Tensor):
        return torch.as_tensor(value, device=_new.device)
    dtype = other.dtype if _kind(value) <= _kind(other) else None
    return torch.as_tensor(value, dtype=dtype, device=other.device)


def _promoted(*xs: torch.Tensor) -> list[torch.Tensor]:
    """Inputs in their common dtype: torch's matmul refuses mixed dtypes, numpy promotes."""
    common = xs[0].dtype
    for x in xs[1:]:
        common = torch.promote_types(common, x.dtype)
    return [x.to(common) for x in xs]


def _flat_pads(pads: Sequence[tuple[int, int]]) -> list[int]:
    """``(before, after)`` per leading axis as F.pad wants them: last axis first, flat."""
    return [v for pair in reversed(pads) for v in pair]


def _symmetric(x: torch.Tensor, pads: list[tuple[int, int]]) -> tuple[torch.Tensor, list[int]]:
    """``x`` and one pad per spatial dim for a kernel that pads both sides equally: uneven
    pads are applied to ``x`` here, and the kernel then pads nothing."""
    if all(before == after for before, after in pads):
        return x, [before for before, _ in pads]
    return F.pad(x, _flat_pads(pads)), [0] * len(pads)


def _native_pool_pads(pads: list[tuple[int, int]], window: tuple[int, ...]) -> bool:
    """Whether torch's pooling takes these pads itself: symmetric, at most half the window."""
    return all(before == after <= k // 2 for (before, after), k in zip(pads, window))


def _pad_source(size: int, before: int, after: int, mode: str, device: torch.device) -> torch.Tensor:
    """For each position of a padded axis, the index of the element it copies."""
    index = torch.arange(-before, size + after, device=device)
    if mode == "edge" or size == 1:
        return index.clamp(0, size - 1)
    period = 2 * (size - 1)  # reflect: a triangle wave over 0..size-1, repeated as numpy does
    index = index.abs() % period
    return torch.where(index < size, index, period - index)


def _matching(grads: list, params: list) -> list:
    """Gradients in their parameters' dtypes (they already are, unless a caller mixed them)."""
    return [g if g.dtype == p.dtype else g.to(p.dtype) for g, p in zip(grads, params)]


def _traced(x: torch.Tensor) -> bool:
    """Whether ``x`` is being traced (torch.compile, torch.export, make_fx): then the data
    cannot be read, and a branch on it must take the path that is right for any data."""
    return torch.compiler.is_compiling() or torch._subclasses.fake_tensor.is_fake(x)
