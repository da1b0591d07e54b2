"""NumPy memory: host memory, owned by the process rather than an allocator to configure."""

from __future__ import annotations

from xdevice._device import Device
from xdevice._types import Applied, Config, MemoryStats
from xdevice.backends._memory import cpu_only_stats, memory_not_applied


class Memory:
    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        return memory_not_applied("numpy", config, "unsupported", "the numpy backend runs on the CPU only")

    def memory_stats(self, device: Device) -> MemoryStats:
        return cpu_only_stats("numpy", device)
