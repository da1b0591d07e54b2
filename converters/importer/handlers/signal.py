"""Signal processing: DFT, STFT, the window functions and MelWeightMatrix.

ONNX holds a complex tensor as real numbers with a last axis of 2 (real, imaginary); a real
one has a last axis of 1. A DFT over a length known when the graph is built is a matrix
product: the transform's matrix (cosines and sines, built here in numpy in float64) is
multiplied with the signal, its real and imaginary parts interleaved as rows, so one
``matmul`` does the whole transform on every backend, under ``jax.jit`` and ``tf.function``
too. It costs ``O(n^2)`` work and a matrix of ``4 * n * n`` numbers, fine for the frame
lengths of audio features (hundreds to a few thousand); it is not a fast Fourier transform.

Windows and MelWeightMatrix depend on their static inputs alone, so they are computed in
numpy and handed to the backend.
"""

from __future__ import annotations

import numpy as np

from xdevice._errors import ConversionError, message
from xdevice.backends.opset import numpy_dtype
from xdevice.converters.importer.handlers._nn import _HALF
from xdevice.converters.importer.interpreter import onnx_dtype
from xdevice.converters.importer.registry import handler

_FLOAT = 1  # TensorProto.FLOAT, the default output_datatype

# -- DFT ------------------------------------------------------------------------------------


def _dft_matrix(rows: int, length: int, inverse: bool, onesided: bool) -> tuple[np.ndarray, bool]:
    """The complex matrix ``e`` with ``y[col] = sum_row x[row] * e[row, col]``, and whether
    only the real part of ``y`` is wanted (an inverse one-sided transform, IRFFT).

    ``rows`` is the input's length on the transformed axis: rows past what the transform
    reads are zero, which both truncates the input and zero-pads it to ``length``.
    """
    half = length // 2 + 1
    if inverse and onesided:  # IRFFT: one-sided spectrum (half bins) -> real signal of length
        k = np.arange(rows)[:, None]
        n = np.arange(length)[None, :]
        # the bins the spectrum leaves out are the conjugates of bins 1 .. length - half: they
        # double those bins' real part; bin 0 (and bin length / 2 when length is even) stand alone
        weight = np.where((k == 0) | (2 * k == length), 1.0, 2.0)
        used = k < half
        angle = 2 * np.pi * ((k * n) % length) / length  # the modulo keeps sin(pi) exactly 0
        return np.where(used, weight * np.exp(1j * angle) / length, 0), True
    n = np.arange(rows)[:, None]
    k = np.arange(half if onesided else length)[None, :]
    angle = 2 * np.pi * ((n * k) % length) / length
    e = np.exp((1j if inverse else -1j) * angle) / (length if inverse else 1)
    return np.where(n < length, e, 0), False


def _real_matrix(e: np.ndarray, parts_in: int, real_only: bool) -> np.ndarray:
    """``e`` acting on interleaved (real, imaginary) numbers: shape ``(rows * parts_in,
    cols * parts_out)``, with ``parts_in`` 1 for a real input and 2 for a complex one."""
    rows, cols = e.shape
    parts_out = 1 if real_only else 2
    w = np.zeros((rows, parts_in, cols, parts_out))
    w[:, 0, :, 0] = e.real  # (xr + i xi)(er + i ei) = xr er - xi ei + i (xr ei + xi er)
    if parts_out == 2:
        w[:, 0, :, 1] = e.imag
    if parts_in == 2:
        w[:, 1, :, 0] = -e.imag
        if parts_out == 2:
            w[:, 1, :, 1] = e.real
    return w.reshape(rows * parts_in, cols * parts_out)


def _dft(ops, node, x, axis: int, length: int | None, inverse: bool, onesided: bool):
    """The DFT of ``x`` (real ``[..., 1]`` or complex ``[..., 2]``) along ``axis``, as ONNX's
    DFT defines it: ``length`` zero-pads or truncates (None: the axis length, or for an
    IRFFT ``2 * (bins - 1)``); the output is complex ``[..., 2]``, or real ``[..., 1]`` for
    an IRFFT; its dtype is the input's."""
    shape = list(ops.shape(x))
    rank = len(shape)
    if not -rank <= axis <= rank - 2 or axis == -1:
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r}: the axis is out of range",
                expected=f"an axis in [{-rank}, -2] or [0, {rank - 2}] (the last axis holds real and imaginary parts)",
                received=axis,
            )
        )
    axis %= rank
    rows, parts = shape[axis], shape[-1]
    if not isinstance(rows, (int, np.integer)) or parts not in (1, 2):  # a symbolic size: no matrix
        raise ConversionError(
            message(
                f"{node.op} node {node.name!r}: the transformed axis needs a known length and the last axis 1 or 2",
                received=tuple(shape),
            )
        )
    rows = int(rows)
    if length is None:
        length = 2 * (rows - 1) if inverse and onesided else rows
    if length < 1:
        what = f"{node.op} node {node.name!r}: the DFT length must be positive"
        raise ConversionError(message(what, received=length))
    e, real_only = _dft_matrix(rows, length, inverse, onesided)
    dtype = ops.dtype(x)
    work = "float32" if dtype in _HALF else dtype
    w = ops.asarray(_real_matrix(e, parts, real_only), dtype=work)
    others = [a for a in range(rank - 1) if a != axis]
    moved = ops.transpose(ops.cast(x, work) if work != dtype else x, (*others, axis, rank - 1))
    moved = ops.reshape(moved, (*(shape[a] for a in others), rows * parts))
    y = ops.matmul(moved, w)
    y = ops.reshape(y, (*(shape[a] for a in others), e.shape[1], 1 if real_only else 2))
    back = np.argsort([*others, axis, rank - 1])  # the inverse of the permutation above
    y = ops.transpose(y, tuple(int(a) for a in back))
    return ops.cast(y, dtype) if work != dtype else y


def _length(value) -> int | None:
    return None if value is None or np.asarray(value).size == 0 else int(np.asarray(value).reshape(-1)[0])


@handler("DFT", since=17, static=(1,))
def dft_17(ctx, node, x, dft_length=None):
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    return _dft(ctx.ops, node, x, int(node.attr("axis", 1)), _length(dft_length), inverse, onesided)


@handler("DFT", since=20, static=(1, 2))
def dft_20(ctx, node, x, dft_length=None, axis=None):
    axis = -2 if axis is None or np.asarray(axis).size == 0 else int(np.asarray(axis).reshape(-1)[0])
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    return _dft(ctx.ops, node, x, axis, _length(dft_length), inverse, onesided)


# -- STFT -----------------------------------------------------------------------------------


@handler("STFT", since=17, static=(1, 3))
def stft(ctx, node, signal, frame_step, window=None, frame_length=None):
    """Frames ``[batch, frames, frame_length, parts]`` gathered at static positions, times
    the window, then the DFT of each frame: ``[batch, frames, bins, 2]``."""
    ops = ctx.ops
    batch, signal_length, parts = ops.shape(signal)
    step = _length(frame_step)
    length = _length(frame_length)
    if length is None:
        length = ops.shape(window)[0] if window is not None else signal_length
    elif window is not None and ops.shape(window)[0] != length:
        raise ConversionError(
            message(
                f"STFT node {node.name!r}: the window's length differs from frame_length",
                expected=f"a window of {length} values",
                received=tuple(ops.shape(window)),
            )
        )
    if step is None or step < 1 or length < 1 or length > signal_length:
        raise ConversionError(
            message(
                f"STFT node {node.name!r}: no frame fits the signal",
                expected=f"frame_step >= 1 and 1 <= frame_length <= the signal's {signal_length} samples",
                received={"frame_step": step, "frame_length": length},
            )
        )
    frames = 1 + (signal_length - length) // step
    positions = (np.arange(frames)[:, None] * step + np.arange(length)[None, :]).reshape(-1)
    framed = ops.reshape(ops.take(signal, ops.asarray(positions, "int64"), axis=1), (batch, frames, length, parts))
    if window is not None:
        framed = ops.multiply(framed, ops.reshape(ops.cast(window, ops.dtype(signal)), (1, 1, length, 1)))
    return _dft(ops, node, framed, 2, length, inverse=False, onesided=bool(node.attr("onesided", 1)))


# -- windows --------------------------------------------------------------------------------


def _window(ctx, node, size, coefficients: tuple[float, ...]):
    """``sum_m (-1)^m a_m cos(2 pi m n / N)`` for ``n < size``, with ``N = size`` (periodic)
    or ``size - 1`` (symmetric), in the ``output_datatype``."""
    size = int(np.asarray(size).reshape(-1)[0])
    periodic = bool(node.attr("periodic", 1))
    n = np.arange(size, dtype=np.float64)
    period = size if periodic or size == 1 else size - 1  # a symmetric window of 1 is [1], as in torch
    y = np.zeros(size)
    for m, a in enumerate(coefficients):
        y += (-1) ** m * a * np.cos(2 * np.pi * m * n / period)
    if not periodic and size == 1:
        y = np.ones(1)
    dtype = onnx_dtype(int(node.attr("output_datatype", _FLOAT)))
    return ctx.array(y.astype(numpy_dtype(dtype)))


@handler("HannWindow", since=17, static=(0,))
def hann_window(ctx, node, size):
    return _window(ctx, node, size, (0.5, 0.5))


@handler("HammingWindow", since=17, static=(0,))
def hamming_window(ctx, node, size):
    return _window(ctx, node, size, (25 / 46, 21 / 46))  # ONNX's exact alpha, not 0.54


@handler("BlackmanWindow", since=17, static=(0,))
def blackman_window(ctx, node, size):
    return _window(ctx, node, size, (0.42, 0.5, 0.08))


# -- MelWeightMatrix ------------------------------------------------------------------------


@handler("MelWeightMatrix", since=17, static=(0, 1, 2, 3, 4))
def mel_weight_matrix(ctx, node, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz):
    """Triangular filters ``[dft_length // 2 + 1, num_mel_bins]`` with peaks of 1.

    The filters' edges are ``num_mel_bins + 2`` points evenly spaced in mel from the lower
    edge (the last one falls short of the upper edge by one step, as in ONNX's reference),
    mapped back to hertz and to DFT bins with ``floor((dft_length + 1) * hz / sample_rate)``.
    The mel edges are computed in the edges' own dtype, as the reference does, so the bins
    land where it puts them; the part of a filter past the last bin is left out.
    """
    bands = int(np.asarray(num_mel_bins).reshape(-1)[0])
    length = int(np.asarray(dft_length).reshape(-1)[0])
    rate = np.asarray(sample_rate).reshape(-1)[0]
    lower, upper = (np.asarray(v).reshape(-1)[0] for v in (lower_edge_hertz, upper_edge_hertz))
    if bands < 1 or length < 1 or rate <= 0:
        raise ConversionError(
            message(
                f"MelWeightMatrix node {node.name!r}: invalid sizes",
                expected="num_mel_bins >= 1, dft_length >= 1 and sample_rate > 0",
                received={"num_mel_bins": bands, "dft_length": length, "sample_rate": rate.item()},
            )
        )
    low_mel = 2595 * np.log1p(lower / 700) / np.log(10)
    high_mel = 2595 * np.log1p(upper / 700) / np.log(10)
    mels = np.arange(bands + 2) * ((high_mel - low_mel) / (bands + 2)) + low_mel
    hertz = 700 * np.expm1(mels / 2595 * np.log(10))
    edges = (((length + 1) * hertz) // rate).astype(np.int64)
    left, center, right = edges[None, :-2], edges[None, 1:-1], edges[None, 2:]
    j = np.arange(length // 2 + 1)[:, None]
    rising = (j - left) / np.maximum(center - left, 1)
    falling = (right - j) / np.maximum(right - center, 1)
    weights = np.where((left <= j) & (j <= center), rising, 0.0)
    weights = np.where((center <= j) & (j < right), falling, weights)
    weights = np.where(j == center, 1.0, weights)  # a filter one bin wide is 1 at its centre
    dtype = onnx_dtype(int(node.attr("output_datatype", _FLOAT)))
    return ctx.array(weights.astype(numpy_dtype(dtype)))
