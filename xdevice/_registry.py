"""The backend registry: names from the ``xdevice.backends`` entry points, resolved lazily.

A backend's name is its framework's import name, so whether it is installed is one
``importlib.util.find_spec`` away and needs no import. ``backend(name)`` imports the
backend (and with it the framework) on first use and caches the instance. The built-in
backends are registered through the same entry-point group as any third-party one.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import threading
from typing import TYPE_CHECKING

from xdevice._errors import BackendUnavailable, message

if TYPE_CHECKING:
    from xdevice.backends.base import Backend

__all__ = ["backends", "backend", "loaded_backends", "active_backends", "is_installed", "pip_line"]

GROUP = "xdevice.backends"
_BUILTIN_ORDER = ("numpy", "torch", "jax", "tensorflow")
_TITLES = {"numpy": "NumPy", "torch": "PyTorch", "jax": "JAX", "tensorflow": "TensorFlow"}

_cache: dict[str, Backend] = {}
_lock = threading.RLock()


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}
    order = {name: i for i, name in enumerate(_BUILTIN_ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def is_installed(name: str) -> bool:
    """Whether backend ``name``'s framework can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def pip_line(name: str) -> str:
    """The command that installs backend ``name``'s framework."""
    if name in _BUILTIN_ORDER:
        return f"pip install 'xdevice[{name}]'"
    return f"pip install {name}"


def backends(*, all: bool = False) -> list[str]:  # noqa: A002 - reads well at the call site
    """Names of the installed backends, without importing any framework.

    Args:
        all: also list registered backends whose framework is not installed.

    >>> "numpy" in backends()
    True
    """
    return [name for name in _entry_points() if all or is_installed(name)]


def backend(name: str) -> Backend:
    """The backend called ``name``, importing its framework on first use.

    Raises:
        BackendUnavailable: no backend has that name, or its framework is not installed.

    >>> backend("numpy").name
    'numpy'
    """
    with _lock:
        if name in _cache:
            return _cache[name]
        points = _entry_points()
        if name not in points:
            raise BackendUnavailable(message(
                "Unknown backend", expected="the name of a registered backend",
                received=name, choices=list(points) or ["(none: is xdevice installed? pip install -e .)"]))
        if not is_installed(name):
            title = _TITLES.get(name, name)
            raise BackendUnavailable(message(
                f"Backend {name!r} needs {title}, which is not installed",
                expected=f"an importable {name!r} module", received="no such module",
                choices=backends(), fix=pip_line(name)))
        try:
            cls = points[name].load()
            instance = cls()
        except ImportError as error:
            raise BackendUnavailable(message(
                f"Backend {name!r} is installed but failed to import",
                received=f"{type(error).__name__}: {error}",
                fix=f"reinstall it: {pip_line(name)}")) from error
        _cache[name] = instance
        return instance


def loaded_backends() -> list[Backend]:
    """Backends already resolved in this process, in registry order."""
    with _lock:
        return [_cache[name] for name in _entry_points() if name in _cache]


def active_backends() -> list[Backend]:
    """Backends whose framework is already imported (resolving them costs no import).

    This is the ``sys.modules`` check of DESIGN.md rule 1: if torch was never imported,
    nothing in this process is a torch tensor and there is no torch default to set.
    """
    return [backend(name) for name in backends() if name in sys.modules]
