"""Arrays across frameworks: which framework and device hold one, moving it, converting it.

Conversion goes through DLPack, so on one device it shares memory where both frameworks
allow it. When a DLPack exchange is refused (an unsupported dtype, say), the array goes
through a host copy instead, and ``copy=False`` turns that into an error.

On a GPU, DLPack's stream handshake orders the consumer after the producer: a consumer
names the stream it will read on (``__dlpack__(stream=...)``) and the producer makes that
stream wait for its own work. TensorFlow takes no stream either way, and torch exports only
from its current GPU, so a backend that needs more than the plain protocol exports through
its ``dlpack_export(x, stream, max_version)`` hook (:class:`_Handoff`): torch enters the
tensor's device and, for a consumer that names no stream (TensorFlow), finishes its current
stream first; TensorFlow finishes its GPU work and drops the stream; JAX passes the stream,
or waits for the array when there is none. A GPU array that still has to go through the host
is copied with a :class:`HostCopyWarning` saying why, never silently.

Does not import any framework: an array can only belong to a framework that is already
imported (``sys.modules``), so only those are asked (``_registry.owner``, cached by type).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from xdevice import _registry
from xdevice._device import Device
from xdevice._discovery import find
from xdevice._errors import ConversionError, message

if TYPE_CHECKING:
    from xdevice.backends.base import Backend

__all__ = ["backend_of", "device_of", "to_device", "convert", "HostCopyWarning"]


class HostCopyWarning(UserWarning):
    """``convert`` copied an array that is on a GPU through the host, because the two
    frameworks could not share it there; the message says why. ``copy=False`` makes it an
    error instead."""


def backend_of(x: Any) -> str:
    """The name of the backend whose array ``x`` is.

    >>> import numpy as np
    >>> backend_of(np.zeros(2))
    'numpy'
    """
    return _array_owner(x).name


def _array_owner(x: Any) -> Backend:
    found = _registry._owners.get(type(x)) or _registry.owner(x)  # the cache first: a hot path
    if found is not None and found[1] == "array":
        return found[0]
    what = f"A {found[0].title} {found[1]} is not an array" if found else "Not an array of any loaded framework"
    raise ConversionError(
        message(
            what,
            expected="an array of an installed backend",
            received=f"{type(x).__module__}.{type(x).__qualname__}",
            choices=_registry.accepted("array"),
            fix="pass one of those arrays (numpy: np.asarray(value))",
        )
    )


def device_of(x: Any) -> Device:
    """The :class:`Device` holding ``x``.

    >>> import numpy as np
    >>> device_of(np.zeros(2))
    Device('cpu:0')
    """
    return _array_owner(x).device_of(x)


def to_device(x: Any, device: Any) -> Any:
    """``x`` moved to ``device`` in its own framework (``x`` itself if already there).

    Raises:
        DeviceNotFound: the framework has no such device.
    """
    owner = _array_owner(x)
    return owner.to_device(x, find(device, backend=owner.name))


def convert(x: Any, to: str, *, device: Any = None, copy: bool | None = None) -> Any:
    """``x`` as an array of framework ``to``, through DLPack.

    Args:
        to: the target backend's name (``"numpy"``, ``"torch"``, ``"jax"``, ``"tensorflow"``).
        device: also move the result to this device.
        copy: None shares memory where possible and copies otherwise; False raises
            ``ConversionError`` when sharing is impossible.

    >>> import numpy as np
    >>> convert(np.arange(3.0), to="numpy").tolist()
    [0.0, 1.0, 2.0]
    """
    if copy is True:
        raise ConversionError(
            message(
                "convert() shares memory where it can; it does not force a copy",
                expected="copy=None or copy=False",
                received=copy,
                fix="copy the result with the target framework (e.g. tensor.clone())",
            )
        )
    source = _array_owner(x)
    target = _registry.backend(to)
    if source is target:
        result = x
    else:
        refused = _unshareable(source, target, x)
        if refused is None:
            try:
                result = target.from_dlpack(_handoff(source, x))
            except (TypeError, ValueError, RuntimeError, BufferError) as error:
                refused = f"{type(error).__name__}: {error}"
        if refused is not None:
            if copy is False:
                raise ConversionError(
                    message(
                        f"{source.name} -> {to} cannot share memory for this array",
                        received=refused,
                        fix="pass copy=None to allow a host copy",
                    )
                )
            notice = _copy_notice(source.title, target, source.device_of(x), refused)
            if notice is not None:
                warnings.warn(notice, HostCopyWarning, stacklevel=2)
            result = target.from_dlpack(_host_copy(source.to_numpy(x), target.dlpack_alignment))
            result = target.to_device(result, source.device_of(x))
        if copy is False and target.data_pointer(result) != source.data_pointer(x):
            raise ConversionError(
                message(
                    f"{source.name} -> {to} copied the data",
                    expected="a zero-copy view (copy=False)",
                    received="a new buffer (the frameworks could not share this array)",
                    fix="pass copy=None to accept a copy",
                )
            )
    if device is not None:
        result = target.to_device(result, find(device, backend=to))
    return result


@runtime_checkable
class _Exporter(Protocol):
    """A backend whose arrays need more than the plain ``__dlpack__`` to leave a GPU safely."""

    def dlpack_export(self, x: Any, stream: int | None, max_version: tuple[int, int] | None) -> Any: ...


class _Handoff:
    """``x`` as a DLPack producer whose ``__dlpack__`` goes through its backend's
    ``dlpack_export``: the consumer's stream request (or its absence) reaches the code that
    knows how to honour it for this framework."""

    def __init__(self, x: Any, exporter: _Exporter):
        self._x, self._exporter = x, exporter

    def __dlpack_device__(self) -> tuple[int, int]:
        return tuple(self._x.__dlpack_device__())  # (DLDeviceType, index)

    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        if copy:  # a consumer asking for a copy gets none from here: refuse as the protocol says
            raise BufferError("this hand-off shares memory; it does not copy")
        return self._exporter.dlpack_export(self._x, stream, max_version)


def _handoff(source: Backend, x: Any) -> Any:
    """What ``convert`` hands the consumer for ``x``: on a GPU, ``x`` through its backend's
    export hook (the stream handshake); elsewhere, or for a backend without one, ``x``."""
    if source.device_of(x).kind == "gpu" and isinstance(source, _Exporter):
        return _Handoff(x, source)
    return x


def _copy_notice(source: str, target: Any, held_on: Device, refused: str) -> str | None:
    """The warning ``convert`` gives when it copies an array through the host (None: it says
    nothing). Only a copy off a GPU is stated: a consumer that cannot use a GPU at all
    (numpy) is a host copy by request, and a CPU array copied for alignment costs a memcpy.

    >>> class Torch: title, supports_gpu = "PyTorch", True
    >>> print(_copy_notice("TensorFlow", Torch, Device("gpu", 0), "the data is strided"))
    TensorFlow -> PyTorch on gpu:0 copied the array through the host: the data is strided. Pass ...
    >>> _copy_notice("TensorFlow", Torch, Device("cpu", 0), "the data is strided") is None
    True
    """
    if held_on.kind != "gpu" or not target.supports_gpu:
        return None
    return (
        f"{source} -> {target.title} on {held_on} copied the array through the host: {refused}. "
        "Pass copy=False to make this an error."
    )


def _unshareable(source: Any, target: Any, x: Any) -> str | None:
    """Why ``target`` cannot take ``x``'s buffer as it is (None: it can). The one rule for
    every pair: a consumer that needs aligned or row-major buffers gets a copy otherwise,
    because TensorFlow accepts a misaligned DLPack buffer and then aborts the process in its
    first kernel (``Check failed: IsAligned()``)."""
    if target.dlpack_alignment > 1 and source.data_pointer(x) % target.dlpack_alignment:
        return f"the data is not {target.dlpack_alignment}-byte aligned, as {target.title} needs"
    if not target.dlpack_strided and not source.is_dense(x):
        return f"the data is strided, and {target.title} takes only row-major buffers"
    return None


def _host_copy(x: Any, alignment: int) -> Any:
    """A row-major, writable copy of the numpy array ``x`` whose data starts on an
    ``alignment``-byte boundary (numpy's allocator promises only 16)."""
    import numpy as np

    alignment = max(alignment, 1)
    raw = np.empty(x.nbytes + alignment, dtype=np.uint8)
    start = -raw.ctypes.data % alignment
    out = raw[start : start + x.nbytes].view(x.dtype).reshape(x.shape)
    np.copyto(out, x)
    return out


def to_host(x: Any) -> Any:
    """``x`` as a numpy array on the host: numpy values and Python lists as they are, a
    framework's array copied off its device."""
    import numpy as np

    if isinstance(x, np.ndarray) or type(x).__module__.split(".")[0] in ("numpy", "builtins"):
        return np.asarray(x)
    return _array_owner(x).to_numpy(x)
