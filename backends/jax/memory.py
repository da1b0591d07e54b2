"""JAX memory: XLA's GPU allocator, configured through environment variables.

JAX reads these when its GPU backend starts (``jaxlib.xla_client.generate_pjrt_gpu_plugin_options``):

- ``XLA_PYTHON_CLIENT_PREALLOCATE``: pre-allocate a pool (JAX's default) or, when ``false``
  (also ``False`` or ``0``, jaxlib's spellings), grow on demand.
- the memory fraction: ``XLA_CLIENT_MEM_FRACTION``, or the deprecated
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` when the first is unset. jaxlib refuses to start its CUDA
  backend with both set (``ValueError``), and JAX then runs on the CPU without saying why.

``configure(memory_limit=...)`` therefore sets exactly one fraction variable:
``XLA_CLIENT_MEM_FRACTION``, or, where the user already set only the deprecated
``XLA_PYTHON_CLIENT_MEM_FRACTION``, that one (the user's name, with the configured value: the
call is the later and explicit request, and older JAX releases read only that name). Where
the user set both, JAX cannot start on the GPU whatever xdevice writes, so ``configure``
refuses with ``ConfigurationError`` and the fix (unset the deprecated one).

The fraction is one number for every GPU of the process, so per-device limits must agree.
With pre-allocation the limit is a pool reserved up front; with growth it caps the allocator,
which raises out-of-memory past it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from xdevice._device import Device
from xdevice._errors import ConfigurationError, message
from xdevice._types import Applied, Config, How, MemoryStats
from xdevice.backends._memory import cpu_only_stats, memory_not_applied

FRACTION = "XLA_CLIENT_MEM_FRACTION"
DEPRECATED_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"


def fraction_variable(environ: Mapping[str, str] = os.environ) -> str:
    """The one memory-fraction variable to write, so that jaxlib reads it and finds no pair.

    >>> fraction_variable({})
    'XLA_CLIENT_MEM_FRACTION'
    >>> fraction_variable({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.5"})  # the user's own name
    'XLA_PYTHON_CLIENT_MEM_FRACTION'
    """
    if environ.get(DEPRECATED_FRACTION):  # jaxlib, too, treats an empty value as unset
        if environ.get(FRACTION):
            raise ConfigurationError(
                message(
                    f"{FRACTION} and {DEPRECATED_FRACTION} are both set, and JAX refuses to start its GPU "
                    "backend with both (it then runs on the CPU)",
                    expected="one of them",
                    received=f"{FRACTION}={environ[FRACTION]}, {DEPRECATED_FRACTION}={environ[DEPRECATED_FRACTION]}",
                    fix=f"unset {DEPRECATED_FRACTION} (deprecated) before the program starts; "
                    f"configure(memory_limit=...) then writes {FRACTION}",
                )
            )
        return DEPRECATED_FRACTION
    return FRACTION


def preallocates(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether JAX pre-allocates its pool, read as jaxlib reads ``XLA_PYTHON_CLIENT_PREALLOCATE``.

    >>> preallocates({}), preallocates({"XLA_PYTHON_CLIENT_PREALLOCATE": "0"})
    (True, False)
    """
    return environ.get(PREALLOCATE, "") not in ("false", "False", "0")


class Memory:
    native_device: Callable[[Device], Any]  # devices.py's, in the assembled backend

    def configure_memory(self, config: Config, gpus: list[Device]) -> list[Applied]:
        if not gpus:
            return memory_not_applied("jax", config, "skipped", "no GPU")
        entries = []
        if config.memory_growth is not None:
            os.environ[PREALLOCATE] = "false" if config.memory_growth else "true"
            entries.append(
                Applied(
                    "jax", "memory_growth", config.memory_growth, "applied", f"{PREALLOCATE}={os.environ[PREALLOCATE]}"
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
            variable = fraction_variable()
            os.environ[variable] = fraction
            how: How = "pool" if preallocates() else "enforced"
            entries.append(Applied("jax", "memory_limit", config.memory_limit, how, f"{variable}={fraction}"))
        return entries

    def memory_stats(self, device: Device) -> MemoryStats:
        stats = self.native_device(device).memory_stats()
        if not stats:  # the CPU client keeps no allocator statistics
            return cpu_only_stats("jax", device)
        return MemoryStats(
            device,
            "jax",
            in_use=stats.get("bytes_in_use"),
            peak=stats.get("peak_bytes_in_use"),
            limit=stats.get("bytes_limit"),
            limit_how="pool" if preallocates() else "enforced",
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
