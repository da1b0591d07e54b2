"""The backend packages (``xdevice.backends.<name>``); calling this package lists them.

``xdevice.backends`` is both this package and the function that lists installed backends:
importing a subpackage such as ``xdevice.backends.torch`` makes Python set the attribute
``xdevice.backends`` to this package, which would shadow a plain function of that name.
Making the package callable keeps ``xdevice.backends()`` working in every import order.

Importing this package imports no framework.
"""

from __future__ import annotations

import sys
import types


class _CallablePackage(types.ModuleType):
    def __call__(self, *, all: bool = False) -> list[str]:
        from xdevice._registry import backends

        return backends(all=all)


sys.modules[__name__].__class__ = _CallablePackage
