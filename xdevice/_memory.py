"""``memory_stats``: bytes in use, peak and limit on a device, as one framework counts them."""

from __future__ import annotations

from xdevice import _registry
from xdevice._discovery import find
from xdevice._errors import ConfigurationError, message
from xdevice._types import MemoryStats

__all__ = ["memory_stats"]


def memory_stats(device: object = "cpu", backend: str | None = None) -> MemoryStats:
    """Memory on ``device`` as framework ``backend`` sees it (None where it cannot tell).

    Each framework has its own allocator, so the numbers are per framework. Without
    ``backend``, the one framework already loaded is used.

    Raises:
        ConfigurationError: ``backend`` is omitted and zero or several frameworks are loaded.
        DeviceNotFound: the framework has no such device.

    >>> memory_stats("cpu", backend="numpy").in_use is None
    True
    """
    if backend is None:
        loaded = [b.name for b in _registry.active_backends() if b.name != "numpy"]
        if len(loaded) != 1:
            raise ConfigurationError(
                message(
                    "Memory is counted per framework; say which one",
                    expected="backend=<name>",
                    received="backend=None",
                    choices=loaded or _registry.backends(),
                    fix=f"memory_stats({str(device)!r}, backend={(loaded or ['torch'])[0]!r})",
                )
            )
        backend = loaded[0]
    return _registry.backend(backend).memory_stats(find(device, backend=backend))
