"""The error hierarchy, and the one helper that writes every error message.

Every message has the same parts, in this order: what was wrong, what was expected,
what was received, the valid choices with the nearest one, and the fix. Built-in
exception types are mixed in where a caller would reasonably catch them
(``LookupError`` for a missing device, ``ImportError`` for a missing framework).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "XDeviceError",
    "DeviceNotFound",
    "ConfigurationError",
    "BackendUnavailable",
    "ConversionError",
    "InputError",
    "ParityError",
    "UnsupportedOp",
    "InferenceError",
    "nearest",
    "message",
]


class XDeviceError(Exception):
    """Root of every error xdevice raises on purpose."""


class DeviceNotFound(XDeviceError, LookupError):
    """A device name that does not parse, or names a device that does not exist."""


class ConfigurationError(XDeviceError, ValueError):
    """A setting that is invalid, unsupported, or arrives after a runtime started."""


class BackendUnavailable(XDeviceError, ImportError):
    """An unknown backend name, or a backend whose framework is not installed."""


class ConversionError(XDeviceError):
    """A conversion that failed or whose result disagrees with its source."""


class InputError(ConversionError, ValueError):
    """An input that does not match what an imported model declares (dtype, rank, dims)."""


class ParityError(XDeviceError, AssertionError):
    """Two backends disagree beyond the tolerance table."""


class UnsupportedOp(XDeviceError):
    """Operations that a backend or converter does not implement."""


class InferenceError(XDeviceError):
    """A bad inference request or a failure while serving one."""


def nearest(name: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``name``, or None when nothing is close.

    >>> nearest("trch", ["numpy", "torch", "jax"])
    'torch'
    """
    found = difflib.get_close_matches(str(name).lower(), [str(c) for c in choices], n=1, cutoff=0.6)
    return found[0] if found else None


def message(
    what: str,
    *,
    expected: str | None = None,
    received: object = None,
    choices: Iterable[str] | None = None,
    fix: str | None = None,
    suggestion: str | None = None,
) -> str:
    """Assemble an error message from its parts; empty parts are left out. The nearest
    choice is found by spelling, unless the caller knows the one meant (``suggestion``: an
    alias such as ``"tf"`` is not spelled like ``"tensorflow"``).

    >>> print(message("Unknown backend.", expected="a backend name",
    ...               received="trch", choices=["numpy", "torch"]))
    Unknown backend. Expected a backend name. Received: 'trch'. Valid choices: numpy, torch. Did you mean 'torch'?
    """
    parts = [what.rstrip(".") + "."]
    if expected:
        parts.append(f"Expected {expected.rstrip('.')}.")
    if received is not None:
        parts.append(f"Received: {received!r}.")
    if choices is not None:
        choices = list(choices)
        parts.append(f"Valid choices: {', '.join(choices) if choices else '(none)'}.")
        close = suggestion or (nearest(str(received), choices) if received is not None else None)
        if close is not None and close != received:
            parts.append(f"Did you mean {close!r}?")
    if fix:
        parts.append(f"Fix: {fix.rstrip('.')}.")
    return " ".join(parts)
