"""JAX memory: XLA's GPU allocator, configured through environment variables.

JAX reads these when its GPU backend starts: ``XLA_PYTHON_CLIENT_PREALLOCATE`` (pre-allocate
a pool, JAX's default, or grow on demand) and the memory fraction (``XLA_CLIENT_MEM_FRACTION``,
formerly ``XLA_PYTHON_CLIENT_MEM_FRACTION``; both are set). The fraction is one number for
every GPU of the process, so per-device limits must agree. With pre-allocation the limit is a
pool reserved up front; with growth it caps the allocator, which raises out-of-memory past it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from xdevice._device import Device
from xdevice._types import Applied, Config, How, MemoryStats
from xdevice.backends._memory import cpu_only_stats, memory_not_applied

_FRACTION_VARIABLES = ("XLA_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_MEM_FRACTION")


class Memory:
    native_device: Callable[[Device], Any]  # devices.py's, in the assembled backend

    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        if not gpus:
            return memory_not_applied("jax", config, "skipped", "no GPU")
        entries = []
        if config.memory_growth is not None:
            os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false" if config.memory_growth else "true"
            entries.append(
                Applied(
                    "jax",
                    "memory_growth",
                    config.memory_growth,
                    "applied",
                    f"XLA_PYTHON_CLIENT_PREALLOCATE={os.environ['XLA_PYTHON_CLIENT_PREALLOCATE']}",
                )
            )
        fractions = {
            g.index: limit / g.memory_total
            for g, limit in ((g, config.limit_for(g)) for g in gpus)
            if limit is not None and g.memory_total
        }
        if fractions:
            if len({round(f, 4) for f in fractions.values()}) > 1:
                entries.append(
                    Applied(
                        "jax",
                        "memory_limit",
                        config.memory_limit,
                        "unsupported",
                        "JAX has one memory fraction for all GPUs of a process",
                    )
                )
                return entries
            fraction = f"{min(1.0, next(iter(fractions.values()))):.4f}"
            for variable in _FRACTION_VARIABLES:
                os.environ[variable] = fraction
            how: How = "enforced" if config.memory_growth else "pool"
            entries.append(
                Applied("jax", "memory_limit", config.memory_limit, how, f"XLA_CLIENT_MEM_FRACTION={fraction}")
            )
        return entries

    def memory_stats(self, device: Device) -> MemoryStats:
        stats = self.native_device(device).memory_stats()
        if not stats:  # the CPU client keeps no allocator statistics
            return cpu_only_stats("jax", device)
        preallocated = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true").lower() != "false"
        return MemoryStats(
            device,
            "jax",
            in_use=stats.get("bytes_in_use"),
            peak=stats.get("peak_bytes_in_use"),
            limit=stats.get("bytes_limit"),
            limit_how="pool" if preallocated else "enforced",
        )

    def measure_step(self, step, args, device):
        # XLA's own accounting of the compiled step, on any device (the CPU too): nothing runs
        stats = step.lower(*args).compile().memory_analysis()
        if stats is None:
            return None
        parts = {
            "arguments": stats.argument_size_in_bytes,
            "outputs": stats.output_size_in_bytes,
            "temporaries": stats.temp_size_in_bytes,
            "aliased": stats.alias_size_in_bytes,
        }
        parts["total"] = parts["arguments"] + parts["outputs"] + parts["temporaries"] - parts["aliased"]
        return "XLA's memory_analysis() of the compiled step", parts
