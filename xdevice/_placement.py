"""``on(device)``: one context that sets the default device of every loaded framework.

Inside ``with xdevice.on("gpu:1"):`` new torch tensors, JAX arrays and TensorFlow tensors
are created on ``gpu:1`` (through ``torch.device``, ``jax.default_device`` and
``tf.device``). The context is thread-local and nests, like each of those.

Decisions:
- "Loaded" means imported: a framework first imported inside the block is not affected,
  which follows DESIGN.md rule 1 (never import a framework to configure it).
- A device that one framework lacks (a CPU-only TensorFlow next to a CUDA PyTorch) falls
  back for that framework alone with ``soft=True``, so each framework gets the best it has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import warnings
from typing import Any

from xdevice import _registry
from xdevice._device import Device, device
from xdevice._discovery import devices
from xdevice._errors import DeviceNotFound, message

__all__ = ["on", "current_device", "Placement", "DeviceFallbackWarning"]

logger = logging.getLogger("xdevice")
_local = threading.local()


class DeviceFallbackWarning(UserWarning):
    """``on(..., soft=True)`` ran a framework on the CPU because the device was missing."""


@dataclasses.dataclass
class Placement:
    """What ``on`` arranged: the device asked for, the one each framework got, and
    (with ``log=True``) where each framework actually put a new array."""

    requested: Device
    devices: dict[str, Device] = dataclasses.field(default_factory=dict)
    actual: dict[str, Device] = dataclasses.field(default_factory=dict)


def current_device() -> Device | None:
    """The device of the innermost ``on`` block in this thread, or None outside any."""
    stack = getattr(_local, "stack", [])
    return stack[-1] if stack else None


def on(spec: object, soft: bool = True, log: bool = False) -> _On:
    """Make ``spec`` the default device for every loaded framework, in this thread.

    Args:
        spec: any device spelling (``"gpu:1"``, ``"cuda:1"``, ``"/GPU:1"``, a native object).
        soft: when a framework lacks the device, run it on ``cpu:0`` with a
            ``DeviceFallbackWarning`` saying why. With ``soft=False`` raise instead.
        log: create a probe array in each framework, record where it really landed in
            ``Placement.actual``, and log it on the ``xdevice`` logger.

    Raises:
        DeviceNotFound: ``spec`` is not a device name, or (``soft=False``) a framework does
            not have it; the message lists the devices that exist and the nearest name.

    >>> with on("cpu") as placement:
    ...     placement.requested
    Device('cpu:0')
    """
    wanted = device(spec)
    # a spelling that names another kind ("mps:0", "cuda:1") is kept for messages
    asked = spec if isinstance(spec, str) and spec.strip().lower() not in (str(wanted), wanted.kind) else None
    return _On(wanted, soft, log, asked)


class _On:
    """The context ``on`` returns: a plain class rather than a generator, because entering
    and leaving it is a hot call (the frameworks' own contexts cost a few microseconds)."""

    __slots__ = ("wanted", "soft", "log", "scopes", "asked")

    def __init__(self, wanted: Device, soft: bool, log: bool, asked: str | None = None):
        self.wanted, self.soft, self.log, self.asked = wanted, soft, log, asked
        self.scopes: list[list[contextlib.AbstractContextManager[Any]]] = []

    def __enter__(self) -> Placement:
        wanted = self.wanted
        placement = Placement(requested=wanted)
        active = [b for b in _registry.active_backends() if b.has_default_device]
        if not active and wanted not in devices():
            _fallback(wanted, "this machine", [str(d) for d in devices()], self.soft, self.asked)
        scopes: list[contextlib.AbstractContextManager[Any]] = []
        try:
            for backend in active:
                present = devices(backend=backend.name)
                target = wanted
                if wanted not in present:
                    target = _fallback(wanted, backend.name, [str(d) for d in present], self.soft, self.asked)
                scope = backend.default_device(target)
                scope.__enter__()
                scopes.append(scope)
                placement.devices[backend.name] = target
                if self.log:
                    probe = backend.zeros((1,))
                    placement.actual[backend.name] = backend.device_of(probe)
                    logger.info(
                        "xdevice.on(%s): %s placed a new array on %s",
                        wanted,
                        backend.name,
                        placement.actual[backend.name],
                    )
        except BaseException:
            _leave(scopes)
            raise
        self.scopes.append(scopes)  # a list of lists: the same object may be entered again, nested
        _local.__dict__.setdefault("stack", []).append(wanted)
        return placement

    def __exit__(self, *exc: Any) -> None:
        _local.stack.pop()
        _leave(self.scopes.pop(), *exc)


def _leave(scopes: list[contextlib.AbstractContextManager[Any]], *exc: Any) -> None:
    for scope in reversed(scopes):
        scope.__exit__(*(exc or (None, None, None)))


def _fallback(wanted: Device, where: str, present: list[str], soft: bool, asked: str | None = None) -> Device:
    named = f"{asked!r} (read as {wanted}: cuda, rocm and mps are all gpu)" if asked else str(wanted)
    what = f"No device {named} for {where}"
    if not soft:
        raise DeviceNotFound(
            message(
                what,
                expected="a device that exists",
                received=asked or str(wanted),
                choices=present,
                fix="pick one of those, or pass soft=True to fall back to cpu:0",
            )
        )
    warnings.warn(
        f"{what} (it has: {', '.join(present)}); running on cpu:0 instead. Pass soft=False to make this an error.",
        DeviceFallbackWarning,
        stacklevel=4,
    )
    return Device("cpu", 0)
