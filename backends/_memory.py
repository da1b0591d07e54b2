"""Memory report rows every backend shares: settings that did not apply, and CPU stats."""

from __future__ import annotations

from xdevice._device import Device
from xdevice._types import Applied, Config, How, MemoryStats

__all__ = ["memory_not_applied", "cpu_only_stats"]


def memory_not_applied(backend: str, config: Config, how: How, why: str) -> list[Applied]:
    """One report row per requested memory setting that did not apply, saying why."""
    return [
        Applied(backend, setting, getattr(config, setting), how, why)
        for setting in ("memory_growth", "memory_limit")
        if getattr(config, setting) is not None
    ]


def cpu_only_stats(backend: str, device: Device) -> MemoryStats:
    """CPU memory is the process's, not a framework allocator's: nothing to count."""
    return MemoryStats(device, backend, in_use=None, peak=None, limit=None)
