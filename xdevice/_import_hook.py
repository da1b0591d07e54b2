"""Run a function right after a top-level module is first imported: an import hook.

``when_imported("tensorflow", then)`` puts one finder at the front of ``sys.meta_path`` (on that
first call, never at ``import xdevice``). When ``import tensorflow`` runs, the finder asks the
finders behind it for the module's spec and wraps its loader, so that ``then(module)`` runs
right after the module's own code, inside the same import statement: whoever imported it gets
the module only once ``then`` returned. Each wait is answered once; the finder leaves
``sys.meta_path`` when nothing waits any more.

Decisions:
- Only names in waiting are touched: the finder answers None for every other module, so the
  cost of any other import is one dict lookup.
- The module runs with its own loader (``module.__loader__`` and ``__spec__.loader`` are put back
  before its code runs), so ``importlib.resources`` and ``pkgutil`` inside it see what they
  would without the hook.
- ``then`` runs after the module's code, never before: environment variables that must precede
  a runtime are the caller's to set when it asks to wait (importing a framework starts no
  runtime, so what is applied right after the import still precedes it).
- ``then`` should not raise: what it raises fails the import it interrupts.
- A module already in ``sys.modules`` is never imported again, so asking to wait for it waits
  for nothing: the caller checks ``sys.modules`` first.

Imports nothing beyond the standard library.

>>> when_imported("xdevice_example_module", print)
>>> waiting()
['xdevice_example_module']
>>> forget("xdevice_example_module")
>>> waiting()
[]
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec

__all__ = ["when_imported", "forget", "waiting"]

_lock = threading.RLock()
_waiting: dict[str, Callable[[ModuleType], None]] = {}  # top-level module name -> what follows it
_searching = threading.local()  # set while this thread asks the other finders (no recursion)


def when_imported(name: str, then: Callable[[ModuleType], None]) -> None:
    """Call ``then(module)`` right after ``import name`` first runs the module's code.

    Args:
        name: a top-level module (``"tensorflow"``, not ``"tensorflow.config"``).
        then: replaces what waited for ``name`` before, if anything did.
    """
    if "." in name:
        raise ValueError(f"when_imported watches top-level modules only. Received: {name!r}")
    with _lock:
        _waiting[name] = then
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def forget(name: str) -> None:
    """Stop waiting for ``name`` (nothing happens if nothing waits for it)."""
    with _lock:
        _waiting.pop(name, None)
        _leave_when_idle()


def waiting() -> list[str]:
    """The modules waited for, sorted."""
    with _lock:
        return sorted(_waiting)


def _leave_when_idle() -> None:
    if not _waiting and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


class _Finder:
    """Finds a waited-for module through the finders behind it, with its loader wrapped."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is not None or fullname not in _waiting or getattr(_searching, "active", False):
            return None
        _searching.active = True
        try:
            spec = _spec_from_the_others(fullname, target)
        finally:
            _searching.active = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None  # nothing to wrap: the import system goes on as without this finder
        spec.loader = cast("Loader", _Loader(spec.loader))
        return spec


class _Loader:
    """The module's own loader, then what waits for the module."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)  # when this raises, the wait stays for the next attempt
        with _lock:
            then = _waiting.pop(module.__name__, None)
            _leave_when_idle()
        if then is not None:
            then(module)

    def __getattr__(self, name: str) -> Any:  # anything else a loader offers: the module's own
        if name == "loader":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def _spec_from_the_others(fullname: str, target: ModuleType | None) -> ModuleSpec | None:
    for finder in list(sys.meta_path):
        find = getattr(finder, "find_spec", None)
        if finder is _FINDER or find is None:
            continue
        spec: ModuleSpec | None = find(fullname, None, target)
        if spec is not None:
            return spec
    return None


_FINDER = _Finder()
