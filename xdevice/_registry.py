"""The backend registry: names from the ``xdevice.backends`` entry points, resolved lazily.

A backend's name is its framework's import name, so whether it is installed is one
``importlib.util.find_spec`` away and needs no import. ``backend(name)`` imports the
backend (and with it the framework) on first use and caches the instance. The built-in
backends are registered through the same entry-point group as any third-party one.

It also answers, once for every caller, which backend owns an object (:func:`owner`: only
frameworks already imported are asked, and the answer is cached by type, as einops does),
and reaches the parts of a backend package that core may use without importing the
framework (:func:`gpu_build`, :func:`title`) or that load only when needed (:func:`extension`,
found by what they provide with :func:`providers`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import threading
import types
from typing import TYPE_CHECKING, Any

from xdevice._errors import BackendUnavailable, message

if TYPE_CHECKING:
    from xdevice.backends.base import Backend

__all__ = [
    "ALIASES",
    "backends",
    "backend",
    "unknown",
    "loaded_backends",
    "active_backends",
    "is_installed",
    "pip_line",
    "owner",
    "extension",
    "providers",
    "gpu_build",
    "title",
]

GROUP = "xdevice.backends"
_BUILTIN_ORDER = ("numpy", "torch", "jax", "tensorflow")

#: What people type for a backend, and its name. A backend has one name, its framework's
#: import name (so ``backend_of(x) == "tensorflow"`` reads the same everywhere): an alias is
#: suggested with the exact fix, never accepted silently as a second spelling.
ALIASES = {
    "tf": "tensorflow",
    "pytorch": "torch",
    "pt": "torch",
    "jnp": "jax",
    "jax.numpy": "jax",
    "np": "numpy",
}
#: Device names typed where a backend name goes.
_DEVICE_WORDS = ("cpu", "gpu", "cuda", "tpu", "mps", "rocm")

_cache: dict[str, Backend] = {}
_lock = threading.RLock()


@functools.lru_cache(maxsize=1)
def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    import importlib.metadata  # read on first use, not at `import xdevice`

    found = {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}
    order = {name: i for i, name in enumerate(_BUILTIN_ORDER)}
    return dict(sorted(found.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))


def forget_installed() -> None:
    """Read the registered backends (entry points) again, for a backend installed since."""
    _entry_points.cache_clear()
    importlib.invalidate_caches()


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


def backends(*, all: bool = False) -> list[str]:
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
    found = _cache.get(name)  # the hot path: resolved already, no lock needed to read
    if found is not None:
        return found
    with _lock:
        if name in _cache:
            return _cache[name]
        points = _entry_points()
        if name not in points:
            raise BackendUnavailable(unknown(name))
        if not is_installed(name):
            raise BackendUnavailable(
                message(
                    f"Backend {name!r} needs {title(name)}, which is not installed",
                    expected=f"an importable {name!r} module",
                    received="no such module",
                    choices=backends(),
                    fix=pip_line(name),
                )
            )
        try:
            cls: type[Backend] = points[name].load()
            instance = cls()
        except ImportError as error:
            raise BackendUnavailable(
                message(
                    f"Backend {name!r} is installed but failed to import",
                    received=f"{type(error).__name__}: {error}",
                    fix=f"reinstall it: {pip_line(name)}",
                )
            ) from error
        _cache[name] = instance
        return instance


def unknown(name: object, what: str = "backend") -> str:
    """The message for ``name`` where a backend name was expected: the registered names,
    and the one meant when ``name`` is an alias (``"tf"``) or a device (``"cuda"``), with the fix.

    >>> print(unknown("tf"))  # doctest: +NORMALIZE_WHITESPACE
    Unknown backend. Expected the name of a registered backend (its framework's import name).
    Received: 'tf'. Valid choices: numpy, torch, jax, tensorflow. Did you mean 'tensorflow'?
    Fix: pass 'tensorflow' ('tf' is its usual alias; a backend goes by its import name).
    """
    points = list(_entry_points()) or ["(none: is xdevice installed? pip install -e .)"]
    key = str(name).strip().lower()
    meant, fix = ALIASES.get(key), None
    if meant is not None and meant in points:
        fix = f"pass {meant!r} ({name!r} is its usual alias; a backend goes by its import name)"
    elif key.split(":")[0] in _DEVICE_WORDS:
        meant = None
        fix = f"{name!r} is a device, not a backend: pass device={name!r}, and a backend from the choices"
    return message(
        f"Unknown {what}",
        expected="the name of a registered backend (its framework's import name)",
        received=name,
        choices=points,
        suggestion=meant,
        fix=fix,
    )


def loaded_backends() -> list[Backend]:
    """Backends already resolved in this process, in registry order."""
    with _lock:
        return [_cache[name] for name in _entry_points() if name in _cache]


def active_backends() -> list[Backend]:
    """Backends whose framework is already imported (resolving them costs no import).

    This is the ``sys.modules`` check of DESIGN.md rule 1: if torch was never imported,
    nothing in this process is a torch tensor and there is no torch default to set.
    """
    return [backend(name) for name in _entry_points() if name in sys.modules]


# -- which backend owns an object -------------------------------------------------------------

#: type -> (backend, kind), for the types whose every object has the same owner
_owners: dict[type, tuple[Backend, str]] = {}
#: types whose objects are owned by what they hold, not by their type: never cached
_BY_VALUE = (tuple, list, dict, types.FunctionType, types.MethodType, functools.partial)


def owner(x: Any) -> tuple[Backend, str] | None:
    """``(backend, kind)`` of the framework that owns ``x``, or None when none does.

    ``kind`` is what ``x`` is to it: ``"array"``, ``"model"`` or ``"device"``
    (``Backend.owns``). An object that names its backend in ``__xdevice_backend__`` (a zoo
    model, its ``apply_fn``, or a pair of that function and its params) is a model of that
    backend. Otherwise only the backends whose framework is already imported are asked (if
    torch was never imported, nothing is a torch tensor), in registry order, and the answer
    is cached by type except for containers and plain functions.

    >>> import numpy as np
    >>> owner(np.zeros(2))[1]
    'array'
    """
    kind = type(x)
    hit = _owners.get(kind)
    if hit is not None:
        return hit
    declared = getattr(x[0] if isinstance(x, tuple) and len(x) == 2 else x, "__xdevice_backend__", None)
    if isinstance(declared, str):
        return backend(declared), "model"
    for candidate in active_backends():
        what = candidate.owns(x)
        if what is not None:
            if not issubclass(kind, _BY_VALUE):
                _owners[kind] = (candidate, what)
            return candidate, what
    return None


def accepted(kind: str) -> list[str]:
    """What each installed backend accepts as ``kind`` ("array", "model", "device"), for
    error messages; frameworks not imported yet are named by their backend."""
    found = []
    for name in backends():
        loaded = _cache.get(name)
        found.append(f"{name}: {loaded.accepts.get(kind, '(none)')}" if loaded is not None else name)
    return found


# -- parts of a backend package that load apart from the backend -------------------------------


def extension(name: str, part: str) -> types.ModuleType | None:
    """The module ``part`` of backend ``name``'s package (``"training"``), or None when that
    backend has none. Loading it is up to the caller (the trainer loads ``training``)."""
    package = _entry_points()[name].module
    try:
        return importlib.import_module(f"{package}.{part}")
    except ModuleNotFoundError as error:
        if error.name != f"{package}.{part}":
            raise
        return None


def providers(part: str, *, all: bool = False) -> list[str]:
    """Installed backends whose package has the module ``part``, in registry order: those that
    provide what it holds (``"agent"``: a process launcher for ``xdevice launch``). Only the
    packages are imported (they import no framework), not the modules.

    Args:
        all: also list registered backends whose framework is not installed.

    >>> providers("agent", all=True)
    ['torch']
    """
    found = []
    for name in backends(all=all):
        try:
            if importlib.util.find_spec(f"{_entry_points()[name].module}.{part}") is not None:
                found.append(name)
        except ImportError:  # the package itself cannot be imported: it provides nothing
            continue
    return found


def gpu_build(name: str) -> bool:
    """Whether backend ``name``'s installed build supports GPUs, asked of its package's
    ``gpu_build()`` (which reads package metadata and imports no framework); False for a
    backend that does not say."""
    if not is_installed(name):
        return False
    hook = getattr(_package(name), "gpu_build", None)
    return bool(hook()) if hook is not None else False


def title(name: str) -> str:
    """The framework's name for people (``"PyTorch"``), read from the ``TITLE`` of backend
    ``name``'s package, which imports no framework; the name itself for a backend that does not
    say. The backend class reads the same constant.

    >>> title("tensorflow")
    'TensorFlow'
    """
    return str(getattr(_package(name), "TITLE", name))


def _package(name: str) -> types.ModuleType | None:
    """The package that registers backend ``name`` (its ``__init__`` imports no framework), or
    None when there is no such backend or the package cannot be imported."""
    points = _entry_points()
    if name not in points:
        return None
    try:
        return importlib.import_module(points[name].module)
    except ImportError:
        return None
