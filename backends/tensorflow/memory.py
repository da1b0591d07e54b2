"""TensorFlow memory: per-GPU growth, or a logical device with a fixed memory limit.

A limit becomes a logical GPU with ``memory_limit`` (in MiB), which TensorFlow's allocator
enforces. TensorFlow cannot combine that with memory growth (tensorflow#38367): with both
asked, the limit is applied and growth is reported as unsupported.
"""

from __future__ import annotations

import tensorflow as tf

from xdevice._device import Device
from xdevice._types import Applied, Config, MemoryStats
from xdevice.backends._memory import cpu_only_stats, memory_not_applied
from xdevice.backends.tensorflow.devices import _wrapped


class Memory:
    _limits: dict[int, int]

    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        physical = tf.config.list_physical_devices("GPU")
        if not physical:
            why = "no GPU" if not gpus else "this TensorFlow build sees no GPU"
            return memory_not_applied("tensorflow", config, "skipped", why)
        entries = []
        self._limits = getattr(self, "_limits", {})
        limited = False
        for index, gpu in enumerate(physical):
            limit = config.limit_for(Device("gpu", index))
            if limit is None:
                continue
            with _wrapped("memory_limit"):
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit // 2**20)]
                )
            self._limits[index] = limit
            limited = True
            entries.append(
                Applied(
                    "tensorflow",
                    "memory_limit",
                    limit,
                    "enforced",
                    f"logical GPU:{index} with memory_limit={limit // 2**20} MiB",
                )
            )
        if config.memory_growth is not None:
            if limited and config.memory_growth:
                entries.append(
                    Applied(
                        "tensorflow",
                        "memory_growth",
                        True,
                        "unsupported",
                        "TensorFlow cannot combine growth with a memory limit",
                    )
                )
            else:
                with _wrapped("memory_growth"):
                    for gpu in physical:
                        tf.config.experimental.set_memory_growth(gpu, config.memory_growth)
                entries.append(
                    Applied(
                        "tensorflow",
                        "memory_growth",
                        config.memory_growth,
                        "applied",
                        f"set_memory_growth({config.memory_growth})",
                    )
                )
        return entries

    def memory_stats(self, device: Device) -> MemoryStats:
        if device.kind == "cpu":
            return cpu_only_stats("tensorflow", device)
        info = tf.config.experimental.get_memory_info(f"GPU:{device.index}")
        limit = getattr(self, "_limits", {}).get(device.index)
        return MemoryStats(
            device,
            "tensorflow",
            in_use=info["current"],
            peak=info["peak"],
            limit=limit,
            limit_how="enforced" if limit else None,
        )

    def measure_step(self, step, args, device):
        if device.kind != "gpu":  # TensorFlow counts no memory on the CPU
            return None
        name = f"GPU:{device.index}"
        tf.config.experimental.reset_memory_stats(name)
        before = tf.config.experimental.get_memory_info(name)["current"]
        step(*args)
        peak = tf.config.experimental.get_memory_info(name)["peak"]
        return "TensorFlow's peak on the GPU over one step", {
            "before the step": before,
            "step": peak - before,
            "total": peak,
        }
