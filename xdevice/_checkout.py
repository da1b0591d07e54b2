"""Let ``import xdevice`` work straight from a source checkout, with nothing installed.

``xdevice.backends`` and ``xdevice.converters`` live in the repository's top-level
``backends/`` and ``converters/`` folders (pyproject's ``package-dir``). Installed, they sit
inside the package; with only the repository root on ``sys.path``, the package also looks
in that root for them. Nothing happens in an installed copy.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_package = Path(__file__).resolve().parent
_root = _package.parent
if (not (_package / "backends").is_dir() and (_root / "backends" / "__init__.py").is_file()
        and (_root / "pyproject.toml").is_file() and str(_root) not in sys.modules["xdevice"].__path__
        and importlib.util.find_spec("xdevice.backends") is None):  # an editable install maps it already
    sys.modules["xdevice"].__path__.append(str(_root))
