"""Let ``import xdevice`` work straight from a source checkout, with nothing installed.

``xdevice.backends`` and ``xdevice.converters`` live in the repository's top-level
``backends/`` and ``converters/`` folders (pyproject's ``package-dir``). Installed, they sit
inside the package; with only the repository root on ``sys.path``, a finder maps exactly
those two names to their folders (nothing else of the repository, such as ``tests/``,
becomes part of the package). Nothing happens in an installed copy.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

_package = Path(__file__).resolve().parent
_root = _package.parent
_MAPPED = {f"xdevice.{name}": _root / name for name in ("backends", "converters")}


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds ``xdevice.backends`` and ``xdevice.converters`` in the checkout's folders; their
    submodules then resolve through the packages' own ``__path__``."""

    def find_spec(self, fullname, path=None, target=None):
        folder = _MAPPED.get(fullname)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


if (not (_package / "backends").is_dir() and (_root / "backends" / "__init__.py").is_file()
        and (_root / "pyproject.toml").is_file()
        and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path)
        and importlib.util.find_spec("xdevice.backends") is None):  # an editable install maps it already
    sys.meta_path.append(_CheckoutFinder())
